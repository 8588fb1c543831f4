package upstream

import (
	"testing"
	"time"
)

// Each group has its own connection per server: two groups, and the
// default one, never share a Conn for a key, each routes a key to the
// same server, and a group follows a reload (Tick) like the default
// group. Close retires the group's connections: they finish what is in
// flight and are closed once idle, without being reported as failed;
// later Picks fall back to the default.
func TestGroupsOwnConnections(t *testing.T) {
	const a, b, c = "10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"
	var downs []string
	p := newTestPool(t, PoolConfig{Servers: []string{a, b}}, PoolOptions{
		OnConnState: func(addr string, up bool, err error) { downs = append(downs, addr) },
	})
	lp := p.Loop(nil, nil)
	g1, g2 := lp.NewGroup(), lp.NewGroup()
	if g1.Conns() != 0 {
		t.Fatalf("new group holds %d connections before its first Pick, want 0", g1.Conns())
	}
	keys := testKeys(200)
	for _, k := range keys {
		c0, c1, c2 := lp.Pick(k), g1.Pick(k), g2.Pick(k)
		if c0 == c1 || c1 == c2 || c0 == c2 {
			t.Fatalf("key %s: groups share a connection", k)
		}
		if c0.Addr() != c1.Addr() || c1.Addr() != c2.Addr() {
			t.Fatalf("key %s: routed to %s, %s, %s; want one server", k, c0.Addr(), c1.Addr(), c2.Addr())
		}
	}
	if n := testing.AllocsPerRun(100, func() { g1.Pick(keys[3]) }); n != 0 {
		t.Errorf("Group.Pick: %v allocations, want 0", n)
	}

	// Reload: a removed, b kept, c added; every group remaps.
	g1a, g1b, g2a := g1.conns[0], g1.conns[1], g2.conns[0]
	g1a.push(entry{opaque: 1}) // in flight on the removed server
	if err := p.Update(PoolConfig{Servers: []string{b, c}}); err != nil {
		t.Fatal(err)
	}
	lp.Tick(time.Now())
	for _, g := range []*Group{&lp.def, g1, g2} {
		if len(g.conns) != 2 || g.conns[0].Addr() != b || g.conns[1].Addr() != c {
			t.Fatalf("after reload a group has %d connections, want to %s and %s", len(g.conns), b, c)
		}
	}
	if g1.conns[0] != g1b {
		t.Fatal("reload replaced a group's connection to a kept server")
	}
	if lp.Retiring() != 1 || g1a.closed || !g2a.closed || lp.Inflight() != 1 {
		t.Fatalf("after reload: %d retiring, busy one closed %v, idle one closed %v, %d in flight; want 1, false, true, 1", lp.Retiring(), g1a.closed, g2a.closed, lp.Inflight())
	}
	g1a.pop()
	lp.Tick(time.Now())
	if lp.Retiring() != 0 || !g1a.closed {
		t.Fatalf("removed connection idle: %d retiring, closed %v; want 0, true", lp.Retiring(), g1a.closed)
	}

	// Close: the group's connections retire, busy ones once idle.
	g2c := g2.conns[1]
	g2c.push(entry{opaque: 1})
	g2.Close()
	g2.Close()
	if g2.Conns() != 0 || lp.Retiring() != 2 || len(lp.groups) != 1 {
		t.Fatalf("after Close: group holds %d, %d retiring, %d groups; want 0, 2, 1", g2.Conns(), lp.Retiring(), len(lp.groups))
	}
	if got := g2.Pick(keys[0]); got != lp.Pick(keys[0]) {
		t.Fatal("Pick on a closed group does not fall back to the default connection")
	}
	lp.Tick(time.Now())
	if lp.Retiring() != 1 || g2c.closed {
		t.Fatalf("closed group with a request in flight: %d retiring, busy closed %v; want 1, false", lp.Retiring(), g2c.closed)
	}
	g2c.pop()
	lp.Tick(time.Now())
	if lp.Retiring() != 0 || !g2c.closed || g1.conns[1].closed {
		t.Fatalf("closed group idle: %d retiring, closed %v, other group's closed %v; want 0, true, false", lp.Retiring(), g2c.closed, g1.conns[1].closed)
	}
	if len(downs) != 0 {
		t.Fatalf("retired connections reported down (%v): closing them is no failure", downs)
	}
}
