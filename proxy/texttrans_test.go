package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// textLine is how a text client writes c.
func textLine(c *textCommand) string {
	nr := ""
	if c.noreply {
		nr = " noreply"
	}
	name := c.verb.Name
	switch c.kind() {
	case text.KindGet, text.KindGets:
		return name + " " + string(c.key) + "\r\n"
	case text.KindGat, text.KindGats:
		return fmt.Sprintf("%s %d %s\r\n", name, c.exptime, c.key)
	case text.KindSet, text.KindAdd, text.KindReplace, text.KindAppend, text.KindPrepend:
		return fmt.Sprintf("%s %s %d %d %d%s\r\n%s\r\n", name, c.key, c.flags, c.exptime, len(c.value), nr, c.value)
	case text.KindCas:
		return fmt.Sprintf("cas %s %d %d %d %d%s\r\n%s\r\n", c.key, c.flags, c.exptime, len(c.value), c.cas, nr, c.value)
	case text.KindIncr, text.KindDecr:
		return fmt.Sprintf("%s %s %d%s\r\n", name, c.key, c.delta, nr)
	case text.KindDelete:
		return fmt.Sprintf("delete %s%s\r\n", c.key, nr)
	case text.KindTouch:
		return fmt.Sprintf("touch %s %d%s\r\n", c.key, c.exptime, nr)
	}
	panic("no text form")
}

// verbOf is the command table's row for name.
func verbOf(name string) *text.Verb {
	v, ok := text.Lookup(name)
	if !ok {
		panic("no command " + name)
	}
	return v
}

// TestTextTranslationMatchesMemcached sends each command as text to one
// fresh memcached and, translated (buildTextRequest), as binary to another,
// and checks that the binary answers, turned back into text
// (appendTextResponse, appendTextError), are byte for byte memcached's
// own text replies: every status a classic command can meet (hits, misses,
// CAS conflicts, NOT_STORED, non-numeric incr, too large, noreply).
func TestTextTranslationMatchesMemcached(t *testing.T) {
	t.Parallel()
	textSrv, binSrv := testmc.Start(t, "-I", "1m"), testmc.Start(t, "-I", "1m")
	tc, err := net.Dial("tcp", textSrv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	bc, err := net.Dial("tcp", binSrv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer bc.Close()
	tr := bufio.NewReader(tc)

	big := bytes.Repeat([]byte("x"), 2<<20)
	k := func(s string) []byte { return []byte(s) }
	cmds := []textCommand{
		{verb: verbOf("get"), key: k("a")},
		{verb: verbOf("set"), key: k("a"), value: k("hello"), flags: 7},
		{verb: verbOf("get"), key: k("a")},
		{verb: verbOf("gets"), key: k("a")},
		{verb: verbOf("add"), key: k("a"), value: k("x")},
		{verb: verbOf("add"), key: k("b"), value: k("bee"), flags: 1},
		{verb: verbOf("replace"), key: k("nope"), value: k("x")},
		{verb: verbOf("replace"), key: k("b"), value: k("bee2")},
		{verb: verbOf("append"), key: k("b"), value: k("+tail")},
		{verb: verbOf("prepend"), key: k("b"), value: k("head+")},
		{verb: verbOf("append"), key: k("nope"), value: k("x")},
		{verb: verbOf("prepend"), key: k("nope"), value: k("x")},
		{verb: verbOf("get"), key: k("b")},
		{verb: verbOf("cas"), key: k("a"), value: k("cas1"), cas: 999999},
		{verb: verbOf("cas"), key: k("nope"), value: k("x"), cas: 1},
		{verb: verbOf("cas"), key: k("a"), value: k("zero"), cas: 0},
		{verb: verbOf("cas"), key: k("nope"), value: k("zero"), cas: 0},
		{verb: verbOf("set"), key: k("n"), value: k("10")},
		{verb: verbOf("incr"), key: k("n"), delta: 5},
		{verb: verbOf("decr"), key: k("n"), delta: 100},
		{verb: verbOf("incr"), key: k("nope"), delta: 1},
		{verb: verbOf("incr"), key: k("a"), delta: 1},
		{verb: verbOf("incr"), key: k("n"), delta: 18446744073709551615},
		{verb: verbOf("touch"), key: k("a"), exptime: 100},
		{verb: verbOf("touch"), key: k("nope"), exptime: 100},
		{verb: verbOf("gat"), key: k("a"), exptime: 200},
		{verb: verbOf("gats"), key: k("a"), exptime: 0},
		{verb: verbOf("gat"), key: k("nope"), exptime: 1},
		{verb: verbOf("delete"), key: k("b")},
		{verb: verbOf("delete"), key: k("b")},
		{verb: verbOf("set"), key: k("big"), value: big},
		{verb: verbOf("set"), key: k("q"), value: k("quiet"), noreply: true},
		{verb: verbOf("add"), key: k("q"), value: k("x"), noreply: true},
		{verb: verbOf("incr"), key: k("q"), delta: 1, noreply: true},
		{verb: verbOf("delete"), key: k("nope"), noreply: true},
		{verb: verbOf("get"), key: k("q")},
	}
	var buf, out []byte
	for i := range cmds {
		c := &cmds[i]
		want := textReply(t, tc, tr, textLine(c), c)
		var r request
		buf = buildTextRequest(buf, c, &r)
		out = out[:0]
		for _, resp := range binaryRoundTrip(t, bc, r.frame.Raw) {
			if resp.Status() == binary.StatusSuccess {
				out = appendTextResponse(out, r.head(), response{op: resp.Opcode, status: resp.Status(), extras: resp.Extras(), key: resp.Key(), value: resp.Value(), cas: resp.CAS})
			} else {
				out = appendTextError(out, r.head(), resp.Status(), string(resp.Value()))
			}
		}
		if c.kind().IsMultiGet() {
			out = appendTextResponse(out, reqHead{op: binary.OpNoop, opaque: textTag(c.kind(), partEnd, false)}, response{status: binary.StatusSuccess})
		}
		if string(out) != want {
			t.Errorf("%q: translated %q, memcached %q", trunc(textLine(c)), trunc(string(out)), trunc(want))
		}
	}
}

func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// textReply sends line to memcached's text port and reads the whole reply
// (for noreply commands: none; a "mn" fence tells).
func textReply(t *testing.T, c net.Conn, r *bufio.Reader, line string, cmd *textCommand) string {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(clientPatience))
	if _, err := io.WriteString(c, line+"mn\r\n"); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("%q: %v", trunc(line), err)
		}
		if l == "MN\r\n" {
			return out.String()
		}
		out.WriteString(l)
		if strings.HasPrefix(l, "VALUE ") {
			f := strings.Fields(l)
			n, _ := strconv.Atoi(f[3])
			data := make([]byte, n+2)
			if _, err := io.ReadFull(r, data); err != nil {
				t.Fatal(err)
			}
			out.Write(data)
		}
	}
}

// binaryRoundTrip sends frame and a NOOP fence to memcached's binary port
// and returns the answers before the fence's.
func binaryRoundTrip(t *testing.T, c net.Conn, frame []byte) []binary.Frame {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(clientPatience))
	req := append(append([]byte(nil), frame...), binary.AppendFrame(nil, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpNoop, Opaque: 0xfe11ce}, nil, nil, nil, nil)...)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var got []binary.Frame
	var in []byte
	tmp := make([]byte, 64<<10)
	for {
		for {
			f, n, err := binary.Decode(in, len(in))
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			raw := append([]byte(nil), in[:n]...)
			f2, _, _ := binary.Decode(raw, len(raw))
			in = in[n:]
			if f.Opcode == binary.OpNoop && f.Opaque == 0xfe11ce {
				return got
			}
			got = append(got, f2)
		}
		n, err := c.Read(tmp)
		if err != nil {
			t.Fatal(err)
		}
		in = append(in, tmp[:n]...)
	}
}
