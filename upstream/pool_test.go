package upstream

import (
	"bytes"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

func testKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte("key-" + strconv.Itoa(i))
	}
	return keys
}

func newTestPool(t *testing.T, cfg PoolConfig, opts PoolOptions) *Pool {
	t.Helper()
	opts.Logger = zerolog.New(zerolog.NewTestWriter(t))
	p, err := NewPool(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// eventually is testmc.Eventually.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testmc.Eventually(t, d, what, cond)
}

func stateOf(p *Pool, addr string) ServerState {
	for _, st := range p.AppendStates(nil) {
		if st.Addr == addr {
			return st
		}
	}
	return ServerState{}
}

// Pick follows the ketama ring, sends an ejected server's keys (and only
// those) to the servers left, sends every key home when every server is
// ejected, and allocates nothing while doing so.
func TestPoolPickSkipsEjectedServers(t *testing.T) {
	servers := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}
	p := newTestPool(t, PoolConfig{Servers: servers}, PoolOptions{})
	lp := p.Loop(nil, nil)
	set := p.set.Load()
	keys := testKeys(1000)
	home := make([]*Conn, len(keys))
	onB := 0
	for i, k := range keys {
		home[i] = lp.Pick(k)
		if want := lp.def.conns[set.ring.Pick(k)]; home[i] != want {
			t.Fatalf("key %s: picked %s, ring says %s", k, home[i].Addr(), want.Addr())
		}
		if home[i].Addr() == servers[1] {
			onB++
		}
	}
	if onB < 200 || onB > 470 {
		t.Fatalf("%d of %d keys on the second of three servers: not spread", onB, len(keys))
	}

	set.health.ejected[1].Store(true)
	set.health.publish()
	for i, k := range keys {
		got := lp.Pick(k)
		switch {
		case home[i].Addr() == servers[1] && got.Addr() == servers[1]:
			t.Fatalf("key %s still picked on its ejected server", k)
		case home[i].Addr() != servers[1] && got != home[i]:
			t.Fatalf("key %s moved from %s to %s though its server is not ejected", k, home[i].Addr(), got.Addr())
		}
	}
	if n := testing.AllocsPerRun(100, func() { lp.Pick(keys[7]) }); n != 0 {
		t.Errorf("Pick with a server ejected: %v allocations, want 0", n)
	}

	for i := range servers {
		set.health.ejected[i].Store(true)
	}
	set.health.publish()
	for i, k := range keys {
		if got := lp.Pick(k); got != home[i] {
			t.Fatalf("every server ejected: key %s picked on %s, want its own %s", k, got.Addr(), home[i].Addr())
		}
	}

	for i := range servers {
		set.health.ejected[i].Store(false)
	}
	set.health.publish()
	for i, k := range keys {
		if got := lp.Pick(k); got != home[i] {
			t.Fatalf("servers back: key %s picked on %s, want %s", k, got.Addr(), home[i].Addr())
		}
	}
	if n := testing.AllocsPerRun(100, func() { lp.Pick(keys[7]) }); n != 0 {
		t.Errorf("Pick: %v allocations, want 0", n)
	}
}

// Update publishes a new server list that each loop adopts at its next
// Tick: the connection to a server that stays is kept, a new server gets a
// new connection, a removed server's connection finishes its requests and
// is closed once idle, and its metrics are forgotten. An identical list
// changes nothing; an invalid one is refused and changes nothing.
func TestPoolUpdateAdoptsAndRetiresServers(t *testing.T) {
	const a, b, c = "10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"
	var observed, removed []string
	p := newTestPool(t, PoolConfig{Servers: []string{a, b}}, PoolOptions{
		Observer: func(_ gnet.EventLoop, addr string) func(float64) { observed = append(observed, addr); return nil },
		OnRemove: func(addr string) { removed = append(removed, addr) },
	})
	lp := p.Loop(nil, nil)
	if !slices.Equal(observed, []string{a, b}) {
		t.Fatalf("observers asked for %v, want [%s %s]", observed, a, b)
	}
	connA, connB := lp.def.conns[0], lp.def.conns[1]
	connA.push(entry{opaque: 1}) // a request in flight on the server to be removed

	if err := p.Update(PoolConfig{Servers: []string{b, c}}); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, []string{a}) {
		t.Fatalf("removed %v, want [%s]", removed, a)
	}
	keys := testKeys(500)
	pickedA := false
	for _, k := range keys {
		pickedA = pickedA || lp.Pick(k) == connA
	}
	if !pickedA {
		t.Fatal("before its Tick the loop already routes with the new list")
	}

	lp.Tick(time.Now())
	if lp.def.conns[0] != connB || lp.def.conns[1].Addr() != c || len(lp.def.conns) != 2 {
		t.Fatalf("after Tick: connections to %s, %s; want the kept %s and a new %s", lp.def.conns[0].Addr(), lp.def.conns[1].Addr(), b, c)
	}
	if !slices.Equal(observed, []string{a, b, c}) {
		t.Fatalf("observers asked for %v, want [%s %s %s]", observed, a, b, c)
	}
	for _, k := range keys {
		if got := lp.Pick(k); got == connA {
			t.Fatalf("key %s picked on the removed server", k)
		}
	}
	if lp.Retiring() != 1 || connA.closed || lp.Inflight() != 1 {
		t.Fatalf("removed server with a request in flight: retiring %d, closed %v, in flight %d; want 1, false, 1", lp.Retiring(), connA.closed, lp.Inflight())
	}

	connA.pop() // answered
	lp.Tick(time.Now())
	if lp.Retiring() != 0 || !connA.closed || connB.closed {
		t.Fatalf("removed server idle: retiring %d, its connection closed %v, kept one closed %v; want 0, true, false", lp.Retiring(), connA.closed, connB.closed)
	}

	set := p.set.Load()
	if err := p.Update(PoolConfig{Servers: []string{b, c}}); err != nil || p.set.Load() != set {
		t.Fatalf("identical Update: err %v, list replaced %v; want nil, false", err, p.set.Load() != set)
	}
	if err := p.Update(PoolConfig{Servers: []string{b, b}}); err == nil || p.set.Load() != set {
		t.Fatalf("Update with a duplicate server: err %v, list replaced %v; want an error, false", err, p.set.Load() != set)
	}
	if err := p.Update(PoolConfig{Servers: []string{b, c}, Weights: []int{1, 3}}); err != nil || p.set.Load() == set {
		t.Fatalf("Update of the weights: err %v, list replaced %v; want nil, true", err, p.set.Load() != set)
	}
	lp.Tick(time.Now())
	if lp.def.conns[0] != connB || len(observed) != 3 {
		t.Fatalf("new weights, same servers: connections replaced")
	}
}

// The prober runs only while the Pool is started: Update before Start and
// after Close starts none, Update of a started Pool starts the new list's
// and stops the old list's, Close stops it.
func TestPoolProberLifecycle(t *testing.T) {
	const a, b = "127.0.0.1:1", "127.0.0.1:2"
	p := newTestPool(t, PoolConfig{Servers: []string{a}}, PoolOptions{ProbeInterval: 10 * time.Millisecond})
	stopped := func(h *health) bool {
		select {
		case <-h.stop:
			return true
		default:
			return false
		}
	}
	if err := p.Update(PoolConfig{Servers: []string{b}}); err != nil {
		t.Fatal(err)
	}
	if p.set.Load().health.started {
		t.Fatal("Update before Start started a prober")
	}
	p.Start()
	p.Start()
	first := p.set.Load().health
	if !first.started || stopped(first) {
		t.Fatal("Start did not start the prober")
	}
	if err := p.Update(PoolConfig{Servers: []string{a, b}}); err != nil {
		t.Fatal(err)
	}
	second := p.set.Load().health
	if !second.started || stopped(second) || !stopped(first) {
		t.Fatalf("Update of a started pool: new prober started %v, old stopped %v", second.started, stopped(first))
	}
	p.Close()
	if !stopped(second) {
		t.Fatal("Close left the prober running")
	}
	if err := p.Update(PoolConfig{Servers: []string{a}}); err != nil {
		t.Fatal(err)
	}
	if p.set.Load().health.started {
		t.Fatal("Update after Close started a prober")
	}
	p.Start()
	if p.set.Load().health.started {
		t.Fatal("Start after Close started a prober")
	}
}

// Against real memcached servers: the prober finds them up and reads
// their VERSION; a server that dies is reported down and, after
// EjectAfter failed probes, ejected, its keys going to the other server;
// once it is back and EjectRetry has passed, it is readmitted and its keys
// go home.
func TestPoolProbesEjectsAndReadmits(t *testing.T) {
	ma, mb := testmc.Start(t), testmc.Start(t)
	p := newTestPool(t, PoolConfig{Servers: []string{ma.Addr, mb.Addr}, EjectAfter: 2, EjectRetry: 300 * time.Millisecond},
		PoolOptions{Timeout: 10 * time.Second, ProbeInterval: 20 * time.Millisecond})
	// Timeout is a liveness bound: a probe of the live server must not time
	// out on a loaded machine (the state checks below read it at once); a
	// stopped server refuses at once.
	if p.AnyUp() || p.Version() != nil {
		t.Fatal("up before any probe")
	}
	p.Start()
	eventually(t, time.Minute, "both servers up", func() bool {
		return stateOf(p, ma.Addr).Up && stateOf(p, mb.Addr).Up
	})
	if !p.AnyUp() {
		t.Fatal("AnyUp false with both servers up")
	}
	direct, err := mcclient.Dial(ma.Addr)
	if err != nil {
		t.Fatal(err)
	}
	r, err := direct.Do(mcclient.Request{Opcode: binary.OpVersion})
	direct.Close()
	if err != nil || r.Status() != binary.StatusSuccess {
		t.Fatal(err, r)
	}
	if v := p.Version(); !bytes.Equal(v, r.Value) {
		t.Fatalf("Version %q, memcached says %q", v, r.Value)
	}

	lp := p.Loop(nil, nil)
	connA, connB := lp.def.conns[0], lp.def.conns[1]
	var onB [][]byte
	for _, k := range testKeys(200) {
		if lp.Pick(k) == connB {
			onB = append(onB, k)
		}
	}
	if len(onB) < 50 || len(onB) > 150 {
		t.Fatalf("%d of 200 keys on the second server: not spread", len(onB))
	}

	mb.Stop()
	// The prober records a state, then hands the loops their server list
	// at the end of its round: wait for both.
	allOn := func(keys [][]byte, c *Conn) bool {
		for _, k := range keys {
			if lp.Pick(k) != c {
				return false
			}
		}
		return true
	}
	eventually(t, time.Minute, "the dead server ejected", func() bool { return stateOf(p, mb.Addr).Ejected && allOn(onB, connA) })
	if st := stateOf(p, mb.Addr); st.Up || !p.AnyUp() || !stateOf(p, ma.Addr).Up || stateOf(p, ma.Addr).Ejected {
		t.Fatalf("one server dead: its state %+v, the other's %+v, AnyUp %v", st, stateOf(p, ma.Addr), p.AnyUp())
	}
	for _, k := range onB {
		if lp.Pick(k) != connA {
			t.Fatalf("key %s of the ejected server not picked on the other", k)
		}
	}

	mb.Restart(t)
	eventually(t, time.Minute, "the server readmitted", func() bool {
		st := stateOf(p, mb.Addr)
		return st.Up && !st.Ejected && allOn(onB, connB)
	})
	for _, k := range onB {
		if lp.Pick(k) != connB {
			t.Fatalf("key %s not back on its server", k)
		}
	}

	ma.Stop()
	mb.Stop()
	eventually(t, time.Minute, "both servers down", func() bool { return !p.AnyUp() })
	if v := p.Version(); v != nil {
		t.Fatalf("Version %q with no server answering, want nil", v)
	}
}

// BenchmarkLoopPoolPick: the hot path's routing over three servers, one
// of them ejected.
func BenchmarkLoopPoolPick(b *testing.B) {
	p, err := NewPool(PoolConfig{Servers: []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}}, PoolOptions{})
	if err != nil {
		b.Fatal(err)
	}
	lp := p.Loop(nil, nil)
	set := p.set.Load()
	set.health.ejected[1].Store(true)
	set.health.publish()
	keys := testKeys(64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		lp.Pick(keys[i%len(keys)])
	}
}

// A reload that changes only the ejection settings keeps what the prober
// knew: the servers still answer and VERSION is still known at once, not
// after the new prober's first probe.
func TestPoolUpdateKeepsHealthOfKeptServers(t *testing.T) {
	m := testmc.Start(t)
	p := newTestPool(t, PoolConfig{Servers: []string{m.Addr}, EjectAfter: 2, EjectRetry: time.Second},
		PoolOptions{Timeout: 500 * time.Millisecond, ProbeInterval: time.Hour})
	p.Start()
	eventually(t, time.Minute, "the server up", func() bool { return p.AnyUp() && p.Version() != nil })
	// The new prober's first probe runs at once: memcached is frozen so
	// that it cannot answer it before the check.
	thaw := m.Freeze(t)
	defer thaw()
	if err := p.Update(PoolConfig{Servers: []string{m.Addr}, EjectAfter: 5, EjectRetry: time.Second}); err != nil {
		t.Fatal(err)
	}
	if !p.AnyUp() || p.Version() == nil {
		t.Fatalf("after a reload of the ejection settings: up %v, version %q", p.AnyUp(), p.Version())
	}
}
