package text

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// keys renders keys for comparison.
func keys(ks [][]byte) string {
	s := make([]string, len(ks))
	for i, k := range ks {
		s[i] = string(k)
	}
	return strings.Join(s, ",")
}

func metaString(fl []MetaFlag) string {
	var b strings.Builder
	for i, f := range fl {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte(f.Flag)
		b.Write(f.Token)
	}
	return b.String()
}

// summary renders the fields of c that a command sets.
func summary(c *Command) string {
	return fmt.Sprintf("%v key=%q keys=%s flags=%d exp=%d delay=%v delta=%d cas=%d level=%d value=%q noreply=%v meta=%s b64=%v args=%s",
		c.Kind, c.Key, keys(c.Keys), c.Flags, c.Exptime, c.HasDelay, c.Delta, c.CAS, c.Level, c.Value, c.NoReply,
		metaString(c.Meta), c.Base64, keys(c.Args))
}

func TestParseCommands(t *testing.T) {
	many := strings.Repeat(" k", 30)
	tests := []struct{ in, want string }{
		{"get a\r\n", `get key="a" keys=a flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"gets a  b\tc\r\n", `gets key="a" keys=a,b	c flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"gat -1 a b\n", `gat key="a" keys=a,b flags=0 exp=-1 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"gats 10\r\n", `gats key="" keys= flags=0 exp=10 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"get" + many + "\r\n", `get key="k" keys=` + strings.TrimSuffix(strings.Repeat("k,", 30), ",") + ` flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"set k 5 100 3\r\nabc\r\n", `set key="k" keys= flags=5 exp=100 delay=false delta=0 cas=0 level=0 value="abc" noreply=false meta= b64=false args=`},
		{"set k 4294967297 4294967296 0 noreply\r\n\r\n", `set key="k" keys= flags=1 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=true meta= b64=false args=`},
		{"add k 0 0 1 junk\r\nx\r\n", `add key="k" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="x" noreply=false meta= b64=false args=`},
		{"cas k 1 2 2 99 noreply\r\nab\r\n", `cas key="k" keys= flags=1 exp=2 delay=false delta=0 cas=99 level=0 value="ab" noreply=true meta= b64=false args=`},
		{"append k 0 0 2\r\n\r\n\r\n", `append key="k" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="\r\n" noreply=false meta= b64=false args=`},
		{"incr k 18446744073709551615\r\n", `incr key="k" keys= flags=0 exp=0 delay=false delta=18446744073709551615 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"decr k +7 noreply\r\n", `decr key="k" keys= flags=0 exp=0 delay=false delta=7 cas=0 level=0 value="" noreply=true meta= b64=false args=`},
		{"delete k 0\r\n", `delete key="k" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"delete k 0 noreply\r\n", `delete key="k" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=true meta= b64=false args=`},
		{"delete noreply\r\n", `delete key="noreply" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"touch k 30 noreply\r\n", `touch key="k" keys= flags=0 exp=30 delay=false delta=0 cas=0 level=0 value="" noreply=true meta= b64=false args=`},
		{"flush_all\r\n", `flush_all key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"flush_all 10 noreply\r\n", `flush_all key="" keys= flags=0 exp=10 delay=true delta=0 cas=0 level=0 value="" noreply=true meta= b64=false args=`},
		{"verbosity 1\r\n", `verbosity key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=1 value="" noreply=false meta= b64=false args=`},
		{"version\r\n", `version key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"quit\r\n", `quit key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"stats items\r\n", `stats key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=items`},
		{"slabs automove 1\r\n", `admin key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=slabs,automove,1`},
		{"slabs automove 1 noreply\r\n", `admin key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=true meta= b64=false args=slabs,automove,1,noreply`},
		{"slabs reassign 1 2 noreply\r\n", `admin key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=slabs,reassign,1,2,noreply`},
		{"cache_memlimit 100 noreply\r\n", `admin key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=true meta= b64=false args=cache_memlimit,100,noreply`},
		{"lru mode flat noreply\r\n", `admin key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=true meta= b64=false args=lru,mode,flat,noreply`},
		{"watch noreply\r\n", `admin key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=true meta= b64=false args=watch,noreply`},
		{"lru_crawler sleep 1 noreply\r\n", `admin key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=lru_crawler,sleep,1,noreply`},
		{"mg foo v f s k O123 T30 q\r\n", `mg key="foo" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=true meta=v,f,s,k,O123,T30,q b64=false args=`},
		{"mg Zm9v b k\r\n", `mg key="Zm9v" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta=b,k b64=true args=`},
		{"ms foo 3 T30 F5 MA I\r\nbar\r\n", `ms key="foo" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="bar" noreply=false meta=T30,F5,MA,I b64=false args=`},
		{"md foo q C12\r\n", `md key="foo" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=true meta=q,C12 b64=false args=`},
		{"ma foo N30 J5 D2 MD v\r\n", `ma key="foo" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta=N30,J5,D2,MD,v b64=false args=`},
		{"mn\r\n", `mn key="" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta= b64=false args=`},
		{"me Zm9v b\r\n", `me key="Zm9v" keys= flags=0 exp=0 delay=false delta=0 cas=0 level=0 value="" noreply=false meta=b b64=true args=`},
	}
	var c Command
	for _, tc := range tests {
		n, err := Parse([]byte(tc.in), 1024, &c)
		if err != nil || n != len(tc.in) {
			t.Errorf("%q: n %d err %v", tc.in, n, err)
			continue
		}
		if got := summary(&c); got != tc.want {
			t.Errorf("%q:\n got %s\nwant %s", tc.in, got, tc.want)
		}
	}
}

// parseErr parses in and returns its *Error, failing the test if there is
// none.
func parseErr(t *testing.T, in string, maxValue int) (int, *Error) {
	t.Helper()
	var c Command
	n, err := Parse([]byte(in), maxValue, &c)
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%q: got n %d err %v, want an *Error", in, n, err)
	}
	return n, e
}

func TestParseRefusals(t *testing.T) {
	var c0 Command
	// The replies themselves are checked against memcached in
	// TestErrorsMatchMemcached; these are the other fields.
	n, e := parseErr(t, "set k 0 0 100 noreply\r\n", 10)
	if n != 23 || e.Swallow != 102 || !e.Silent || e.Close || e.Line != msgTooLarge {
		t.Errorf("too large: n %d %+v", n, *e)
	}
	n, e = parseErr(t, "set k 0 0 1\r\nabc", 10)
	if n != 16 || e.Line != msgBadChunk || e.Swallow != 0 {
		t.Errorf("bad chunk: n %d %+v", n, *e)
	}
	if _, e = parseErr(t, strings.Repeat("x", MaxLineLen+1), 0); !e.Close || e.Line != "" || e.Limit {
		t.Errorf("long line: %+v", *e)
	}
	if _, e = parseErr(t, "mg "+strings.Repeat("x", ReadBufferLen)+" v\r\n", 0); !e.Close || e.Line != "" {
		t.Errorf("whole line over the read buffer: %+v", *e)
	}
	if n, err := Parse([]byte("get "+strings.Repeat("k ", ReadBufferLen)+"\r\n"), 0, &c0); err != nil || n == 0 {
		t.Errorf("a whole get line over the read buffer is read: n %d err %v", n, err)
	}
	if _, e = parseErr(t, "get "+strings.Repeat("k ", 1500), 2500); !e.Close || !e.Limit {
		t.Errorf("long get line over the bound: %+v", *e)
	}
	var c Command
	if n, err := Parse([]byte("set k 0 0 10\r\nabc"), 0, &c); n != 0 || err != nil || c.Need != 26 {
		t.Errorf("a set waiting for its data: n %d err %v need %d", n, err, c.Need)
	}
	if n, err := Parse([]byte("set k 0 0 10"), 0, &c); n != 0 || err != nil || c.Need != 0 {
		t.Errorf("a set waiting for its line: n %d err %v need %d", n, err, c.Need)
	}
	if n, err := Parse([]byte("get "+strings.Repeat("k ", 2000)), 0, &c); n != 0 || err != nil {
		t.Errorf("a long get line waits for its newline: n %d err %v", n, err)
	}
	if n, err := Parse([]byte("   "+strings.Repeat("x", MaxLineLen)), 0, &c); n != 0 || err == nil {
		t.Errorf("long junk: n %d err %v", n, err)
	}
	if _, e = parseErr(t, "ma k O"+strings.Repeat("1", 40)+"\r\n", 0); !e.Applied || e.Line != msgOpaqueTooLong {
		t.Errorf("ma opaque: %+v", *e)
	}
	if _, e = parseErr(t, "md k O"+strings.Repeat("1", 40)+"\r\n", 0); e.Applied {
		t.Errorf("md opaque is refused before it is carried out: %+v", *e)
	}
	if _, e = parseErr(t, "ms k 5 MX\r\n", 0); e.Swallow != 7 {
		t.Errorf("ms bad mode swallows its value: %+v", *e)
	}
	if got := string(e.AppendReply(nil)); got != msgMsMode+"\r\n" {
		t.Errorf("AppendReply %q", got)
	}
	e = &Error{Line: msgBadFormat, Silent: true}
	if got := e.AppendReply(nil); len(got) != 0 {
		t.Errorf("silent AppendReply %q", got)
	}
}

// validInputs are well-formed commands of every kind.
var validInputs = []string{
	"get a\r\n", "gets a b c\r\n", "gat 10 a\r\n", "gats -1 a b\r\n",
	"get" + strings.Repeat(" key", 40) + "\r\n",
	"set k 1 2 3\r\nabc\r\n", "add k 0 0 0 noreply\r\n\r\n", "replace k 0 0 1\r\nx\r\n",
	"append k 0 0 1\r\nx\r\n", "prepend k 0 0 1\r\nx\r\n", "cas k 0 0 1 5\r\nx\r\n",
	"incr k 1\r\n", "decr k 2 noreply\r\n", "delete k\r\n", "delete k 0\r\n", "delete k noreply\r\n",
	"touch k 10\r\n", "flush_all\r\n", "flush_all 5\r\n", "flush_all noreply\r\n", "version\r\n",
	"quit\r\n", "stats\r\n", "stats slabs\r\n", "verbosity 1 noreply\r\n",
	"mg k v f s t c k O1 q\r\n", "mg Zm9v b k v\r\n", "ms k 3 T10 F5 c MS\r\nabc\r\n", "ms k 0 q I C5\r\n\r\n",
	"md k q O5 I T30\r\n", "ma k N10 J1 D5 MI v c t\r\n", "mn\r\n", "me k\r\n", "me Zm9v b\r\n",
	"lru_crawler metadump all\r\n",
}

func TestParsePartialAndPipelined(t *testing.T) {
	var c Command
	var all []byte
	for _, in := range validInputs {
		b := []byte(in)
		for i := 0; i < len(b); i++ {
			if n, err := Parse(b[:i], 1024, &c); n != 0 || err != nil {
				t.Fatalf("%q prefix %d: n %d err %v", in, i, n, err)
			}
		}
		all = append(all, b...)
	}
	for i := 0; len(all) > 0; i++ {
		n, err := Parse(all, 1024, &c)
		if err != nil || n != len(validInputs[i]) {
			t.Fatalf("pipelined %q: n %d err %v", validInputs[i], n, err)
		}
		all = all[n:]
	}
}

func TestAppendCommandRoundTrip(t *testing.T) {
	var c, d Command
	for _, in := range validInputs {
		if _, err := Parse([]byte(in), 1024, &c); err != nil {
			t.Fatal(err)
		}
		enc := AppendCommand(nil, &c)
		n, err := Parse(enc, 1024, &d)
		if err != nil || n != len(enc) {
			t.Fatalf("%q re-encoded %q: n %d err %v", in, enc, n, err)
		}
		if summary(&c) != summary(&d) {
			t.Errorf("%q re-encoded %q:\n %s\n %s", in, enc, summary(&c), summary(&d))
		}
	}
}

func TestParseAllocs(t *testing.T) {
	inputs := []string{
		"get a b c d e f g h\r\n", "set k 0 0 5\r\nhello\r\n", "mg key v f k O12 T30\r\n",
		"get" + strings.Repeat(" key", 40) + "\r\n", "bogus\r\n", "set k 0 0 abc\r\n",
	}
	var c Command
	for _, in := range inputs {
		b := []byte(in)
		if a := testing.AllocsPerRun(100, func() { _, _ = Parse(b, 1024, &c) }); a != 0 {
			t.Errorf("%q: %v allocs per Parse", in, a)
		}
	}
}

func TestNumbers(t *testing.T) {
	i32 := []struct {
		in   string
		want int32
		ok   bool
	}{
		{"0", 0, true}, {"-1", -1, true}, {"+5", 5, true}, {"\t7", 7, true}, {"7\r", 7, true},
		{"4294967297", 1, true}, {"9223372036854775807", -1, true}, {"9223372036854775808", 0, false},
		{"-9223372036854775808", 0, true}, {"", 0, false}, {"-", 0, false}, {"1x", 0, false}, {"0x10", 0, false},
	}
	for _, tc := range i32 {
		if got, ok := parseInt32([]byte(tc.in)); got != tc.want || ok != tc.ok {
			t.Errorf("parseInt32(%q) = %d %v, want %d %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	u64 := []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"18446744073709551615", 1<<64 - 1, true}, {"18446744073709551616", 0, false}, {"-1", 0, false},
		{"-0", 0, true}, {"-18446744073709551615", 1, true}, {"9223372036854775808", 1 << 63, true},
	}
	for _, tc := range u64 {
		if got, ok := parseUint64([]byte(tc.in)); got != tc.want || ok != tc.ok {
			t.Errorf("parseUint64(%q) = %d %v, want %d %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	if got, ok := parseUint32([]byte("4294967296")); got != 0 || !ok {
		t.Errorf("parseUint32 wrap: %d %v", got, ok)
	}
}

func TestBase64(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 500; i++ {
		src := make([]byte, r.IntN(200))
		for j := range src {
			src[j] = byte(r.Uint32())
		}
		enc := AppendBase64(nil, src)
		if want := base64.StdEncoding.EncodeToString(src); string(enc) != want {
			t.Fatalf("encode %x: %s, want %s", src, enc, want)
		}
		if len(enc) != Base64EncodedLen(len(src)) {
			t.Fatalf("EncodedLen(%d) = %d, is %d", len(src), Base64EncodedLen(len(src)), len(enc))
		}
		dec, ok := DecodeBase64([]byte("x"), enc)
		if len(src) == 0 {
			if ok || string(dec) != "x" {
				t.Fatalf("empty decodes: %q %v", dec, ok)
			}
			continue
		}
		if !ok || !bytes.Equal(dec[1:], src) {
			t.Fatalf("decode %s: %x %v", enc, dec, ok)
		}
		if n, ok := Base64DecodedLen(enc); !ok || n != len(src) {
			t.Fatalf("DecodedLen %s: %d %v", enc, n, ok)
		}
	}
	// memcached's leniency.
	lenient := []struct{ in, want string }{
		{"Zm9v", "foo"}, {"Zm 9v", "foo"}, {"Zm9v!", "foo"}, {"Zg==Zm9v", "f"}, {"Zm8=", "fo"}, {"Z=9v", "d\x0f"},
	}
	for _, tc := range lenient {
		if got, ok := DecodeBase64(nil, []byte(tc.in)); !ok || string(got) != tc.want {
			t.Errorf("decode %q: %q %v, want %q", tc.in, got, ok, tc.want)
		}
	}
	for _, bad := range []string{"", "a", "abc", "a===", "====", "!!!!"} {
		if _, ok := DecodeBase64(nil, []byte(bad)); ok {
			t.Errorf("decode %q succeeded", bad)
		}
	}
}

func TestParseMetaResponse(t *testing.T) {
	in := "VA 5 f3 s5 kfoo O12\r\nhello\r\nHD\r\nEN Oab kZm9v b\r\nCLIENT_ERROR bad command line format\r\nMN\r\n"
	var r MetaResponse
	b := []byte(in)
	want := []string{
		"VA f3,s5,kfoo,O12 hello", "HD  ", "EN Oab,kZm9v,b ", "CLIENT_ERROR  ", "MN  ",
	}
	var r2 MetaResponse
	for i := 0; len(b) > 0; i++ {
		n, err := ParseMetaResponse(b, &r)
		if err != nil || n == 0 {
			t.Fatalf("%q: n %d err %v", b, n, err)
		}
		for j := 0; j < n; j++ {
			if n2, err := ParseMetaResponse(b[:j], &r2); n2 != 0 || err != nil {
				t.Fatalf("prefix %q: n %d err %v", b[:j], n2, err)
			}
			if r2.Need != 0 && r2.Need != n {
				t.Fatalf("prefix %q: need %d, want %d", b[:j], r2.Need, n)
			}
		}
		if got := fmt.Sprintf("%s %s %s", r.Code, metaString(r.Flags), r.Value); got != want[i] {
			t.Errorf("reply %d: %q, want %q", i, got, want[i])
		}
		b = b[n:]
	}
	for _, bad := range []string{"VA x\r\n", "VA -1\r\n", "VA\r\n", "VA 2\r\nabc\r\n"} {
		if _, err := ParseMetaResponse([]byte(bad), &r); err != ErrBadResponse {
			t.Errorf("%q: err %v", bad, err)
		}
	}
	if n, _ := ParseMetaResponse([]byte("VA 10 s10\r\nabc"), &r); n != 0 || r.Need != 23 {
		t.Errorf("a VA waiting for its data: n %d need %d, want 23", n, r.Need)
	}
	// A key echoed raw, as stored through the binary protocol, may hold
	// spaces and line ends: with its length known it is one token.
	for _, tc := range []struct {
		in, key, flags string
		raw            int
	}{
		{"HD ka:x\r\nZ c5\r\n", "a:x\r\nZ", "ka:x\r\nZ,c5", 6},
		{"VA 2 ka: b c1\r\nab\r\n", "a: b", "ka: b,c1", 4},
		{"HD kYTp4 b\r\n", "YTp4", "kYTp4,b", 3}, // base64 echo: longer than the raw key
		{"EN ka:q\r\n", "a:q", "ka:q", 3},
		{"ME a:x y exp=-1 size=5\r\n", "a:x y", "", 5},
	} {
		n, err := ParseMetaReply([]byte(tc.in), tc.raw, &r)
		if err != nil || n != len(tc.in) || r.KeyStart < 0 || string(r.Line[r.KeyStart:r.KeyEnd]) != tc.key || metaString(r.Flags) != tc.flags {
			t.Errorf("%q raw %d: n %d err %v key %d..%d flags %q", tc.in, tc.raw, n, err, r.KeyStart, r.KeyEnd, metaString(r.Flags))
		}
		for j := 0; j < len(tc.in); j++ {
			if n, err := ParseMetaReply([]byte(tc.in[:j]), tc.raw, &r2); n != 0 || err != nil {
				t.Errorf("%q prefix %d: n %d err %v", tc.in, j, n, err)
			}
		}
	}
	b = []byte("VA 3 kx\r\nabc\r\n")
	if a := testing.AllocsPerRun(100, func() { _, _ = ParseMetaResponse(b, &r) }); a != 0 {
		t.Errorf("%v allocs per ParseMetaResponse", a)
	}
}

func TestEncoders(t *testing.T) {
	var b []byte
	b = AppendValue(b, []byte("k"), 5, []byte("abc"))
	b = AppendValueCAS(b, []byte("k2"), 0, nil, 77)
	b = append(b, End...)
	b = AppendNumber(b, 42)
	b = AppendVersion(b, "1.6.18")
	b = AppendStat(b, "pid", []byte("12"))
	b = AppendStatUint(b, "uptime", 3)
	b = AppendClientError(b, "bad data chunk")
	b = AppendServerError(b, "out of memory")
	b = AppendMeta(b, MetaHD, []MetaFlag{{'O', []byte("1")}, {'k', []byte("foo")}, {'b', nil}})
	b = AppendMetaValue(b, []MetaFlag{{'f', []byte("0")}, {'s', []byte("5")}}, []byte("hello"))
	want := "VALUE k 5 3\r\nabc\r\nVALUE k2 0 0 77\r\n\r\nEND\r\n42\r\nVERSION 1.6.18\r\nSTAT pid 12\r\nSTAT uptime 3\r\n" +
		"CLIENT_ERROR bad data chunk\r\nSERVER_ERROR out of memory\r\nHD O1 kfoo b\r\nVA 5 f0 s5\r\nhello\r\n"
	if string(b) != want {
		t.Errorf("got  %q\nwant %q", b, want)
	}
	dst := make([]byte, 0, 256)
	if a := testing.AllocsPerRun(100, func() {
		d := AppendValueCAS(dst, []byte("key"), 1, []byte("value"), 99)
		d = AppendMetaValue(d, []MetaFlag{{'k', []byte("key")}}, []byte("v"))
		_ = AppendBase64(d, []byte("key"))
	}); a != 0 {
		t.Errorf("%v allocs per encode", a)
	}
}
