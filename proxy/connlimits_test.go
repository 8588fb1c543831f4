package proxy

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// A refused SASL re-authentication logs the connection out, and with no
// default bucket it is back under the pre-authentication bounds: a large
// frame gets Einval and the connection closes, as before it had
// authenticated.
func TestFailedReauthRestoresPreAuthBounds(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{proxy: "default_bucket = \"\"", tail: tenantTail(t)})
	c := login(t, p.Addr, "alice")
	if r, err := c.Set([]byte("big"), bytes.Repeat([]byte("x"), 100<<10)); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("100 KB SET when authenticated: %s", r.Status())
	}
	if err := c.AuthPlain("alice", "wrong"); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	r, err := c.Set([]byte("big"), bytes.Repeat([]byte("x"), 100<<10))
	if err != nil || r.Status() != mc.StatusEinval {
		t.Fatalf("100 KB SET after a refused re-authentication: %v %+v, want Einval", err, r)
	}
	if err := closedWithin(c.Conn(), clientPatience); err != nil {
		t.Fatalf("after Einval for a frame too large before authentication: %v", err)
	}
}

// One source may hold only a quarter of a loop's unauthenticated share
// (at least 4): a host opening connections it never authenticates pushes
// out its own oldest past that, never another host's, and a client from
// another host gets in and authenticates.
func TestUnauthenticatedPerSource(t *testing.T) {
	t.Parallel()
	const maxConns = 40 // share 36 on the one loop, a source 9
	p := startProxy(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 40", tail: tenantTail(t), loops: 1})
	limit := unauthSourceLimit(int(unauthLimit(maxConns)))
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 3 * limit {
		c, err := d.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	eventually(t, time.Minute, "the proxy to take in every connection from 127.0.0.2", func() bool {
		return p.unauthConns.Load()+int64(p.unauthEvicted.Load()+p.refusedSource.Load()) == int64(3*limit)
	})
	if n := p.unauthConns.Load(); n != int64(limit) {
		t.Fatalf("%d unauthenticated connections from one source, want its limit %d", n, limit)
	}
	a := login(t, p.Addr, "alice") // from 127.0.0.1
	if r, err := a.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("SET by a client from another host: %s", r.Status())
	}
	if n := p.unauthConns.Load(); n != int64(limit) {
		t.Fatalf("%d unauthenticated connections after another host's login, want %d (none of 127.0.0.2's pushed out)", n, limit)
	}
}

// Among one source's unauthenticated connections, those silent since they
// opened (for silentGrace of the engine's clock, a fake one: a nanosecond
// before, they rank as any other) are pushed out before one that has begun
// talking: a client behind the same address as a host flooding silent
// connections (NAT, a shared application host) keeps its connection while
// it authenticates, though it is the oldest.
func TestSilentConnectionsGoFirst(t *testing.T) {
	t.Parallel()
	p, clock, client, dialSrc, limit := startSameSource(t)
	talk(t, client, "on opening")
	var silent []net.Conn
	for range limit - 1 {
		silent = append(silent, dialSrc())
	}
	eventually(t, time.Minute, "the proxy to take in every connection from 127.0.0.2", func() bool {
		return p.unauthConns.Load() == int64(limit)
	})
	last := silent[len(silent)-1]
	clock.Advance(silentGrace - 1)
	tickLoops(t, p)
	if r := rankOf(t, p, last); r != rankOther {
		t.Fatalf("a nanosecond before silentGrace: eviction rank %d, want rankOther (not silent yet)", r)
	}
	clock.Advance(1)
	tickLoops(t, p)
	if r := rankOf(t, p, last); r != rankSilent {
		t.Fatalf("at silentGrace: eviction rank %d, want rankSilent", r)
	}
	for range limit - 1 { // each pushes out one of the silent ones
		dialSrc()
	}
	eventually(t, time.Minute, "the proxy to take in every connection from 127.0.0.2", func() bool {
		return p.unauthConns.Load()+int64(p.unauthEvicted.Load()) == int64(2*limit-1)
	})
	talk(t, client, fmt.Sprintf("after %d silent connections from the same address", 2*limit-2))
}

// A connection just opened is not ranked silent: a client whose first
// frame is on its way is not pushed out ahead of older connections of its
// address that have each sent a frame, silentGrace of the engine's clock
// before it opened.
func TestNewConnectionNotRankedSilent(t *testing.T) {
	t.Parallel()
	p, clock, first, dialSrc, limit := startSameSource(t)
	talkers := []net.Conn{first}
	for range limit - 2 {
		talkers = append(talkers, dialSrc())
	}
	for i, c := range talkers {
		talk(t, c, fmt.Sprint("from talker ", i))
	}
	clock.Advance(silentGrace)
	tickLoops(t, p)
	client := dialSrc() // the source is at its limit now; silent, but new
	eventually(t, time.Minute, "the proxy to take in the client", func() bool {
		return p.unauthConns.Load() == int64(limit)
	})
	dialSrc() // pushes out the oldest talker, not the client
	eventually(t, time.Minute, "one connection pushed out", func() bool { return p.unauthEvicted.Load() == 1 })
	talk(t, client, "after another connection from its address")
}

// startSameSource starts a proxy that requires authentication with one
// loop, on a fake engine clock, and returns it, its clock, a connection
// from 127.0.0.2, a function dialling more from there (closed with the
// test), and how many unauthenticated connections one source may hold.
func startSameSource(t *testing.T) (*testProxy, *throttle.FakeClock, net.Conn, func() net.Conn, int) {
	t.Helper()
	const maxConns = 40 // share 36 on the one loop, a source 9
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 40", tail: tenantTail(t), loops: 1}, clock)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	dialSrc := func() net.Conn {
		t.Helper()
		c, err := d.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	return p, clock, dialSrc(), dialSrc, unauthSourceLimit(int(unauthLimit(maxConns)))
}

// rankOf returns the eviction rank (evictRank) of c's session; it fails
// the test when the proxy has no session for c.
func rankOf(t *testing.T, p *testProxy, c net.Conn) int {
	t.Helper()
	rank := -1
	onLoop(t, p, func(lp *loop) {
		if s := sessionOf(lp, c.LocalAddr()); s != nil {
			rank = evictRank(s)
		}
	})
	if rank < 0 {
		t.Fatalf("no session for %v", c.LocalAddr())
	}
	return rank
}
