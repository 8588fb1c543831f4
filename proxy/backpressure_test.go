package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
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

// bpHeldInput is max_held_input_bytes in these tests, small to keep them
// fast; gnetReadBuffer is one read of an event loop (gnet's default
// ReadBufferCap), what a session may hold beyond it.
const (
	bpHeldInput    = 64 << 10
	gnetReadBuffer = 64 << 10
)

// bpConfig is a proxy with max_held_input_bytes = bpHeldInput, one event
// loop, and a default bucket limited to hardLimit units/s whose gauge may
// run burst ahead of its rate.
func bpConfig(hardLimit int, burst time.Duration) testConfig {
	return testConfig{
		proxy:    fmt.Sprintf("max_held_input_bytes = %d", bpHeldInput),
		throttle: fmt.Sprintf("capacity = \"unlimited\"\nburst_ms = %d", burst.Milliseconds()),
		tail:     fmt.Sprintf("[[bucket]]\nname = \"default\"\nhard_limit = %d\n", hardLimit),
		loops:    1,
	}
}

// clientInput is what the proxy holds of one client's input.
type clientInput struct {
	buffered int        // read by gnet, not yet processed
	unread   int        // still in the socket's receive buffer
	outbound int        // responses gnet has not yet written to the socket
	readOff  bool       // the socket is out of the loop's read interest
	pause    pauseState // why the session dispatches nothing
}

// clientInputs returns the input state of every client session of p.
func clientInputs(t *testing.T, p *testProxy) []clientInput {
	t.Helper()
	var out []clientInput
	onLoop(t, p, func(lp *loop) {
		for s := range lp.sessions {
			out = append(out, clientInput{s.c.InboundBuffered(), unreadBytes(s.c.Fd()), s.c.OutboundBuffered(), s.readOff, s.pause})
		}
	})
	return out
}

// checkInputBound fails the test when a session holds more of its
// client's input than max_held_input_bytes and one read, and returns the
// sessions' input states.
func checkInputBound(t *testing.T, p *testProxy) []clientInput {
	t.Helper()
	in := clientInputs(t, p)
	for _, c := range in {
		if c.buffered > bpHeldInput+gnetReadBuffer {
			t.Errorf("a %v session holds %d bytes of input, over max_held_input_bytes (%d) + one read (%d)",
				c.pause, c.buffered, bpHeldInput, gnetReadBuffer)
		}
	}
	return in
}

// bpValue is key i's value, valueLen bytes.
func bpValue(i, valueLen int) []byte {
	v := bytes.Repeat([]byte{'a' + byte(i%26)}, valueLen)
	copy(v, strconv.Itoa(i))
	return v
}

// pipeWriter pipelines n text sets with noreply (keys prefix0 up, values
// bpValue) on connection c, from a goroutine of its own that ends when
// everything is written or the connection fails (the test's cleanup
// closes it and waits for the goroutine).
type pipeWriter struct {
	c       net.Conn
	total   int64
	written atomic.Int64 // bytes the kernel has taken
	done    chan struct{}
	err     error // set before done is closed
}

func startPipeWriter(t *testing.T, c net.Conn, prefix string, n, valueLen int) *pipeWriter {
	t.Helper()
	return startPipeWriterOf(t, c, n, func(b *bytes.Buffer, i int) {
		fmt.Fprintf(b, "set %s%d 0 0 %d noreply\r\n%s\r\n", prefix, i, valueLen, bpValue(i, valueLen))
	})
}

// startPipeWriterOf is startPipeWriter with n commands of its own: cmd
// appends the i-th to b.
func startPipeWriterOf(t *testing.T, c net.Conn, n int, cmd func(b *bytes.Buffer, i int)) *pipeWriter {
	t.Helper()
	var all bytes.Buffer
	for i := 0; i < n; i++ {
		cmd(&all, i)
	}
	w := &pipeWriter{c: c, total: int64(all.Len()), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		buf := all.Bytes()
		for len(buf) > 0 {
			k := min(len(buf), 32<<10)
			_, w.err = c.Write(buf[:k])
			if w.err != nil {
				return
			}
			w.written.Add(int64(k))
			buf = buf[k:]
		}
	}()
	t.Cleanup(func() {
		_ = c.Close()
		<-w.done
	})
	return w
}

// wait waits for the writer to have written everything.
func (w *pipeWriter) wait(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-w.done:
		if w.err != nil {
			t.Fatalf("writer: %v after %d of %d bytes", w.err, w.written.Load(), w.total)
		}
	case <-time.After(d):
		t.Fatalf("writer not done after %v: %d of %d bytes written", d, w.written.Load(), w.total)
	}
}

// blockedSession waits until the proxy has stopped reading writer w's
// connection: a session in pause state want, no longer read, with input
// waiting in its socket, and the writer stuck in a write (no progress
// between two looks 50 ms apart, and not finished). It checks throughout
// that the proxy holds no more of any client's input than the bound. The
// state is the test's condition, not a pause of the writer: on a loaded
// machine the writer may stall for a while before the loop has read what
// it sent.
func blockedSession(t *testing.T, p *testProxy, w *pipeWriter, want pauseState) clientInput {
	t.Helper()
	var in []clientInput
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		before := w.written.Load()
		select {
		case <-w.done:
			t.Fatalf("the writer finished (%d of %d bytes, err %v): it was never blocked", w.written.Load(), w.total, w.err)
		case <-time.After(50 * time.Millisecond):
		}
		in = checkInputBound(t, p)
		if w.written.Load() != before {
			continue
		}
		for _, c := range in {
			if c.pause == want && c.readOff && c.unread > 0 {
				t.Logf("blocked after %d of %d bytes; the proxy holds %d, its socket %d", w.written.Load(), w.total, c.buffered, c.unread)
				return c
			}
		}
	}
	t.Fatalf("sessions %+v (writer at %d of %d bytes): want one %v, not read, with input waiting in its socket", in, w.written.Load(), w.total, want)
	return clientInput{}
}

// checkStored reads keys prefix0..prefix(n-1) through a connection of
// their own and fails the test for each one missing or wrong.
func checkStored(t *testing.T, addr, prefix string, n, valueLen int) {
	t.Helper()
	tc := dialText(t, addr)
	missing := 0
	for i := 0; i < n; i += 100 {
		var req strings.Builder
		req.WriteString("get")
		for j := i; j < min(n, i+100); j++ {
			fmt.Fprintf(&req, " %s%d", prefix, j)
		}
		req.WriteString("\r\n")
		got := textDo(t, tc, req.String(), "END\r\n")
		for j := i; j < min(n, i+100); j++ {
			want := fmt.Sprintf("VALUE %s%d 0 %d\r\n%s\r\n", prefix, j, valueLen, bpValue(j, valueLen))
			if !strings.Contains(got, want) {
				missing++
			}
		}
	}
	if missing > 0 {
		t.Fatalf("%d of %d keys missing or wrong", missing, n)
	}
}

// checkInStep checks that connection c is open and in step: an
// unmetered meta no-op is answered.
func checkInStep(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "mn\r\n"); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 4)
	if _, err := io.ReadFull(c, reply); err != nil || string(reply) != "MN\r\n" {
		t.Fatalf("mn on the writer's connection: %q %v", reply, err)
	}
}

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
	checkStored(t, p.Addr, "bp", n, valueLen)
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
	eventually(t, 5*time.Second, "the setter to be gone", func() bool { return p.Connections() == 0 })
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
	eventually(t, 5*time.Second, "the session to open", func() bool { return p.Connections() == 1 })
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
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
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
	w.wait(t, 20*time.Second)
	checkInStep(t, c)
	checkStored(t, p.Addr, "dr", n-1, valueLen)
}
