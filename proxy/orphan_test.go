package proxy

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A tenant that makes its reads look small, then asks for thousands of
// 1 MB values and never reads them: each of its connections ends up
// holding at most maxResponseBytes (closed at it, or paused below it),
// and once the answers read for closed ones pass maxResponseBytes,
// memcached stops sending them, instead of streaming gigabytes the proxy
// would read only to drop (the bucket's own upstream connections on the
// loop are closed: orphan.go). What memcached serves is then the
// connections' own 64 MiB each and a little more: 4110 values of 1 MB
// before, of 16000 asked (8 GB in 8 s from 16 such connections).
func TestAbandonedReadsStop(t *testing.T) {
	t.Parallel()
	p, _ := startWithBigValue(t)
	// Two connections show what sixteen do (each is bounded on its own);
	// each of them costs 64 to 128 MB through the proxy.
	const conns, burst = 2, 4000
	var atts []*mcclient.Client
	for range conns {
		c := dial(t, p.Addr)
		for range 100 {
			if r, err := c.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
				t.Fatal(err, r)
			}
		}
		atts = append(atts, c)
	}
	hits0 := memcachedGetHits(t, p.MC.Addr)
	for _, c := range atts {
		for range burst {
			c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Each connection ends up closed at the cap, or paused holding what
	// fits under it with nothing in flight; and nothing of theirs is left
	// upstream. A liveness wait (docs/tests.md, rule 3): some 170 MB went
	// through the proxy first with four connections, 3 s alone under
	// -race, and up to 76 s beside make test's other passes (one run of
	// the suite timed out at 60 s, its connections still reading: starved
	// of CPU, not stuck).
	eventually(t, 3*time.Minute, "the connections that do not read to be closed or paused with nothing in flight", func() bool {
		settled := true
		onLoop(t, p, func(lp *loop) {
			for s := range lp.sessions {
				for _, c := range atts {
					if s.remote == c.Conn().LocalAddr().String() && (s.readsOut > 0 || !s.outPaused()) {
						settled = false
					}
				}
			}
			for _, l := range lp.lanes {
				if l.group != nil && l.group.Busy() {
					settled = false
				}
			}
		})
		return settled
	})
	// Each connection held up to 64 MiB (67 values) before it was closed;
	// allow as much again in all for what was on its way.
	big := memcachedGetHits(t, p.MC.Addr) - hits0
	if most := conns * 2 * (maxResponseBytes / (1000 * 1000)); big > most {
		t.Errorf("memcached served %d values of 1 MB for connections that never read (%d asked); want at most %d", big, conns*burst, most)
	}
	t.Logf("memcached served %d values of 1 MB for %d connections that never read (%d asked)", big, conns, conns*burst)
}

// A client that goes away with a multi-get of small values in flight
// costs its bucket's other connections nothing: the answers nobody will
// read are few bytes, so the bucket's upstream connections stay, and a
// neighbour connection's GET in flight on them is answered, not failed.
// memcached is frozen while the client goes, so both are in flight.
func TestClosedClientCostsNeighboursNothing(t *testing.T) {
	t.Parallel()
	p, _ := startWithBigValue(t)
	gone, other := dial(t, p.Addr), dial(t, p.Addr)
	for _, c := range []*mcclient.Client{gone, other} {
		if r, err := c.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatal(err, r)
		}
	}
	thaw := p.MC.Freeze(t)
	const keys = 200
	for range keys {
		gone.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("small")})
	}
	other.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("small")})
	for _, c := range []*mcclient.Client{gone, other} {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	readsOut := func(c *mcclient.Client) (n int) {
		onLoop(t, p, func(lp *loop) {
			if s := sessionOf(lp, c.Conn().LocalAddr()); s != nil {
				n = s.readsOut
			}
		})
		return n
	}
	eventually(t, 30*time.Second, "both clients' reads to be upstream", func() bool {
		return readsOut(gone) == keys && readsOut(other) == 1
	})
	gone.Close()
	eventually(t, 30*time.Second, "the proxy to see the client go", func() bool {
		open := false
		onLoop(t, p, func(lp *loop) { open = sessionOf(lp, gone.Conn().LocalAddr()) != nil })
		return !open
	})
	thaw()
	if r, err := other.Read(); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("the other connection's GET, in flight when a client of its bucket went away: %v %v", err, r)
	}
}
