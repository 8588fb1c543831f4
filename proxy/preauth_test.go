package proxy

import (
	"bytes"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// bigSetHeader is the header of a SET whose body (8 bytes of extras, key
// "k", value) is bodyLen bytes long.
func bigSetHeader(bodyLen int) []byte {
	h := mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpSet, KeyLen: 1, ExtLen: 8, BodyLen: uint32(bodyLen), Opaque: 7}
	b := make([]byte, mc.HeaderLen)
	h.Put(b)
	return b
}

// TestPreAuthLargeFrameRefused: before authenticating, a connection cannot
// make the proxy buffer a large frame. The header of a 20 MB SET gets
// Einval while the client has sent only 64 KB of its body, and the
// connection closes, so the rest cannot be sent. This holds for many such
// connections at once, and for a frame pipelined behind SASL AUTH while
// the password is checked. A connection on the default bucket, and an
// authenticated one, may still send large values.
func TestPreAuthLargeFrameRefused(t *testing.T) {
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tenantTail(t)})
	const body = 20 << 20
	chunk := make([]byte, 64<<10)

	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", p.Addr)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			_ = conn.SetWriteDeadline(time.Now().Add(clientPatience))
			if _, err := conn.Write(append(bigSetHeader(body), chunk...)); err != nil {
				errs <- err
				return
			}
			h, err := readStatus(t, conn, time.Minute) // liveness
			if err != nil || h.Status() != mc.StatusEinval || h.Opaque != 7 {
				errs <- errors.Join(errors.New("want Einval for a large frame before authentication"), err)
				return
			}
			// The proxy no longer reads: writing the rest of the body fails.
			_ = conn.SetWriteDeadline(time.Now().Add(clientPatience))
			for sent := len(chunk); sent < body; sent += len(chunk) {
				if _, err := conn.Write(chunk); err != nil {
					return
				}
			}
			errs <- errors.New("the proxy accepted the whole 20 MB body of an unauthenticated client")
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	eventually(t, time.Minute, "the refused connections to be closed", func() bool { return p.Connections() == 0 })

	// Pipelined behind SASL AUTH: the input waiting during the password
	// check is bounded too.
	conn, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	auth := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpSASLAuth, Opaque: 1}, nil, nil,
		[]byte("PLAIN"), []byte("\x00alice\x00wrong"))
	_, _ = conn.Write(append(append(auth, bigSetHeader(body)...), chunk...))
	waitClosed(t, conn, 5*time.Second)

	// Authenticated, a large value is fine.
	a := login(t, p.Addr, "alice")
	big := bytes.Repeat([]byte("v"), 900<<10)
	if r, err := a.Set([]byte("big"), big); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("SET 900 KB after auth: %s", r.Status())
	}
	// So is a connection on the default bucket, which needs no auth.
	d := startProxy(t, testConfig{})
	c := dial(t, d.Addr)
	if r, err := c.Set([]byte("big"), big); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("SET 900 KB on the default bucket: %s", r.Status())
	}
}

// TestPreAuthOutputBounded: a connection that has not authenticated
// cannot make the proxy hold its answers: pipelining 2,000 STATs (each
// answer is several times its request) without reading gets it closed,
// while the same before authentication in small doses, and any amount
// after it, is served.
func TestPreAuthOutputBounded(t *testing.T) {
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tenantTail(t)})
	stats := func(n int) []byte {
		var b []byte
		for i := range n {
			b = mc.AppendFrame(b, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpStat, Opaque: uint32(i)}, nil, nil, nil, nil)
		}
		return b
	}
	conn, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.(*net.TCPConn).SetReadBuffer(4096)
	if _, err := conn.Write(stats(2000)); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, conn, 5*time.Second)

	// A few, read as they come: fine.
	c := dial(t, p.Addr)
	for range 3 {
		if _, err := c.Stats(""); err != nil {
			t.Fatalf("STAT before auth: %v", err)
		}
	}
	// After authentication the pre-authentication bounds are gone.
	a := login(t, p.Addr, "alice")
	a.WriteRaw(stats(2000))
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	for got := 0; got < 2000; {
		r, err := a.Read()
		if err != nil {
			t.Fatalf("after %d STAT answers: %v", got, err)
		}
		if r.KeyLen == 0 {
			got++
		}
	}
}

// TestAuthTimeout: a connection that has not authenticated within
// auth_timeout of the engine's (fake) clock is closed, exactly then: the
// loops' sweep at a nanosecond before leaves it open; an authenticated one
// is not closed, nor is one on the default bucket.
func TestAuthTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{proxy: "default_bucket = \"\"\nauth_timeout = \"200ms\"", tail: tenantTail(t)}, clock)
	a := login(t, p.Addr, "alice")
	idle, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	// One that talks but does not authenticate is closed just the same.
	chatty := dial(t, p.Addr)
	if r, err := chatty.Do(mcclient.Request{Opcode: mc.OpNoop}); status(t, r, err) != mc.StatusSuccess {
		t.Fatal("NOOP before auth")
	}
	eventually(t, time.Minute, "the proxy to open the three sessions", func() bool { return p.Connections() == 3 })
	clock.Advance(timeout - 1)
	tickLoops(t, p)
	if n := p.authTimeouts.Load(); n != 0 || p.Connections() != 3 {
		t.Fatalf("a nanosecond before auth_timeout: %d auth timeouts, %d connections open; want 0 and 3", n, p.Connections())
	}
	clock.Advance(1)
	tickLoops(t, p)
	if n := p.authTimeouts.Load(); n != 2 {
		t.Errorf("at auth_timeout: %d auth timeouts, want 2", n)
	}
	waitClosed(t, idle, 5*time.Second)
	waitClosed(t, chatty.Conn(), 5*time.Second)
	clock.Advance(10 * timeout)
	tickLoops(t, p)
	if r, err := a.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("authenticated connection after auth_timeout: %s", r.Status())
	}
	if n := p.authTimeouts.Load(); n != 2 {
		t.Errorf("auth timeouts = %d, want 2", n)
	}

	// Default bucket: nobody needs to authenticate, nobody is timed.
	dclock := throttle.NewFakeClock(0)
	d := startProxyClock(t, testConfig{proxy: `auth_timeout = "200ms"`}, dclock)
	c := dial(t, d.Addr)
	eventually(t, time.Minute, "the proxy to open the session", func() bool { return d.Connections() == 1 })
	dclock.Advance(10 * timeout)
	tickLoops(t, d)
	if r, err := c.Do(mcclient.Request{Opcode: mc.OpNoop}); status(t, r, err) != mc.StatusSuccess {
		t.Fatal("default-bucket connection closed by auth_timeout")
	}
}

// TestIdleTimeout: a connection silent for idle_timeout with nothing in
// flight is closed by the first sweep of the loops at least idle_timeout
// and a tick (its activity is stamped with the loop's coarse clock) after
// its last activity, on the engine's (fake) clock: a nanosecond before,
// it is open; one that keeps talking stays.
func TestIdleTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{proxy: `idle_timeout = "300ms"`}, clock)
	quiet, talker := dial(t, p.Addr), dial(t, p.Addr)
	if r, err := quiet.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal("SET")
	}
	last := clock.Now()
	talk := func() {
		t.Helper()
		if r, err := talker.Do(mcclient.Request{Opcode: mc.OpNoop}); status(t, r, err) != mc.StatusSuccess {
			t.Fatal("the talking connection was closed")
		}
	}
	for clock.Now()+100*time.Millisecond < last+timeout+tickInterval {
		clock.Advance(100 * time.Millisecond)
		tickLoops(t, p)
		talk()
	}
	clock.Advance(last + timeout + tickInterval - 1 - clock.Now())
	tickLoops(t, p)
	if n := p.idleClosed.Load(); n != 0 {
		t.Fatalf("a nanosecond before idle_timeout and a tick: %d idle closes, want 0", n)
	}
	clock.Advance(1)
	tickLoops(t, p)
	if n := p.idleClosed.Load(); n != 1 {
		t.Fatalf("at idle_timeout and a tick: %d idle closes, want 1", n)
	}
	waitClosed(t, quiet.Conn(), 5*time.Second)
	talk()
}

// TestUnauthenticatedShare: when max_connections is filled with idle
// connections that never authenticate, a real client still connects and
// authenticates, and the connections already authenticated are kept.
func TestUnauthenticatedShare(t *testing.T) {
	const maxConns = 20
	p := startProxy(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 20", tail: tenantTail(t)})
	bob := login(t, p.Addr, "bob")
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			_ = c.Close()
		}
	}()
	for range 2 * maxConns {
		c, err := net.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	share := unauthLimit(maxConns)
	eventually(t, time.Minute, "the proxy to take in every idle connection", func() bool {
		return p.unauthConns.Load()+int64(p.unauthEvicted.Load()+p.refused.Load()+p.refusedSource.Load()) == 2*maxConns
	})
	// Fewer when gnet's balancer, counting connections late during a burst
	// of accepts, gives one loop more of them than its share.
	if n := p.unauthConns.Load(); n > share || n == 0 {
		t.Fatalf("%d unauthenticated connections open, share %d", n, share)
	}
	a := login(t, p.Addr, "alice")
	if r, err := a.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("SET by the late client: %s", r.Status())
	}
	if r, err := bob.Do(mcclient.Request{Opcode: mc.OpNoop}); status(t, r, err) != mc.StatusSuccess {
		t.Fatal("an authenticated connection was closed")
	}
	if n := p.unauthConns.Load(); n > share {
		t.Fatalf("%d unauthenticated connections, share %d", n, share)
	}
	if n := p.Connections(); n > maxConns+1 { // +1: an evicted one may still be closing
		t.Fatalf("%d connections open, max_connections %d", n, maxConns)
	}
}

// TestUnsentBudget: clients that pipeline large GETs and never read their
// responses cannot make the proxy hold more than max_unsent_bytes between
// them; the connections holding the most are closed, and the proxy goes on
// serving.
func TestUnsentBudget(t *testing.T) {
	const budget = 4 << 20
	// A long upstream timeout: the deep pipelines of 1 MB responses take
	// a while under the race detector, and the timeout counts from when
	// each request was sent.
	p := startProxy(t, testConfig{proxy: "max_unsent_bytes = 4194304", upstream: `timeout = "20s"`,
		throttle: `capacity = "unlimited"`, loops: 2})
	c := dial(t, p.Addr)
	big := bytes.Repeat([]byte("x"), 1000*1000)
	if r, err := c.Set([]byte("big"), big); status(t, r, err) != mc.StatusSuccess {
		t.Fatal("SET")
	}
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if n := p.unsentBytes.Load(); n > peak.Load() {
				peak.Store(n)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Microsecond):
			}
		}
	}()
	// Four clients each ask for 10 MB and read nothing: over 20 MB held
	// without the budget (the per-connection cap is 64 MiB; the kernel's
	// socket buffers take up to 4 MB of each).
	for range 4 {
		r := dial(t, p.Addr)
		_ = r.Conn().(*net.TCPConn).SetReadBuffer(4096)
		for range 10 {
			r.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
		}
		if err := r.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Settled: every client connection is open on the proxy, every GET it
	// read is answered, and each client's connection is closed, paused for
	// its unread output, or read out.
	eventually(t, time.Minute, "the clients to be connected", func() bool { return p.Connections() == 5 || p.unsentShed.Load() > 0 })
	eventually(t, 30*time.Second, "every GET to be answered or dropped", func() bool {
		settled := p.inflight() == 0
		onLoop(t, p, func(lp *loop) {
			for s := range lp.sessions {
				if !s.quitting && !s.outPaused() && !s.drained() {
					settled = false
				}
			}
		})
		return settled && p.inflight() == 0
	})
	close(stop)
	<-sampled
	var held int
	onLoop(t, p, func(lp *loop) {
		lp.refreshUnsent()
		for s := range lp.sessions {
			if !s.quitting {
				held += s.unsent()
			}
		}
	})
	t.Logf("peak counted %d MB, held at the end %d MB, connections closed %d", peak.Load()>>20, held>>20, p.unsentShed.Load())
	if pk := peak.Load(); pk > 2*budget {
		t.Errorf("response bytes held peaked at %d, budget %d", pk, budget)
	}
	if held > budget {
		t.Errorf("response bytes held %d, budget %d", held, budget)
	}
	if p.unsentShed.Load() == 0 {
		t.Error("no connection was closed for the budget")
	}
	// The proxy still serves, large values included.
	if r, err := dial(t, p.Addr).Get([]byte("big")); err != nil || r.Status() != mc.StatusSuccess || len(r.Value) != len(big) {
		t.Fatalf("GET after the budget was enforced: %v %+v (counted %d)", err, r, p.unsentBytes.Load())
	}
}
