package proxy

// Rule 4: a write refused as too large whose 1 unit the bucket cannot
// admit now (EWouldThrottle, max_hold).

import (
	"bytes"
	"fmt"
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
//
// The clock moves only once the refusal is read (before, once nothing had
// come for 300 ms of real time: a loop that read the write later read it
// after the clock's move, admitted its unit and answered "too large",
// SET/3, instead of the refusal).
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
	// check writes in on c and reads its first answer with the clock
	// standing still (the refusal comes at once: a read of it that waited
	// for the clock would never end), then moves the clock a second and
	// reads up to the answer of the NOOP or mn after the value: want gets
	// every byte read.
	check := func(what string, c net.Conn, in []byte, answers func(out []byte) int, want func(out []byte) string) {
		t.Helper()
		spendBinary(t, nb, "spent") // the next command waits 100 ms, past max_hold
		_ = c.SetDeadline(time.Now().Add(clientPatience))
		if _, err := c.Write(in); err != nil {
			t.Fatal(err)
		}
		out := readAnswers(t, c, nil, answers, 1) // the refusal, at once
		clock.Advance(time.Second)                // the value's drop paced at the bucket's 10 write units a second
		out = readAnswers(t, c, out, answers, 2)
		if msg := want(out); msg != "" {
			t.Errorf("%s: %s", what, msg)
		}
	}
	binAnswers := func(out []byte) (n int) {
		for len(out) >= mc.HeaderLen {
			h, _ := mc.ParseHeader(out)
			if len(out) < mc.HeaderLen+int(h.BodyLen) {
				break
			}
			out = out[mc.HeaderLen+int(h.BodyLen):]
			n++
		}
		return n
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
	check("non-blocking binary", nb.Conn(), in, binAnswers, binWant(mc.StatusEWouldThrottle))
	check("blocking binary, max_hold", fresh(), in, binAnswers, binWant(mc.StatusEtmpfail))
	text := fmt.Sprintf("set big 0 0 %d\r\n%s\r\nmn\r\n", len(tooLargeValue), tooLargeValue)
	textAnswers := func(out []byte) int { return bytes.Count(out, []byte("\r\n")) }
	check("text, max_hold", fresh(), []byte(text), textAnswers, func(out []byte) string {
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

// readAnswers reads c until answers counts at least n answers in out and
// what it read after it (no spell of quiet: the caller's deadline on c is
// a liveness bound only), and returns them.
func readAnswers(t *testing.T, c net.Conn, out []byte, answers func([]byte) int, n int) []byte {
	t.Helper()
	buf := make([]byte, 64<<10)
	for answers(out) < n {
		k, err := c.Read(buf)
		out = append(out, buf[:k]...)
		if err != nil {
			t.Fatalf("after %d answers (%q): %v", answers(out), out, err)
		}
	}
	return out
}
