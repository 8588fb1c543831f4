package proxy

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// fuzzPrefix is the namespace of the bucket the codec fuzz targets use; a
// long one, as after many FLUSHes.
const fuzzPrefix = "tenant#123456:"

// FuzzTextCodec feeds arbitrary client input to the text codec as a
// session does (decode, refusals skipped or closing, retrieval commands
// part by part) and checks what it would send upstream: a classic command
// is a valid binary request, whose key, for a data command, fits memcached
// with the namespace;
// a meta command's upstream line, parsed again as memcached would, is the
// same command with the key in the namespace (inside the base64 with b)
// and the same flags. The seed corpus (testdata/fuzz/FuzzTextCodec) holds
// every command of proto/text's corpus and meta commands with each flag.
func FuzzTextCodec(f *testing.F) {
	for _, s := range []string{
		"mg foo v k c t f s O123 q\r\n", "ms Zm9v 3 b T0 F5 c k I\r\nbar\r\n", "md foo q C5 I T30\r\n",
		"ma n N0 J13 D2 MD v t c q\r\n", "me foo\r\n", "me Zm9v b\r\n", "mn\r\n", "get a b c\r\ngets a\r\n",
		// Writes too large for items of fuzzItemMax bytes.
		"set k 0 0 90\r\n" + strings.Repeat("v", 90) + "\r\nmn\r\n", "cas k 1 2 80 0 noreply\r\n" + strings.Repeat("v", 20),
		"ms Zm9v 70 b q MA T0\r\n" + strings.Repeat("v", 70) + "\r\nmg foo v\r\n", "append k 0 0 75\r\nab",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		fuzzTextDecode(t, in, 0)
		fuzzTextDecode(t, in, fuzzItemMax)
	})
}

// fuzzItemMax is the item size limit of FuzzTextCodec's second pass.
const fuzzItemMax = 64

// fuzzTextDecode is one pass of FuzzTextCodec over in, with memcached's
// item size limit itemMax (0: unknown). A write refused as too large must
// be a storage command's whose key and data are over the limit, and be
// unlinked only for set and ms.
func fuzzTextDecode(t *testing.T, in []byte, itemMax int) {
	c := &textCodec{}
	cx := codecCtx{maxBody: 1 << 20, prefix: len(fuzzPrefix), itemMax: itemMax}
	prefix := []byte(fuzzPrefix)
	buf := in
	for steps := 0; len(buf) > 0 && steps < 10000; steps++ {
		var r request
		n, err := c.decode(buf, cx, &r)
		if n < 0 || n > len(buf) {
			t.Fatalf("decode consumed %d of %d bytes", n, len(buf))
		}
		if err != nil {
			var re *codecReply
			if !errors.As(err, &re) {
				t.Fatalf("decode error %v is not a refusal", err)
			}
			if re.close || re.skip > len(buf) {
				return
			}
			if re.skip <= 0 {
				t.Fatalf("a refusal that neither closes nor skips: %+v", re)
			}
			buf = buf[re.skip:]
			continue
		}
		if n == 0 && !r.more {
			return // waits for more input
		}
		if r.tooLarge {
			checkTooLarge(t, c, &r, itemMax)
			if n+r.swallow > len(buf) {
				return
			}
			buf = buf[n+r.swallow:]
			continue
		}
		if r.meta {
			checkMetaUpstream(t, c, &r, prefix)
		} else if err := binary.ValidateRequest(&r.frame); err != nil {
			t.Fatalf("%q: invalid binary request: %v", buf[:max(n, 1)], err)
		} else if r.op.Class().Metered() && len(prefix)+len(r.key) > binary.MaxKeyLen {
			t.Fatalf("key of %d bytes passed the length check", len(r.key))
		}
		if r.more || r.last {
			c.partDone(r.last)
		}
		buf = buf[n:]
	}
}

// checkTooLarge checks a write the text codec refused as too large for
// items of itemMax bytes.
func checkTooLarge(t *testing.T, c *textCodec, r *request, itemMax int) {
	t.Helper()
	k := c.cmd.Kind
	switch {
	case itemMax == 0 || !k.IsStorage():
		t.Fatalf("%q refused as too large with items of %d bytes", c.cmd.Line, itemMax)
	case r.swallow != c.cmd.DataLen+2 || len(fuzzPrefix)+len(r.key)+c.cmd.DataLen <= itemMax:
		t.Fatalf("%q refused as too large: key %q, %d bytes to drop, items of %d bytes", c.cmd.Line, r.key, r.swallow, itemMax)
	case len(fuzzPrefix)+len(r.key) > binary.MaxKeyLen:
		t.Fatalf("%q refused as too large with a key of %d bytes in the namespace", c.cmd.Line, len(r.key))
	case r.unlink != (k == text.KindSet || k == text.KindMetaSet):
		t.Fatalf("%q refused as too large: unlink %v", c.cmd.Line, r.unlink)
	}
}

// checkMetaUpstream checks the upstream line of meta request r against the
// client's command, c.cmd.
func checkMetaUpstream(t *testing.T, c *textCodec, r *request, prefix []byte) {
	t.Helper()
	client := c.cmd
	if c.meta.tooLong(len(prefix)) {
		return // forward refuses it
	}
	up := append(append([]byte(nil), c.upstreamLine(prefix)...), c.meta.data...)
	var got text.Command
	n, err := text.Parse(up, 1<<20, &got)
	if err != nil || n != len(up) {
		t.Fatalf("upstream %q does not parse as one command: n %d of %d, %v (client %q)", up, n, len(up), err, client.Line)
	}
	if got.Kind != client.Kind || got.Base64 != client.Base64 || len(got.Meta) != len(client.Meta) {
		t.Fatalf("upstream %q is not the client's %q", got.Line, client.Line)
	}
	for i := range got.Meta {
		if got.Meta[i].Flag != client.Meta[i].Flag || !bytes.Equal(got.Meta[i].Token, client.Meta[i].Token) {
			t.Fatalf("flag %d: upstream %q, client %q", i, got.Line, client.Line)
		}
	}
	key := got.Key
	if got.Base64 {
		key, _ = text.DecodeBase64(nil, got.Key)
	}
	if want := append(append([]byte(nil), prefix...), r.key...); !bytes.Equal(key, want) {
		t.Fatalf("upstream key %q, want %q", key, want)
	}
	if !bytes.Equal(got.Value, client.Value) {
		t.Fatalf("upstream data %q, client's %q", got.Value, client.Value)
	}
}

// FuzzMetaReply feeds arbitrary replies of memcached to a meta command,
// framed by text.ParseMetaReply with an expected raw key length, to
// appendMetaReply: it must not fail, must end the reply line where
// memcached's ended, and must give back a raw echoed key of the namespace
// without it.
func FuzzMetaReply(f *testing.F) {
	for _, s := range []string{
		"VA 5 f0 s5 k" + fuzzPrefix + "foo\r\nhello\r\n", "HD O1 k" + fuzzPrefix + "x c5\r\n", "EN\r\n", "NF O5\r\n",
		"NS\r\n", "EX c5\r\n", "MN\r\n", "ME " + fuzzPrefix + "foo exp=-1 la=1 cas=2 fetch=no cls=1 size=63\r\n",
		"CLIENT_ERROR bad command line format\r\n", "HD kdGVuYW50IzEyMzQ1Njpmb28= b\r\n",
		"VA 2 kdGVuYW50IzEyMzQ1Njpmb28= b t-1\r\nab\r\n", "HD k" + fuzzPrefix + "a\r\nb c\r\n",
	} {
		f.Add([]byte(s), uint8(len(fuzzPrefix)+3))
	}
	f.Fuzz(func(t *testing.T, in []byte, rawKey uint8) {
		var r text.MetaResponse
		n, err := text.ParseMetaReply(in, int(rawKey), &r)
		if err != nil || n == 0 {
			return
		}
		out := appendMetaReply(nil, &r, len(fuzzPrefix), int(rawKey))
		lineEnd := len(out)
		if string(r.Code) == text.MetaVA {
			lineEnd -= len(r.Value) + 2
		}
		if lineEnd < 2 || string(out[lineEnd-2:lineEnd]) != "\r\n" {
			t.Fatalf("reply %q for %q does not end its line where memcached's did", out, in[:n])
		}
		if r.KeyStart < 0 || string(r.Code) == "ME" {
			return
		}
		k := r.Line[r.KeyStart:r.KeyEnd]
		if _, isB := r.Flag('b'); isB || !bytes.HasPrefix(k, []byte(fuzzPrefix)) {
			return
		}
		if !bytes.Contains(out, append([]byte(" k"), k[len(fuzzPrefix):]...)) {
			t.Fatalf("reply %q does not give back the key %q without the namespace", out, k)
		}
	})
}
