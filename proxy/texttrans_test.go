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
)

// textLine is how a text client writes c.
func textLine(c *textCommand) string {
	nr := ""
	if c.noreply {
		nr = " noreply"
	}
	switch c.kind {
	case tkGet:
		return "get " + string(c.key) + "\r\n"
	case tkGets:
		return "gets " + string(c.key) + "\r\n"
	case tkGat:
		return fmt.Sprintf("gat %d %s\r\n", c.exptime, c.key)
	case tkGats:
		return fmt.Sprintf("gats %d %s\r\n", c.exptime, c.key)
	case tkSet, tkAdd, tkReplace, tkAppend, tkPrepend:
		name := map[textKind]string{tkSet: "set", tkAdd: "add", tkReplace: "replace", tkAppend: "append", tkPrepend: "prepend"}[c.kind]
		return fmt.Sprintf("%s %s %d %d %d%s\r\n%s\r\n", name, c.key, c.flags, c.exptime, len(c.value), nr, c.value)
	case tkCas:
		return fmt.Sprintf("cas %s %d %d %d %d%s\r\n%s\r\n", c.key, c.flags, c.exptime, len(c.value), c.cas, nr, c.value)
	case tkIncr:
		return fmt.Sprintf("incr %s %d%s\r\n", c.key, c.delta, nr)
	case tkDecr:
		return fmt.Sprintf("decr %s %d%s\r\n", c.key, c.delta, nr)
	case tkDelete:
		return fmt.Sprintf("delete %s%s\r\n", c.key, nr)
	case tkTouch:
		return fmt.Sprintf("touch %s %d%s\r\n", c.key, c.exptime, nr)
	}
	panic("no text form")
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
		{kind: tkGet, key: k("a")},
		{kind: tkSet, key: k("a"), value: k("hello"), flags: 7},
		{kind: tkGet, key: k("a")},
		{kind: tkGets, key: k("a")},
		{kind: tkAdd, key: k("a"), value: k("x")},
		{kind: tkAdd, key: k("b"), value: k("bee"), flags: 1},
		{kind: tkReplace, key: k("nope"), value: k("x")},
		{kind: tkReplace, key: k("b"), value: k("bee2")},
		{kind: tkAppend, key: k("b"), value: k("+tail")},
		{kind: tkPrepend, key: k("b"), value: k("head+")},
		{kind: tkAppend, key: k("nope"), value: k("x")},
		{kind: tkPrepend, key: k("nope"), value: k("x")},
		{kind: tkGet, key: k("b")},
		{kind: tkCas, key: k("a"), value: k("cas1"), cas: 999999},
		{kind: tkCas, key: k("nope"), value: k("x"), cas: 1},
		{kind: tkCas, key: k("a"), value: k("zero"), cas: 0},
		{kind: tkCas, key: k("nope"), value: k("zero"), cas: 0},
		{kind: tkSet, key: k("n"), value: k("10")},
		{kind: tkIncr, key: k("n"), delta: 5},
		{kind: tkDecr, key: k("n"), delta: 100},
		{kind: tkIncr, key: k("nope"), delta: 1},
		{kind: tkIncr, key: k("a"), delta: 1},
		{kind: tkIncr, key: k("n"), delta: 18446744073709551615},
		{kind: tkTouch, key: k("a"), exptime: 100},
		{kind: tkTouch, key: k("nope"), exptime: 100},
		{kind: tkGat, key: k("a"), exptime: 200},
		{kind: tkGats, key: k("a"), exptime: 0},
		{kind: tkGat, key: k("nope"), exptime: 1},
		{kind: tkDelete, key: k("b")},
		{kind: tkDelete, key: k("b")},
		{kind: tkSet, key: k("big"), value: big},
		{kind: tkSet, key: k("q"), value: k("quiet"), noreply: true},
		{kind: tkAdd, key: k("q"), value: k("x"), noreply: true},
		{kind: tkIncr, key: k("q"), delta: 1, noreply: true},
		{kind: tkDelete, key: k("nope"), noreply: true},
		{kind: tkGet, key: k("q")},
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
		if isRetrieval(c.kind) {
			out = appendTextResponse(out, reqHead{op: binary.OpNoop, opaque: textTag(tkEnd, false)}, response{status: binary.StatusSuccess})
		}
		if string(out) != want {
			t.Errorf("%q: translated %q, memcached %q", trunc(textLine(c)), trunc(string(out)), trunc(want))
		}
	}
}

func isRetrieval(k textKind) bool { return k == tkGet || k == tkGets || k == tkGat || k == tkGats }

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
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
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
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
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
