package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// Back-pressure on paused sessions (readgate.go), with clients that
// pipeline noreply sets far past max_held_input_bytes: the proxy stops
// reading them, their writes block, nothing is dropped, nobody is closed,
// and they go on at the rate their bucket allows.

// TestHeldWriterBackPressure: a raw client pipelines 16 MiB of noreply
// sets (256 times max_held_input_bytes) into a bucket at its hard limit,
// on the engine's fake clock. The proxy stops reading it: the client's
// writes block, the session holds at most max_held_input_bytes and one
// read, and the rest waits in the kernel. Each second the clock advances,
// exactly the hard limit's worth of sets is admitted; the connection is
// never closed, and when the budget has refilled enough every set is
// stored. (Before back-pressure the proxy closed the connection at the
// bound and the sets behind it were lost.)
func TestHeldWriterBackPressure(t *testing.T) {
	t.Parallel()
	const limit, n, valueLen = 100, 4096, 4000 // 1 unit per set
	burst := 2 * time.Second
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, bpConfig(limit, burst), clock)
	b := p.Engine().Bucket("default")
	w := startPipeWriter(t, rawDial(t, p.Addr), "bp", n, valueLen)

	blockedSession(t, p, w, held)
	t.Logf("%d sets admitted in the first burst", b.Stats().Commands)

	// The rate, on the fake clock: a second (within the burst) admits
	// the hard limit's worth, then the bucket holds again.
	for i := 0; i < 3; i++ {
		if got := admitted(t, p, clock, b, time.Second); got != limit {
			t.Fatalf("advancing the clock 1 s admitted %d sets, want %d (the hard limit)", got, limit)
		}
		checkInputBound(t, p)
	}
	// The rest, a burst at a time.
	ft := &fakeTime{t: t, p: p, clock: clock}
	for b.Stats().Commands < n {
		before := b.Stats().Commands
		want := min(uint64(n), before+uint64(limit*burst/time.Second))
		held := 1
		if want == n {
			held = 0
		}
		ft.step(burst, held, nil)
		if got := b.Stats().Commands; got != want {
			t.Fatalf("advancing the clock %v from %d sets admitted: %d, want %d", burst, before, got, want)
		}
		checkInputBound(t, p)
	}
	w.wait(t, 10*time.Second)
	if r := p.Server.readStops.Load(); r == 0 {
		t.Error("the proxy never stopped reading the client")
	}
	checkInStep(t, w.c)
	b.SetLimits(0, -1)
	checkStored(t, p.MC.Addr, "default", "bp", n, valueLen)
}

// TestHeldWriterDrainsItsResponse: a client asks for a 1 MB value, does
// not read it, and pipelines noreply sets into its bucket, at its hard
// limit. The response waits in gnet's outbound buffer (the client's
// receive buffer is small) while the proxy stops reading the client. When
// the client reads its response, gnet's outbound buffer drains and gnet
// turns reading back on: the proxy takes one more read and stops reading
// again, the session holding at most max_held_input_bytes and two reads.
// Then every set is stored.
func TestHeldWriterDrainsItsResponse(t *testing.T) {
	t.Parallel()
	const limit, n, valueLen, big = 100, 4096, 4000, 1000000
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, bpConfig(limit, 2*time.Second), clock)
	b := p.Engine().Bucket("default")
	b.SetLimits(0, -1)
	tc := dialText(t, p.Addr)
	textDo(t, tc, fmt.Sprintf("set big 0 0 %d\r\n%s\r\n", big, bpValue(0, big)), "STORED\r\n")
	_ = tc.c.Close()
	eventually(t, time.Minute, "the setter to be gone", func() bool { return p.Connections() == 0 })
	b.SetLimits(0, limit)

	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var err error
		_ = rc.Control(func(fd uintptr) { err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 8<<10) })
		return err
	}}
	c, err := d.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	// Small socket buffers on both sides, so that the response waits in
	// gnet's outbound buffer.
	eventually(t, time.Minute, "the session to open", func() bool { return p.Connections() == 1 })
	onLoop(t, p, func(lp *loop) {
		for s := range lp.sessions {
			_ = s.c.(gnet.Conn).SetWriteBuffer(16 << 10)
		}
	})
	w := startPipeWriterOf(t, c, n, func(buf *bytes.Buffer, i int) {
		if i == 0 {
			buf.WriteString("get big\r\n")
			return
		}
		fmt.Fprintf(buf, "set dr%d 0 0 %d noreply\r\n%s\r\n", i-1, valueLen, bpValue(i-1, valueLen))
	})
	blockedSession(t, p, w, held)
	// memcached's 1 MB answer may still be on its way (a busy machine):
	// it ends up waiting in gnet's outbound buffer, the client not reading.
	var first clientInput
	eventually(t, 30*time.Second, "the response to wait in gnet's outbound buffer", func() bool {
		for _, c := range checkInputBound(t, p) {
			if c.pause == held && c.readOff && c.outbound > 0 {
				first = c
				return true
			}
		}
		return false
	})
	t.Logf("response unsent: %d bytes", first.outbound)
	stops := p.readStops.Load()

	// The client reads its response: gnet drains its buffer and reads
	// again; the proxy stops reading again.
	_ = c.SetReadDeadline(time.Now().Add(clientPatience))
	want := fmt.Sprintf("VALUE big 0 %d\r\n%s\r\nEND\r\n", big, bpValue(0, big))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != want {
		t.Fatalf("the 1 MB response: %v (%d bytes, %q...)", err, len(got), got[:40])
	}
	eventually(t, 10*time.Second, "gnet's outbound buffer to drain", func() bool {
		in := clientInputs(t, p)
		return len(in) == 1 && in[0].outbound == 0
	})
	// gnet reads again once its buffer is drained; the proxy then stops
	// reading the held session again.
	var in []clientInput
	eventually(t, 10*time.Second, "the held session not read again after the drain", func() bool {
		in = clientInputs(t, p)
		return len(in) == 1 && in[0].readOff && in[0].pause == held && in[0].unread > 0
	})
	if in[0].buffered > bpHeldInput+2*gnetReadBuffer {
		t.Errorf("the session holds %d bytes of input after the drain, over max_held_input_bytes (%d) + two reads", in[0].buffered, bpHeldInput)
	}
	t.Logf("after the drain: proxy holds %d, socket %d; reading stopped %d times more", in[0].buffered, in[0].unread, p.readStops.Load()-stops)

	b.SetLimits(0, -1)
	clock.Advance(time.Minute) // the held set's wake-up time
	w.wait(t, clientPatience)
	checkInStep(t, c)
	checkStored(t, p.MC.Addr, "default", "dr", n-1, valueLen)
}
