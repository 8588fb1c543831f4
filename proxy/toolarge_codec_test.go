package proxy

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"testing"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// keyLimits is an itemLimits of fixed figures by key (0: not known).
type keyLimits map[string]int64

func (l keyLimits) ItemSizeMaxFor(key []byte) int64 { return l[string(key)] }

// With servers of different item size limits, both codecs hold a write to
// the limit of its key's server (issue 28, rule 4): a write over the
// least limit is refused only when its own server's is smaller too, and
// never when its server's limit is not known. The binary codec reads up
// to the key of such a write to tell (peekLen, requestLen), then the whole
// frame when it goes to memcached; a base64 meta key is looked up
// decoded, as the pool routes it.
func TestCodecsTooLargeForTheKeysServer(t *testing.T) {
	t.Parallel()
	cx := codecCtx{maxBody: 1 << 20, prefix: 8, itemMax: 64, items: keyLimits{"small": 64, "big": 4096}}
	extras := []byte{0, 0, 0, 7, 0, 0, 0, 60}
	var bc codec = binaryCodec{}
	for key, refused := range map[string]bool{"small": true, "big": false, "unknown": false} {
		in := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpSet, Opaque: 5}, nil, extras, []byte(key), bytes.Repeat([]byte{'v'}, 100))
		head := mc.HeaderLen + len(extras) + len(key)
		if got := bc.peekLen(in[:mc.HeaderLen], cx); got != head {
			t.Errorf("binary %s: peekLen after the header %d, want %d (up to the key)", key, got, head)
		}
		if got := bc.requestLen(in[:mc.HeaderLen], cx); got != head {
			t.Errorf("binary %s: requestLen of the header %d, want %d (the key tells)", key, got, head)
		}
		want := len(in)
		if refused {
			want = head
		}
		if got := bc.requestLen(in[:head], cx); got != want {
			t.Errorf("binary %s: requestLen up to the key %d, want %d", key, got, want)
		}
		var r request
		n, err := bc.decode(in, cx, &r)
		if err != nil || n != want || r.tooLarge != refused || string(r.key) != key || refused && r.swallow != 100 {
			t.Errorf("binary %s: n %d err %v tooLarge %v key %q swallow %d; want n %d, refused %v",
				key, n, err, r.tooLarge, r.key, r.swallow, want, refused)
		}
	}
	v := bytes.Repeat([]byte{'v'}, 100)
	for _, tc := range []struct {
		line, key string
		refused   bool
	}{
		{"set small 0 0 100", "small", true},
		{"set big 0 0 100", "big", false},
		{"append unknown 0 0 100", "unknown", false},
		{"ms " + base64.StdEncoding.EncodeToString([]byte("small")) + " 100 b", "small", true},
		{"ms " + base64.StdEncoding.EncodeToString([]byte("big")) + " 100 b", "big", false},
	} {
		in := fmt.Appendf(nil, "%s\r\n%s\r\n", tc.line, v)
		c := &textCodec{}
		var r request
		n, err := c.decode(in, cx, &r)
		want := len(in)
		if tc.refused {
			want = len(tc.line) + 2
		}
		if err != nil || n != want || r.tooLarge != tc.refused || tc.refused && string(r.key) != tc.key {
			t.Errorf("%q: n %d err %v tooLarge %v key %q; want n %d, refused %v", tc.line, n, err, r.tooLarge, r.key, want, tc.refused)
		}
	}
}
