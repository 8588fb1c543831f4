package proxy

// Rule 4: a write refused as too large whose 1 unit the bucket cannot
// admit now (EWouldThrottle, max_hold).

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestRule4RefusedWriteNotAdmittedStaysInStep: a write too large for
// memcached (1 KiB items) whose 1 unit the bucket cannot admit now (hard
// limit 10/s, burst 0, spent; the clock standing still) is answered as
// such (EWouldThrottle for a non-blocking binary client, Etmpfail by
// max_hold for a blocking binary or text one) at once, and its value is
// still read and dropped (at the bucket's pace: a second of the clock),
// never parsed as commands nor sent to memcached: the NOOP or mn after it
// is the next answer, and nothing else comes. With burst_ms = 0 the drop
// never began before the review's fix (throttle.Bucket.Discard found no
// room, ever: TestDiscardWithoutBurst) and the connection stalled.
func TestRule4RefusedWriteNotAdmittedStaysInStep(t *testing.T) {
	t.Parallel()
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyTo(t, testmc.Start(t, smallItems...), testConfig{clock: clock, loops: 1,
		throttle: "capacity = \"unlimited\"\nburst_ms = 0\nmax_hold = \"50ms\"",
		tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 10\n"})
	eventually(t, time.Minute, "memcached's item size known", func() bool { return p.pool.ItemSizeMax() == 1024 })
	nb := dial(t, p.Addr)
	hello(t, nb, mc.FeatureNonBlockingThrottlingMode)
	before := bytesRead(t, p.MC.Addr)

	fresh := func() net.Conn {
		c, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	check := func(what string, c net.Conn, in []byte, want func(out []byte) string) {
		t.Helper()
		spendBinary(t, nb, "spent") // the next command waits 100 ms, past max_hold
		_ = c.SetDeadline(time.Now().Add(clientPatience))
		if _, err := c.Write(in); err != nil {
			t.Fatal(err)
		}
		out := readUntilQuiet(c)   // the answer, at once
		clock.Advance(time.Second) // the value's drop paced at the bucket's 10 write units a second
		out = append(out, readUntilQuiet(c)...)
		if msg := want(out); msg != "" {
			t.Errorf("%s: %s", what, msg)
		}
	}
	binWant := func(status mc.Status) func([]byte) string {
		return func(out []byte) string {
			var got []string
			for len(out) >= mc.HeaderLen {
				h, _ := mc.ParseHeader(out)
				got = append(got, fmt.Sprintf("%v/%x", h.Opcode, uint16(h.Status())))
				out = out[min(len(out), mc.HeaderLen+int(h.BodyLen)):]
			}
			want := []string{fmt.Sprintf("%v/%x", mc.OpSet, uint16(status)), fmt.Sprintf("%v/0", mc.OpNoop)}
			if strings.Join(got, " ") != strings.Join(want, " ") {
				return fmt.Sprintf("answers %v, want %v", got, want)
			}
			return ""
		}
	}
	in := append(binFrame(mc.OpSet, "big", tooLargeValue, make([]byte, 8), 0, 1), binFrame(mc.OpNoop, "", "", nil, 0, 0x99)...)
	check("non-blocking binary", nb.Conn(), in, binWant(mc.StatusEWouldThrottle))
	check("blocking binary, max_hold", fresh(), in, binWant(mc.StatusEtmpfail))
	text := fmt.Sprintf("set big 0 0 %d\r\n%s\r\nmn\r\n", len(tooLargeValue), tooLargeValue)
	check("text, max_hold", fresh(), []byte(text), func(out []byte) string {
		lines := strings.SplitAfter(string(out), "\r\n")
		if len(lines) != 3 || !strings.HasPrefix(lines[0], "SERVER_ERROR") || lines[1] != "MN\r\n" {
			return fmt.Sprintf("answered %q, want one SERVER_ERROR line and MN", out)
		}
		return ""
	})
	if read := bytesRead(t, p.MC.Addr) - before; read >= len(tooLargeValue) {
		t.Errorf("memcached read %d bytes: a refused value went to it", read)
	}
}

// readUntilQuiet reads c until nothing comes for 300 ms of real time (the
// answers the test waits for come with the fake clock standing still).
func readUntilQuiet(c net.Conn) []byte {
	var out []byte
	r := bufio.NewReader(c)
	buf := make([]byte, 64<<10)
	for {
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			if err != io.EOF {
				_ = c.SetReadDeadline(time.Time{})
			}
			return out
		}
	}
}
