package proxy

import (
	"bytes"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A tenant pipelining large GETs does not put its responses ahead of a
// neighbour's in another bucket on the same loop: each bucket's lane has
// its own upstream connection (upstream.conns_per_bucket, the default),
// so memcached answers the neighbour's GET while the tenant's 32 reads of
// 1 MB are still coming, where on the shared connection the neighbour's
// answer comes only after all of them (memcached answers a connection in
// order). memcached is frozen while both send, so the tenant's reads are
// all ahead of the neighbour's GET when it resumes.
func TestBucketsDoNotQueueBehindEachOther(t *testing.T) {
	for _, tc := range []struct {
		name     string
		upstream string
		own      bool // each bucket its own connections
	}{
		{"per bucket", "", true},
		{"shared", "conns_per_bucket = false", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`, upstream: tc.upstream, loops: 1, tail: tenantTail(t)})
			attacker, neighbour := login(t, p.Addr, "alice"), login(t, p.Addr, "bob")
			for _, c := range []*mcclient.Client{attacker, neighbour} {
				if r, err := c.Set([]byte("small"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
					t.Fatal(err, r)
				}
			}
			if r, err := attacker.Set([]byte("big"), bytes.Repeat([]byte("x"), 1000*1000)); err != nil || r.Status() != mc.StatusSuccess {
				t.Fatal(err, r)
			}
			// Small reads first: the lane then lets maxLaneReads large
			// ones go at once (see TestPrimedLaneBounded).
			for range 60 {
				if r, err := attacker.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
					t.Fatal(err, r)
				}
			}
			if r, err := neighbour.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
				t.Fatal(err, r)
			}

			thaw := p.MC.Freeze(t)
			for range maxLaneReads {
				attacker.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
			}
			if err := attacker.Flush(); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the attacker's reads to be upstream", func() bool {
				out := 0
				onLoop(t, p, func(lp *loop) {
					if s := sessionOf(lp, attacker.Conn().LocalAddr()); s != nil {
						out = s.readsOut
					}
				})
				return out == maxLaneReads
			})
			neighbour.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("small")})
			if err := neighbour.Flush(); err != nil {
				t.Fatal(err)
			}
			var shared bool
			eventually(t, 30*time.Second, "the neighbour's read to be upstream", func() bool {
				out := 0
				onLoop(t, p, func(lp *loop) {
					a, n := sessionOf(lp, attacker.Conn().LocalAddr()), sessionOf(lp, neighbour.Conn().LocalAddr())
					if a == nil || n == nil {
						return
					}
					out = n.readsOut
					key := []byte("k")
					shared = pickFor(a, key) == pickFor(n, key)
				})
				return out == 1
			})
			if shared == tc.own {
				t.Fatalf("the two buckets share an upstream connection: %v; want %v", shared, !tc.own)
			}

			drained := make(chan error, 1)
			go func() {
				attacker.Timeout = 30 * time.Second
				for range maxLaneReads {
					if r, err := attacker.Read(); err != nil || r.Status() != mc.StatusSuccess {
						drained <- err
						return
					}
				}
				drained <- nil
			}()
			thaw()
			neighbour.Timeout = 30 * time.Second
			if r, err := neighbour.Read(); err != nil || r.Status() != mc.StatusSuccess {
				t.Fatalf("neighbour's GET: %v %v", err, r)
			}
			ahead := -1
			onLoop(t, p, func(lp *loop) {
				if s := sessionOf(lp, attacker.Conn().LocalAddr()); s != nil {
					ahead = s.readsOut
				}
			})
			if err := <-drained; err != nil {
				t.Fatalf("attacker's GETs: %v", err)
			}
			// On a shared connection every read sent before the
			// neighbour's is answered before it; on its own, the
			// neighbour does not wait for 32 MB to come through.
			if tc.own && ahead == 0 {
				t.Fatal("the neighbour's GET was answered only after all of the attacker's reads sent before it")
			}
			if !tc.own && ahead != 0 {
				t.Fatalf("shared connection: %d of the attacker's earlier reads unanswered when the neighbour's answer came; want 0", ahead)
			}
			t.Logf("attacker's reads still upstream when the neighbour's GET was answered: %d of %d", ahead, maxLaneReads)
		})
	}
}

// pickFor is the upstream connection a request of s for key goes to.
func pickFor(s *session, key []byte) any {
	if g := s.group(s.bkt); g != nil {
		return g.Pick(key)
	}
	return s.lp.pool.Pick(key)
}

// A bucket's upstream connections on a loop close once unused for
// groupIdle, so the connections to memcached follow the buckets in use,
// not every bucket ever used; its next request opens them again.
func TestIdleBucketConnectionsClose(t *testing.T) {
	// Restored by a cleanup registered before the proxy's: it runs after
	// the proxy's loops, which read groupIdle, have stopped (a deferred
	// restore raced with them).
	old := groupIdle
	t.Cleanup(func() { groupIdle = old })
	groupIdle = 200 * time.Millisecond
	// The health prober opens a connection of its own for each probe: one
	// at start (done once the version is known), then none for an hour.
	p := startProxy(t, testConfig{loops: 1, tail: tenantTail(t), health: time.Hour})
	eventually(t, time.Minute, "the first health probe", func() bool { return p.pool.Version() != nil })
	c := login(t, p.Addr, "alice")
	conns := func() (n int) {
		onLoop(t, p, func(lp *loop) {
			for b, l := range lp.lanes {
				if b.name == "alice" && l.group != nil {
					n = l.group.Conns()
				}
			}
		})
		return n
	}
	// memcached's count of connections ever accepted, asked on one
	// connection (memcachedStat's own would count too): the proof that a
	// request opened one (the live count may already be back to 0 when
	// more than groupIdle passes on a loaded machine)
	mcStats := dial(t, p.MC.Addr)
	opened := func() int { return statOn(t, mcStats, "total_connections") }
	before := opened()
	if r, err := c.Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	if n := opened() - before; n != 1 {
		t.Fatalf("alice's SET opened %d upstream connections, want 1", n)
	}
	eventually(t, 30*time.Second, "alice's idle connection to close", func() bool { return conns() == 0 })
	before = opened()
	if r, err := c.Get([]byte("k")); err != nil || r.Status() != mc.StatusSuccess || string(r.Value) != "v" {
		t.Fatalf("GET after the idle close: %v %v", err, r)
	}
	if n := opened() - before; n != 1 {
		t.Fatalf("alice's GET after the idle close opened %d upstream connections, want 1", n)
	}
}
