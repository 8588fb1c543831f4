package text

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// testMaxValue is the value bound the differential tests parse with. It is
// memcached's default item size (-I 1m): values well over it are refused by
// both, values well under it by neither.
const testMaxValue = 1 << 20

// mcCases are inputs, mostly malformed, whose replies from a real memcached
// must be what Parse says memcached replies. Every case runs on a fresh
// connection after flush_all.
var mcCases = []struct{ name, in string }{
	// Unknown commands and bad lines.
	{"unknown", "bogus\r\n"},
	{"empty line", "\r\n"},
	{"bare newline", "\n"},
	{"spaces only", "   \r\n"},
	{"one byte", "x\r\n"},
	{"capital get", "Get k\r\n"},
	{"s-branch HTTP stays open", "sET / HTTP/1.1\r\n"},
	{"HTTP request closes", "GET / HTTP/1.1\r\n"},
	{"m-long HTTP closes", "mget k HTTP/1.0\r\n"},
	{"long line without newline closes", strings.Repeat("x", 3000)},
	{"unknown meta", "mx k\r\n"},
	// get family.
	{"get without key", "get\r\n"},
	{"gets without key", "gets\r\n"},
	{"gx", "gx k\r\n"},
	{"get key too long", "get " + strings.Repeat("a", 251) + "\r\n"},
	{"get second key too long", "get a " + strings.Repeat("b", 251) + " c\r\n"},
	{"get 250 byte key", "get " + strings.Repeat("a", 250) + "\r\n"},
	{"gat bad exptime", "gat abc k\r\n"},
	{"gat without key", "gat 10\r\n"},
	{"gats exptime only", "gats 10\r\n"},
	{"get many keys", "get" + strings.Repeat(" k", 60) + " " + strings.Repeat("z", 251) + "\r\n"},
	{"get long line", "get" + strings.Repeat(" abcdefgh", 300) + "\r\n"},
	{"get NUL cuts line", "get k\x00 " + strings.Repeat("z", 300) + "\r\n"},
	{"get CR in key", "get k\r\r\n"},
	// storage.
	{"set too few tokens", "set k 0 0\r\n"},
	{"set too many tokens", "set k 0 0 1 noreply x\r\nx\r\n"},
	{"set bad length", "set k 0 0 abc\r\nhello\r\n"},
	{"set bad flags", "set k abc 0 5\r\nhello\r\n"},
	{"set negative flags", "set k -1 0 5\r\nhello\r\n"},
	{"set negative length", "set k 0 0 -1\r\n"},
	{"set bad exptime", "set k 0 1x 1\r\nx\r\n"},
	{"set key too long", "set " + strings.Repeat("k", 251) + " 0 0 1\r\nx\r\n"},
	{"set key too long noreply", "set " + strings.Repeat("k", 251) + " 0 0 1 noreply\r\nx\r\n"},
	{"set bad data chunk", "set k 0 0 5\r\nhelloXX\r\n"},
	{"set bad data chunk noreply", "set k 0 0 5 noreply\r\nhelloXX\r\n"},
	{"set short data", "set k 0 0 5\r\nhi\r\n\r\n\r\n"},
	{"set bad length noreply", "set k 0 0 abc noreply\r\n"},
	{"set noreply as length", "set k 0 0 noreply\r\n"},
	{"set too large", "set k 0 0 2000000\r\n" + strings.Repeat("v", 2000000) + "\r\n"},
	{"set too large noreply", "set k 0 0 2000000 noreply\r\n" + strings.Repeat("v", 2000000) + "\r\n"},
	{"set length wraps to 1", "set k 0 0 4294967297\r\nx\r\n"},
	{"set flags wrap", "set k 4294967296 0 1\r\nx\r\n"},
	{"set junk instead of noreply", "set k 0 0 1 junk\r\nx\r\n"},
	{"set bare newline", "set k 0 0 1\nx\r\n"},
	{"set long line", "set k 0 0 1" + strings.Repeat(" ", 3000) + "\r\nx\r\n"},
	{"add bad length", "add k 0 0 z\r\n"},
	{"replace too few", "replace k 0\r\n"},
	{"prepend bad flags", "prepend k 0x1 0 1\r\nx\r\n"},
	{"cas without unique", "cas k 0 0 1\r\nx\r\n"},
	{"cas bad unique", "cas k 0 0 1 abc\r\nx\r\n"},
	{"cas negative unique", "cas k 0 0 1 -1\r\nx\r\n"},
	// incr, decr, touch, delete.
	{"incr bad delta", "incr k abc\r\n"},
	{"incr negative delta", "incr k -1\r\n"},
	{"incr delta overflow", "incr k 18446744073709551616\r\n"},
	{"incr bad delta noreply", "incr k abc noreply\r\n"},
	{"incr too few", "incr k\r\n"},
	{"decr too many", "decr k 1 2 3\r\n"},
	{"incr key too long", "incr " + strings.Repeat("k", 251) + " 1\r\n"},
	{"touch bad exptime", "touch k abc\r\n"},
	{"touch junk ignored", "touch k 10 junk\r\n"},
	{"touch too few", "touch k\r\n"},
	{"delete with time", "delete k 5\r\n"},
	{"delete legacy zero", "delete k 0\r\n"},
	{"delete legacy zero noreply", "delete k 0 noreply\r\n"},
	{"delete noreply", "delete k noreply\r\n"},
	{"delete with time noreply", "delete k 1 noreply\r\n"},
	{"delete too many", "delete k 0 noreply x\r\n"},
	{"delete without key", "delete\r\n"},
	{"delete key too long", "delete " + strings.Repeat("k", 251) + "\r\n"},
	// flush_all, verbosity, misc.
	{"flush_all bad delay", "flush_all abc\r\n"},
	{"flush_all bad delay noreply", "flush_all abc noreply\r\n"},
	{"flush_all delay junk", "flush_all 0 junk\r\n"},
	{"flush_all too many", "flush_all 1 2 3\r\n"},
	{"verbosity without level", "verbosity\r\n"},
	{"verbosity bad level", "verbosity abc\r\n"},
	{"verbosity noreply only", "verbosity noreply\r\n"},
	{"quit with junk", "quit now\r\n"},
	{"mn with junk", "mn x y\r\n"},
	// meta.
	{"mg without key", "mg\r\n"},
	{"mg key too long", "mg " + strings.Repeat("k", 251) + " v\r\n"},
	{"mg invalid flag", "mg k zz\r\n"},
	{"mg duplicate flag", "mg k v vv\r\n"},
	{"mg high byte flag", "mg k \xffx\r\n"},
	{"mg bad T", "mg k Tabc\r\n"},
	{"mg bad N", "mg k N\r\n"},
	{"mg bad T then invalid", "mg k Tabc zz\r\n"},
	{"mg opaque too long", "mg k O" + strings.Repeat("1", 32) + "\r\n"},
	{"mg opaque at limit", "mg k O" + strings.Repeat("1", 31) + " k\r\n"},
	{"mg too many flags", "mg k v t c f s k O1 q h l u T1 R1 P L I x y z\r\n"},
	{"mg bad base64", "mg a=== b\r\n"},
	{"mg short base64", "mg k b\r\n"},
	{"mg base64 miss", "mg Zm9v b k v O9\r\n"},
	{"mg bad F", "mg k Fx\r\n"},
	{"mg bad F then bad T", "mg k Fx Ty\r\n"},
	{"mg miss quiet", "mg k v q\r\n"},
	{"ms without length", "ms k\r\n"},
	{"ms without key", "ms\r\n"},
	{"ms bad length", "ms k abc\r\nhello\r\n"},
	{"ms negative length", "ms k -5\r\n"},
	{"ms key too long", "ms " + strings.Repeat("k", 251) + " 5\r\nhello\r\n"},
	{"ms invalid mode", "ms k 5 MX\r\nhello\r\n"},
	{"ms long M", "ms k 5 MSS\r\nhello\r\n"},
	{"ms invalid flag", "ms k 5 zz\r\nhello\r\n"},
	{"ms bad C", "ms k 5 Cx\r\nhello\r\n"},
	{"ms opaque too long", "ms k 5 O" + strings.Repeat("9", 40) + "\r\nhello\r\n"},
	{"ms mode beats opaque", "ms k 5 O" + strings.Repeat("9", 40) + " MX\r\nhello\r\n"},
	{"ms bad data chunk", "ms k 5\r\nhelloXX\r\n"},
	{"ms bad data chunk quiet", "ms k 5 q\r\nhelloXX\r\n"},
	{"ms too large", "ms k 2000000 T0\r\n" + strings.Repeat("v", 2000000) + "\r\n"},
	{"ms too many flags", "ms k 1 a b c d e f g h i j k l m n o p q r\r\nx\r\n"},
	{"ms quiet stored", "ms k 1 q\r\nx\r\nms k2 2 O5 k\r\nxy\r\n"},
	{"ms bad base64", "ms a=== 5 b\r\nhello\r\n"},
	{"ms bad F", "ms k 5 T1 F-1\r\nhello\r\n"},
	{"ms bad F then bad T", "ms k 5 F-1 Tx\r\nhello\r\n"},
	{"ms base64 stored", "ms Zm9v 3 b k O1\r\nbar\r\n"},
	{"mg hit opaque too long", "set k 0 0 1\r\nx\r\nmg k T10 O" + strings.Repeat("1", 40) + "\r\n"},
	{"ma quiet opaque too long", "ma k q O" + strings.Repeat("1", 40) + "\r\n"},
	{"md invalid flag", "md k zz\r\n"},
	{"md bad base64", "md a=== b\r\n"},
	{"md opaque too long", "md k O" + strings.Repeat("1", 33) + "\r\n"},
	{"md too many flags", "md k a b c d e f g h i j k l m n o p q r\r\n"},
	{"md miss", "md k O1 k\r\n"},
	{"ma invalid mode", "ma k MX\r\n"},
	{"ma bad delta", "ma k Dabc\r\n"},
	{"ma bad initial", "ma k J-1\r\n"},
	{"ma miss", "ma k O7\r\n"},
	{"me without key", "me\r\n"},
	{"me bad base64", "me a=== b\r\n"},
	{"me miss", "me k\r\n"},
}

func TestErrorsMatchMemcached(t *testing.T) {
	srv := testmc.Start(t)
	for _, tc := range mcCases {
		t.Run(tc.name, func(t *testing.T) {
			want, closes := modelReplies(t, []byte(tc.in))
			in := tc.in
			if !closes {
				in += "mn\r\n"
				want = append(want, MetaNoop...)
			}
			got, closed := exchange(t, srv.Addr, in, len(want), closes)
			if !bytes.Equal(got, want) {
				t.Errorf("input %.80q\nmemcached: %.200q\nParse:     %.200q", tc.in, got, want)
			}
			if closed != closes {
				t.Errorf("input %.80q: memcached closed %v, Parse says %v", tc.in, closed, closes)
			}
		})
	}
}

// exchange sends in on a new connection (after flush_all) and reads the
// reply: until EOF when the connection is to close, else n bytes. It
// reports whether memcached closed the connection.
func exchange(t *testing.T, addr, in string, n int, toClose bool) ([]byte, bool) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("flush_all\r\n")); err != nil {
		t.Fatal(err)
	}
	ok := make([]byte, len(OK))
	if _, err := io.ReadFull(conn, ok); err != nil || string(ok) != OK {
		t.Fatalf("flush_all: %q %v", ok, err)
	}
	go func() { _, _ = conn.Write([]byte(in)) }()
	if toClose {
		got, err := io.ReadAll(conn)
		return got, err == nil
	}
	// The reply to the sentinel mn is the last, so a reply memcached sends
	// beyond the model's shows as a mismatch within n bytes.
	got := make([]byte, n)
	m, err := io.ReadFull(conn, got)
	if err != nil {
		return got[:m], errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
	}
	return got, false
}

// modelReplies runs Parse over in as a proxy's codec would and returns the
// replies memcached gives for it, according to Parse's errors and, for the
// few commands the cases use successfully, to what memcached answers on an
// empty cache. It reports whether memcached closes the connection.
func modelReplies(t *testing.T, in []byte) ([]byte, bool) {
	t.Helper()
	var c Command
	var out []byte
	for len(in) > 0 {
		n, err := Parse(in, testMaxValue, &c)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse error %v is no *Error", err)
			}
			out = e.AppendReply(out)
			if e.Close {
				return out, true
			}
			if n+e.Swallow > len(in) {
				t.Fatalf("input ends while memcached swallows %d bytes", e.Swallow)
			}
			in = in[n+e.Swallow:]
			continue
		}
		if n == 0 {
			t.Fatalf("input ends inside a command: %.80q", in)
		}
		in = in[n:]
		if c.Kind == KindQuit {
			return out, true
		}
		out = modelSuccess(t, &c, out)
	}
	return out, false
}

// modelSuccess appends memcached's reply to c on an empty cache (stores
// succeed).
func modelSuccess(t *testing.T, c *Command, out []byte) []byte {
	t.Helper()
	metaFlags := func(code string) []byte {
		if c.NoReply && (code == MetaHD || code == MetaEN) {
			return out
		}
		var fl []MetaFlag
		for _, f := range c.Meta {
			switch f.Flag {
			case 'O':
				fl = append(fl, f)
			case 'k':
				key := c.Key
				if c.Base64 {
					key, _ = DecodeBase64(nil, c.Key)
					key = AppendBase64(nil, key)
					fl = append(fl, MetaFlag{Flag: 'k', Token: key})
					fl = append(fl, MetaFlag{Flag: 'b'})
					continue
				}
				fl = append(fl, MetaFlag{Flag: 'k', Token: key})
			}
		}
		return AppendMeta(out, code, fl)
	}
	switch c.Kind {
	case KindGet, KindGets, KindGat, KindGats:
		return append(out, End...)
	case KindSet, KindAdd:
		if c.NoReply {
			return out
		}
		return append(out, Stored...)
	case KindDelete, KindTouch, KindIncr, KindDecr:
		if c.NoReply {
			return out
		}
		return append(out, NotFound...)
	case KindFlushAll, KindVerbosity:
		if c.NoReply {
			return out
		}
		return append(out, OK...)
	case KindMetaNoop:
		return append(out, MetaNoop...)
	case KindMetaGet:
		return metaFlags(MetaEN)
	case KindMetaSet:
		return metaFlags(MetaHD)
	case KindMetaDelete, KindMetaArithmetic:
		return metaFlags(MetaNF)
	case KindMetaDebug:
		return append(out, "EN\r\n"...)
	}
	t.Fatalf("no model for %v", c.Kind)
	return out
}

// TestRepliesMatchMemcached checks the encoders and ParseMetaResponse
// against memcached's own replies: classic replies built with the encoders
// equal memcached's bytes, and every meta reply, parsed and re-encoded,
// comes out byte for byte as memcached sent it.
func TestRepliesMatchMemcached(t *testing.T) {
	srv := testmc.Start(t)
	conn, err := net.DialTimeout("tcp", srv.Addr, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	send := func(s string) {
		t.Helper()
		if _, err := conn.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(want []byte) {
		t.Helper()
		got := make([]byte, len(want))
		if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("memcached %q (%v), want %q", got, err, want)
		}
	}
	var pending []byte
	var r MetaResponse
	meta := func() []byte { // reads one meta reply, returns its bytes
		t.Helper()
		for {
			n, err := ParseMetaResponse(pending, &r)
			if err != nil {
				t.Fatalf("%q: %v", pending, err)
			}
			if n > 0 {
				raw := pending[:n:n]
				pending = pending[n:]
				return raw
			}
			var b [4096]byte
			k, err := conn.Read(b[:])
			if err != nil {
				t.Fatalf("read: %v (have %q)", err, pending)
			}
			pending = append(pending, b[:k]...)
		}
	}

	send("set a 5 0 3\r\nabc\r\nset b 4294967295 0 0\r\n\r\n")
	expect([]byte(Stored + Stored))
	send("mg a c\r\n")
	meta()
	tok, ok := r.Flag('c')
	cas, ok2 := parseUint64(tok)
	if !ok || !ok2 {
		t.Fatalf("mg a c: %q", r.Line)
	}
	send("get a b missing\r\ngets a\r\n")
	want := AppendValue(nil, []byte("a"), 5, []byte("abc"))
	want = AppendValue(want, []byte("b"), 4294967295, nil)
	want = append(want, End...)
	want = AppendValueCAS(want, []byte("a"), 5, []byte("abc"), cas)
	expect(append(want, End...))
	send("set n 0 0 2\r\n10\r\nincr n 5\r\n")
	expect(AppendNumber([]byte(Stored), 15))

	metaCmds := []struct{ cmd, code string }{
		{"mg a v f s k O123 c t\r\n", MetaVA},
		{"mg a k q O5 s\r\n", MetaHD},
		{"mg missing k O1\r\n", MetaEN},
		{"ms Zm9v 3 b k O5 c\r\nbar\r\n", MetaHD},
		{"mg Zm9v b k v f\r\n", MetaVA},
		{"mg Zm9v b k v q\r\n", MetaVA},
		{"md missing O1 k\r\n", MetaNF},
		{"ms a 1 ME\r\nx\r\n", MetaNS},
		{"ms a 1 C99999 k\r\nx\r\n", MetaEX},
		{"ma n v O3 t\r\n", MetaVA},
		{"ma nope O3\r\n", MetaNF},
		{"mn\r\n", MetaMN},
		{"mg k Tx\r\n", "CLIENT_ERROR"},
	}
	for _, mc := range metaCmds {
		send(mc.cmd)
		raw := meta()
		if string(r.Code) != mc.code {
			t.Errorf("%q: reply %q, want code %s", mc.cmd, raw, mc.code)
			continue
		}
		var re []byte
		switch {
		case string(r.Code) == MetaVA:
			re = AppendMetaValue(nil, r.Flags, r.Value)
		case IsMetaCode(r.Code) || string(r.Code) == MetaMN:
			re = AppendMeta(nil, string(r.Code), r.Flags)
		default:
			re = append(append(re, r.Line...), "\r\n"...)
		}
		if !bytes.Equal(re, raw) {
			t.Errorf("%q: memcached %q, re-encoded %q", mc.cmd, raw, re)
		}
		if tok, ok := r.Flag('k'); ok {
			if _, b64 := r.Flag('b'); b64 {
				if key, ok := DecodeBase64(nil, tok); !ok || string(key) != "foo" {
					t.Errorf("%q: base64 key %q decodes to %q", mc.cmd, tok, key)
				}
			}
		}
	}
}
