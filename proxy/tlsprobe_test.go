package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A TCP connection that closes without a word (a load balancer's health
// check, a blackbox probe, a port scan) or stays silent is no failed
// handshake of its source: a pool of TLS connections from the same
// address is served whole beside it (tlspark.go).

// tcpProbe connects to addr and closes at once, sending nothing.
func tcpProbe(t testing.TB, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Minute)
	if err != nil {
		t.Error(err)
		return
	}
	_ = c.Close()
}

// tlsPool opens n TLS connections from 127.0.0.1, all connected before any
// handshake starts (as a pool opened at once is), and has each complete its
// handshake and answer VERSION; it returns how many failed, and at most
// three of their errors.
func tlsPool(t *testing.T, s *tlsSetup, n int) (int, []error) {
	t.Helper()
	return tlsHandshakes(s, dialMany(t, s.p.TLSAddr(), n))
}

// tlsHandshakes is tlsPool on connections already open; it may run off
// the test's goroutine.
func tlsHandshakes(s *tlsSetup, conns []net.Conn) (int, []error) {
	var wg sync.WaitGroup
	n := len(conns)
	errs := make([]error, n)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc := tls.Client(c, &tls.Config{RootCAs: s.ca.Pool(), ServerName: "localhost"})
			_ = tc.SetDeadline(time.Now().Add(clientPatience)) // liveness: 64 handshakes at once under -race
			if err := tc.Handshake(); err != nil {
				errs[i] = fmt.Errorf("handshake: %w", err)
				return
			}
			if r, err := mcclient.New(tc).Do(mcclient.Request{Opcode: mc.OpVersion}); err != nil || r.Status() != mc.StatusSuccess {
				errs[i] = fmt.Errorf("VERSION: %v %+v", err, r)
			}
		}()
	}
	wg.Wait()
	failed, some := 0, []error(nil)
	for _, err := range errs {
		if err != nil {
			failed++
			if len(some) < 3 {
				some = append(some, err)
			}
		}
	}
	return failed, some
}

// checkPool runs a pool of 64 TLS connections from one address and fails
// the test unless all 64 are served. What it checks is that probes and
// silent connections cost the pool nothing, not how fast handshakes are:
// the proxy runs on a fake engine clock, which stands still unless the
// test moves it, so the front's patience with a source whose handshakes
// stall (tlsParkPatience) and the handshake timeout never run out while
// the machine is slow.
func checkPool(t *testing.T, s *tlsSetup, what string) {
	t.Helper()
	n := 2 * tlsMaxHandshakesPerSource
	if failed, errs := tlsPool(t, s, n); failed > 0 {
		t.Fatalf("%s: %d of %d TLS connections from one address failed (handshakes ended to make room: %d): %v", what, failed, n, s.p.tls.evicted.Load(), errs)
	}
}

// TestTLSPoolAfterTCPProbe: one TCP connect-and-close on the TLS port, its
// handshake over, then a pool of 64 TLS connections from the same address:
// all 64 are served. (Before the fix the probe counted as a failed
// handshake, and the 32 connections beyond the source's bound were closed.)
func TestTLSPoolAfterTCPProbe(t *testing.T) {
	t.Parallel()
	s, _ := startTLSProxyClock(t)
	tcpProbe(t, s.p.TLSAddr())
	eventually(t, time.Minute, "the probe's handshake to end", func() bool {
		s.p.tls.mu.Lock()
		defer s.p.tls.mu.Unlock()
		return len(s.p.tls.sources) == 0
	})
	checkPool(t, s, "after a TCP probe")
}

// TestTLSPoolBesideProbes: a TCP connect-and-close on the TLS port every
// 200 ms while a pool of 64 TLS connections from the same address starts:
// all 64 are served.
func TestTLSPoolBesideProbes(t *testing.T) {
	t.Parallel()
	s, _ := startTLSProxyClock(t)
	stop, done := make(chan struct{}), make(chan struct{})
	var probes atomic.Int32
	go func() {
		defer close(done)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			tcpProbe(t, s.p.TLSAddr())
			probes.Add(1)
			select {
			case <-tick.C:
			case <-stop:
				return
			}
		}
	}()
	defer func() { close(stop); <-done }()
	eventually(t, time.Minute, "a first probe", func() bool { return probes.Load() > 0 })
	for round := 0; round < 3; round++ {
		checkPool(t, s, fmt.Sprintf("round %d, probes every 200 ms", round))
	}
}

// TestTLSPoolBesideSilentConnections: 40 TCP connections from the same
// address that never send a ClientHello (32 holding the source's handshakes,
// 8 waiting) do not keep a pool of 64 TLS connections from that address
// out: the park sweep ends the silent handshakes once silent for
// tlsSilentGrace of the engine's (fake) clock, not at its sweep before,
// one for each waiting connection that has said hello, and all 64 are
// served.
func TestTLSPoolBesideSilentConnections(t *testing.T) {
	t.Parallel()
	s, clock := startTLSProxyClock(t)
	f := s.p.tls
	dialMany(t, s.p.TLSAddr(), 40)
	eventually(t, time.Minute, "the silent connections to hold the source's handshakes and wait", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.sources["127.0.0.1"] == tlsMaxHandshakesPerSource && f.nParked == 40-tlsMaxHandshakesPerSource
	})
	n := 2 * tlsMaxHandshakesPerSource
	type result struct {
		failed int
		errs   []error
	}
	pool := make(chan result, 1)
	conns := dialMany(t, s.p.TLSAddr(), n)
	go func() {
		failed, errs := tlsHandshakes(s, conns)
		pool <- result{failed, errs}
	}()
	eventually(t, 10*time.Second, "the pool to wait, hello sent", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		spoken := 0
		for _, p := range f.parked["127.0.0.1"].conns {
			if hasSpoken(p.c) {
				spoken++
			}
		}
		return spoken == n
	})
	// The sweep that runs a nanosecond before the silent handshakes have
	// been silent for tlsSilentGrace ends none of them.
	clock.Advance(tlsSilentGrace - 1)
	eventually(t, time.Minute, "the sweep to run", func() bool {
		return slices.Contains(clock.Armed(), tlsSilentGrace-1+tlsParkSweep)
	})
	if k := f.evicted.Load(); k != 0 {
		t.Fatalf("%d handshakes ended before they were silent for tlsSilentGrace", k)
	}
	clock.Advance(tlsParkSweep)
	r := <-pool
	if r.failed > 0 {
		t.Fatalf("%d of %d TLS connections from one address failed beside 40 silent ones: %v", r.failed, n, r.errs)
	}
	if k := f.evicted.Load(); k != tlsMaxHandshakesPerSource {
		t.Errorf("%d handshakes ended, want the %d silent ones", k, tlsMaxHandshakesPerSource)
	}
}

// TestTLSFailingSource: a source fails only by handshakes whose client
// spoke, and only when at least tlsFailMin of them failed and they
// outnumber its completions in the window; a failing source parks
// nothing, and a window later it is forgiven.
func TestTLSFailingSource(t *testing.T) {
	t.Parallel()
	s := startTLSProxy(t, false, "")
	f := s.p.tls
	now := s.p.Engine().Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	for range 10 {
		if f.recordLocked("probed", hsDropped, now) {
			t.Fatal("dropped handshakes (nothing sent) made their source failing")
		}
	}
	for i := range tlsFailMin - 1 {
		if f.recordLocked("bad", hsFailed, now) {
			t.Fatalf("failing after %d failures, want %d", i+1, tlsFailMin)
		}
	}
	if !f.recordLocked("bad", hsFailed, now) || !f.failingLocked("bad", now) {
		t.Fatalf("not failing after %d failures and no completion", tlsFailMin)
	}
	if f.failingLocked("bad", now+tlsFailMemory) {
		t.Fatal("still failing a window later")
	}
	for range 2 * tlsFailMin {
		f.recordLocked("pool", hsCompleted, now)
	}
	for range tlsFailMin {
		if f.recordLocked("pool", hsFailed, now) {
			t.Fatal("a source whose handshakes complete failing for fewer failures than completions")
		}
	}
	f.mu.Unlock()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if f.park(a, "bad", now) {
		t.Fatal("a failing source parked a connection")
	}
	f.mu.Lock()
}
