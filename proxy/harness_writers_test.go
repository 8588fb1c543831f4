package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Test helpers for clients that write more than the proxy reads
// (back-pressure, paused sessions, held input): writers pipelining noreply
// sets into a connection, and what the proxy holds of each client's input.
// Used by the back-pressure, read-gate and ceiling-wait tests.

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

// checkStored reads keys prefix0..prefix(n-1) of bucket from memcached at
// mcAddr, as the proxy stores them (namespaced "bucket:key"), and fails
// the test for each one missing or wrong. It reads memcached directly:
// what is checked is what was stored, and a multi-get of 100 keys through
// the proxy costs about a hundred times more under race (16,384 keys took
// 14 s of a 29 s test).
func checkStored(t *testing.T, mcAddr, bucket, prefix string, n, valueLen int) {
	t.Helper()
	prefix = bucket + ":" + prefix
	tc := dialText(t, mcAddr)
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
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // liveness: the mn queues behind what c sent before
	if _, err := io.WriteString(c, "mn\r\n"); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 4)
	if _, err := io.ReadFull(c, reply); err != nil || string(reply) != "MN\r\n" {
		t.Fatalf("mn on the writer's connection: %q %v", reply, err)
	}
}
