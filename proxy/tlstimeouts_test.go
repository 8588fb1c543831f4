package proxy

import (
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
	eventually(t, 5*time.Second, "the handshake to end", func() bool { return handshakesInProgress(s.p.Server) == 0 })
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
	eventually(t, 5*time.Second, "the silent connections to hold the source's handshakes and wait", func() bool {
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
	eventually(t, 5*time.Second, "the sweep to run", func() bool {
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
