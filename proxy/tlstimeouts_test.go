package proxy

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"
)

// The TLS front's timeouts, on the engine's (fake) clock: a handshake that
// has not completed in tlsHandshakeTimeout is ended then, and connections
// waiting for a source whose handshakes make no progress are closed at
// the first park sweep once tlsParkPatience has passed.

// TestTLSHandshakeTimeout: a connection that never says hello holds its
// handshake until exactly tlsHandshakeTimeout of the engine's clock after
// its accept (a nanosecond before, it is still in progress), is closed
// then, and counts as no failure of its source (it never spoke).
func TestTLSHandshakeTimeout(t *testing.T) {
	t.Parallel()
	s, clock := startTLSProxyClock(t)
	f := s.p.tls
	c, err := net.Dial("tcp", s.p.TLSAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	armedAt(t, clock, tlsHandshakeTimeout)
	clock.Advance(tlsHandshakeTimeout - 1)
	stillArmed(t, clock, tlsHandshakeTimeout)
	if n := handshakesInProgress(s.p.Server); n != 1 {
		t.Fatalf("a nanosecond before the handshake timeout: %d handshakes in progress, want 1", n)
	}
	clock.Advance(1)
	waitClosed(t, c, 5*time.Second)
	eventually(t, time.Minute, "the handshake to end", func() bool { return handshakesInProgress(s.p.Server) == 0 })
	f.mu.Lock()
	defer f.mu.Unlock()
	if o := f.outcomes["127.0.0.1"]; o != nil && o.failed != 0 {
		t.Errorf("a silent connection's timeout counted as %d failed handshakes of its source", o.failed)
	}
}

// TestTLSParkPatience: a source whose handshakes all stall (silent
// connections holding its tlsMaxHandshakesPerSource handshakes) keeps its
// waiting connections through the park sweep a nanosecond before
// tlsParkPatience has passed since they were parked, and has them closed
// by the next sweep; its handshakes in progress are left to their own
// timeout.
func TestTLSParkPatience(t *testing.T) {
	t.Parallel()
	const waiting = 8
	s, clock := startTLSProxyClock(t)
	f := s.p.tls
	conns := dialMany(t, s.p.TLSAddr(), tlsMaxHandshakesPerSource+waiting)
	eventually(t, time.Minute, "the silent connections to hold the source's handshakes and wait", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.sources["127.0.0.1"] == tlsMaxHandshakesPerSource && f.nParked == waiting
	})
	parked := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.nParked
	}
	var waiters []net.Conn // the client ends of the parked connections
	f.mu.Lock()
	for _, p := range f.parked["127.0.0.1"].conns {
		for _, c := range conns {
			if c.LocalAddr().String() == p.c.RemoteAddr().String() {
				waiters = append(waiters, c)
			}
		}
	}
	f.mu.Unlock()
	if len(waiters) != waiting {
		t.Fatalf("found %d of the %d parked connections", len(waiters), waiting)
	}
	clock.Advance(tlsParkPatience - 1)
	eventually(t, time.Minute, "the sweep to run", func() bool {
		return slices.Contains(clock.Armed(), tlsParkPatience-1+tlsParkSweep) || parked() == 0
	})
	if n := parked(); n != waiting {
		t.Fatalf("a nanosecond before tlsParkPatience: %d connections waiting, want %d", n, waiting)
	}
	clock.Advance(tlsParkSweep)
	for _, c := range waiters {
		waitClosed(t, c, 5*time.Second)
	}
	if n := parked(); n != 0 {
		t.Errorf("after tlsParkPatience: %d connections waiting, want 0", n)
	}
	if n := handshakesInProgress(s.p.Server); n != tlsMaxHandshakesPerSource {
		t.Errorf("%d handshakes in progress, want the %d silent ones (their timeout is not the sweep's)", n, tlsMaxHandshakesPerSource)
	}
}

// TestTLSParkedPoolWaitsWhileHandshakesStep: on a busy machine a pool's
// handshakes queue for the cpu slots, and none may end within
// tlsParkPatience; as long as they step (a turn of computing ended, bytes
// read from the client) the source is not stalled and its parked
// connections wait. Swept at each reading: one handshake stepping every
// sweep keeps them; a patience without a step closes them.
func TestTLSParkedPoolWaitsWhileHandshakesStep(t *testing.T) {
	t.Parallel()
	s, clock := startTLSProxyClock(t)
	f := s.p.tls
	server, client := net.Pipe()
	defer client.Close()
	e := &hsEntry{src: "pool"}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	defer e.cancel()
	f.mu.Lock()
	f.active["pool"] = append(f.active["pool"], e)
	f.parked["pool"] = &parkedSrc{conns: []parkedConn{{c: server, at: clock.Now()}}, progress: clock.Now()}
	f.nParked++
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		delete(f.active, "pool")
		f.mu.Unlock()
	}()
	parked := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		if ps := f.parked["pool"]; ps != nil {
			return len(ps.conns)
		}
		return 0
	}
	for range 3 * tlsParkPatience / tlsParkSweep { // three patiences, stepping
		clock.Advance(tlsParkSweep)
		e.stepped.Store(int64(clock.Now()))
		f.sweepParked()
		if parked() != 1 {
			t.Fatalf("at %v, a handshake of the source stepping at every sweep: its parked connection was closed", clock.Now())
		}
	}
	last := clock.Now()
	clock.Advance(tlsParkPatience - 1)
	f.sweepParked()
	if parked() != 1 {
		t.Fatalf("%v after the last step: the parked connection was closed before tlsParkPatience", clock.Now()-last)
	}
	clock.Advance(1)
	f.sweepParked()
	if parked() != 0 {
		t.Fatalf("tlsParkPatience after the last step: the parked connection still waits")
	}
}
