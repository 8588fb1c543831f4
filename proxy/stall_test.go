package proxy

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// startNonReader sets a 1,000,000-byte value "big", then sends n GETs of
// it from a client that does not read its responses, and waits until the
// proxy has dispatched all of them that it will (the session is paused,
// or has taken every request). With smallBuffers, the client's receive
// buffer and the proxy's send buffer are made small, so that what the
// kernel holds (not counted as held by the proxy) is negligible.
func startNonReader(t *testing.T, p *testProxy, n int, smallBuffers bool) *mcclient.Client {
	t.Helper()
	c := dial(t, p.Addr)
	if r, err := c.Set([]byte("big"), bytes.Repeat([]byte("x"), 1000*1000)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	if smallBuffers {
		_ = c.Conn().(*net.TCPConn).SetReadBuffer(4096)
		onLoop(t, p, func(lp *loop) {
			if s := sessionOf(lp, c.Conn().LocalAddr()); s != nil {
				_ = s.c.(gnet.Conn).SetWriteBuffer(4096)
			}
		})
	}
	for i := 0; i < n; i++ {
		c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the non-reader's requests to be dispatched or its session paused", func() bool {
		ready := false
		onLoop(t, p, func(lp *loop) {
			if s := sessionOf(lp, c.Conn().LocalAddr()); s != nil {
				ready = ready || s.outPaused() || s.pending() > 0 && s.drained()
			}
		})
		return ready
	})
	return c
}

// A client that pipelines large reads and never reads its responses shares
// its event loop's upstream connection with its neighbours: a neighbour's
// request is answered, and waits behind at most maxResponseBytes of the
// non-reader's responses, not behind all of them (400 MB here, which used to
// outlast upstream.timeout: the shared connection was failed and every
// tenant of the loop got Etmpfail). While the non-reader stays paused, its
// neighbours are served as usual.
func TestNonReaderDoesNotStallNeighbours(t *testing.T) {
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`, loops: 1})
	neighbour := dial(t, p.Addr)
	if r, err := neighbour.Set([]byte("small"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	hits0 := memcachedGetHits(t, p.MC.Addr)
	nonReader := startNonReader(t, p, 400, true)

	_ = neighbour.Conn().SetDeadline(time.Now().Add(60 * time.Second))
	start := time.Now()
	r, err := neighbour.Get([]byte("small"))
	if err != nil {
		t.Fatalf("neighbour's GET: %v", err)
	}
	waited := time.Since(start)
	hits := memcachedGetHits(t, p.MC.Addr) - hits0
	t.Logf("neighbour answered %s after %v, behind %d GETs of 1 MB", r.Status(), waited, hits-1)
	if r.Status() != mc.StatusSuccess || string(r.Value) != "v" {
		t.Fatalf("neighbour's GET: %s %q; want Success \"v\" (the shared upstream connection was failed?)", r.Status(), r.Value)
	}
	// Every GET memcached ran before the neighbour's was the non-reader's:
	// held by the proxy, or expected (the first at the largest size a read
	// can have, the others at their own), at most maxResponseBytes in all;
	// the kernel's socket buffers may hold a few hundred KB more.
	const respSize = mc.HeaderLen + 4 + 1000*1000
	if most := (maxResponseBytes+256<<10)/respSize + 1; hits > most {
		t.Fatalf("the neighbour's GET waited behind %d GETs of 1 MB from a client that does not read; want at most %d (maxResponseBytes)", hits-1, most-1)
	}

	for i := 0; i < 50; i++ {
		r, err := neighbour.Get([]byte("small"))
		if err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("neighbour's GET %d: %v %v", i, err, r)
		}
	}
	onLoop(t, p, func(lp *loop) {
		if s := sessionOf(lp, nonReader.Conn().LocalAddr()); s != nil {
			if !s.outPaused() || s.unsent() > maxResponseBytes {
				t.Errorf("non-reader: paused %v, holding %d bytes; want paused, at most %d", s.outPaused(), s.unsent(), maxResponseBytes)
			}
		}
	})
}

// A client that pipelines more large reads than the proxy will hold for it
// and reads nothing for a while (a pause, a slow consumer) is paused, not
// disconnected, and gets every response in order once it reads. (It used
// to be sent everything it asked for, and disconnected at 64 MiB held.)
func TestPausedNonReaderResumesWhenItReads(t *testing.T) {
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`, loops: 1})
	const n = 100
	c := startNonReader(t, p, n, false)
	eventually(t, 30*time.Second, "the proxy to have received what it asked memcached for", func() bool {
		idle := true
		onLoop(t, p, func(lp *loop) {
			idle = idle && lp.pool.Inflight() == 0
		})
		return idle
	})
	c.Timeout = 30 * time.Second
	var first uint32
	for i := 0; i < n; i++ {
		r, err := c.Read()
		if err != nil {
			t.Fatalf("response %d of %d: %v (disconnected?)", i+1, n, err)
		}
		if i == 0 {
			first = r.Opaque
		}
		if r.Status() != mc.StatusSuccess || len(r.Value) != 1000*1000 || r.Opaque != first+uint32(i) {
			t.Fatalf("response %d: %s, %d bytes, opaque %d (first %d)", i+1, r.Status(), len(r.Value), r.Opaque, first)
		}
	}
}

// A client that reads as fast as it can and pipelines GETs of 1 MB keeps
// at most maxReadsInFlight of them upstream, so a neighbour on the same
// loop (and the same upstream connection) waits behind a few of them, not
// behind everything the client asked for at once (up to 64 with only the
// bound on bytes held, and four such clients put 256 MB ahead of it).
func TestReaderBoundsItsNeighboursWait(t *testing.T) {
	p, neighbour := startWithBigValue(t)
	reader := dial(t, p.Addr)
	reader.Timeout = 30 * time.Second
	stop := make(chan struct{})
	done := make(chan struct{})
	var got atomic.Int64
	go func() {
		defer close(done)
		pipelineGets(t, reader, "big", 100, stop, func(time.Time) { got.Add(1) })
	}()
	defer func() { close(stop); <-done }()
	eventually(t, 30*time.Second, "the reader to be streaming", func() bool { return got.Load() >= 20 })
	// Sampled on the loop while the reader streams: its reads in flight
	// never expect more than maxReadsInFlight (one more may have been
	// dispatched as the first of a batch).
	most := 0
	for i := 0; i < 50; i++ {
		onLoop(t, p, func(lp *loop) {
			if s := sessionOf(lp, reader.Conn().LocalAddr()); s != nil {
				most = max(most, s.readsOut)
			}
		})
		time.Sleep(2 * time.Millisecond) // spread the samples, not a synchronisation
	}
	const respSize = mc.HeaderLen + 4 + 1000*1000
	if limit := maxReadsInFlight/respSize + 1; most > limit || most == 0 {
		t.Fatalf("the reader had up to %d GETs of 1 MB in flight; want 1 to %d", most, limit)
	}
	// And the neighbour is answered.
	if r, err := neighbour.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("neighbour's GET: %v %v", err, r)
	}
}

// TestTenantBoundsItsNeighboursWait: a tenant that opens several
// connections of pipelined 1 MB reads still has at most maxReadsInFlight
// of expected responses ahead of a neighbour on the loop's shared
// upstream connection, not that much per connection.
func TestTenantBoundsItsNeighboursWait(t *testing.T) {
	p, neighbour := startWithBigValue(t)
	const readers = 4
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var got [readers]atomic.Int64
	for i := 0; i < readers; i++ {
		reader := dial(t, p.Addr)
		reader.Timeout = 30 * time.Second
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipelineGets(t, reader, "big", 100, stop, func(time.Time) { got[i].Add(1) })
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	// Each of them, not one: they take turns at the tenant's share.
	counts := func() (c [readers]int64, all bool) {
		all = true
		for i := range got {
			c[i] = got[i].Load()
			all = all && c[i] >= 10
		}
		return c, all
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, all := counts()
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s the readers have %v answers; want 10 each", c)
		}
	}
	// Sampled on the loop while they stream: the tenant's reads in flight,
	// over all its connections, never expect more than maxReadsInFlight
	// (one more may have been dispatched as the first of a batch).
	most := 0
	for i := 0; i < 50; i++ {
		onLoop(t, p, func(lp *loop) {
			n := 0
			for s := range lp.sessions {
				n += s.readsOut
			}
			most = max(most, n)
		})
		time.Sleep(2 * time.Millisecond) // spread the samples, not a synchronisation
	}
	const respSize = mc.HeaderLen + 4 + 1000*1000
	if limit := maxReadsInFlight/respSize + 1; most > limit || most == 0 {
		t.Fatalf("%d connections of one tenant had up to %d GETs of 1 MB in flight; want 1 to %d", readers, most, limit)
	}
	if r, err := neighbour.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("neighbour's GET: %v %v", err, r)
	}
}

// A tenant that makes its reads look small (many small ones) and then
// asks for many large values at once: on upstream connections it shares
// with other buckets (conns_per_bucket = false) it has at most
// maxLaneReads of them in flight on the loop, since that, not its whole
// pipeline, is what memcached answers ahead of a neighbour's read there.
// On connections of its own (the default) nothing of its stands ahead of
// a neighbour, and the whole burst goes out: a count bound there would
// only cap clients that pipeline (TestPipelinedReadsNotCapped). memcached
// is frozen while the pipeline arrives, so nothing is answered and the
// count is exact.
func TestPrimedLaneBounded(t *testing.T) {
	for _, tc := range []struct {
		name, upstream string
		want           int // reads in flight
	}{
		{"shared connections", "conns_per_bucket = false", maxLaneReads},
		{"own connections", "", 48},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, neighbour := startWithBigValueUp(t, tc.upstream)
			attacker := dial(t, p.Addr)
			for range 60 {
				if r, err := attacker.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
					t.Fatal(err, r)
				}
			}
			thaw := p.MC.Freeze(t)
			const burst = 48
			for range burst {
				attacker.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
			}
			if err := attacker.Flush(); err != nil {
				t.Fatal(err)
			}
			var reads, readsOut int
			eventually(t, time.Minute, "the attacker's session to pause, or to send all", func() bool {
				stopped := false
				onLoop(t, p, func(lp *loop) {
					if s := sessionOf(lp, attacker.Conn().LocalAddr()); s != nil && s.bkt != nil {
						stopped = s.outPaused() || s.readsOut == burst
						readsOut, reads = s.readsOut, s.lane().reads
					}
				})
				return stopped
			})
			if readsOut != tc.want || reads != tc.want {
				t.Fatalf("%d GETs of 1 MB in flight (lane: %d) after small reads; want %d", readsOut, reads, tc.want)
			}
			thaw()
			attacker.Timeout = 30 * time.Second
			for i := range burst {
				if r, err := attacker.Read(); err != nil || r.Status() != mc.StatusSuccess || len(r.Value) != 1000*1000 {
					t.Fatalf("GET %d of the burst: %v %v", i, err, r)
				}
			}
			if r, err := neighbour.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
				t.Fatalf("neighbour's GET: %v %v", err, r)
			}
		})
	}
}

// A client pipelining small reads (a multi-get of 500 keys) has them all
// upstream at once on its bucket's own connections: the loop does not
// make it wait for round trips in batches of maxLaneReads (which held
// memcaslap's multi-gets to a fifth of memcached's rate).
func TestPipelinedReadsNotCapped(t *testing.T) {
	p, _ := startWithBigValue(t)
	c := dial(t, p.Addr)
	for range 10 {
		if r, err := c.Get([]byte("small")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatal(err, r)
		}
	}
	thaw := p.MC.Freeze(t)
	const keys = 500
	for range keys - 1 {
		c.Send(mcclient.Request{Opcode: mc.OpGetKQ, Key: []byte("small")})
	}
	c.Send(mcclient.Request{Opcode: mc.OpGetK, Key: []byte("small")})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the whole multi-get to be upstream", func() bool {
		out := 0
		onLoop(t, p, func(lp *loop) {
			if s := sessionOf(lp, c.Conn().LocalAddr()); s != nil {
				out = s.readsOut
			}
		})
		return out == keys
	})
	thaw()
	for i := range keys {
		if r, err := c.Read(); err != nil || r.Status() != mc.StatusSuccess || string(r.Value) != "v" {
			t.Fatalf("response %d of the multi-get: %v %v", i, err, r)
		}
	}
}

// A session that waited its turn in its lane, and then cannot go on
// because its client stopped reading, gives its turn up: it does not make
// every other session of its bucket on the loop wait for the next tick
// before each read.
func TestStalledWaiterGivesUpItsTurn(t *testing.T) {
	p, _ := startWithBigValue(t)
	stalled := dial(t, p.Addr)
	if r, err := stalled.Get([]byte("big")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	for range 40 {
		stalled.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
	}
	if err := stalled.Flush(); err != nil {
		t.Fatal(err)
	}
	var waiting int
	var laneWait bool
	eventually(t, 10*time.Second, "the stalled client's reads to settle", func() bool {
		settled := false
		onLoop(t, p, func(lp *loop) {
			if s := sessionOf(lp, stalled.Conn().LocalAddr()); s != nil && s.bkt != nil {
				settled = s.outPaused() && s.readsOut == 0
				waiting, laneWait = s.lane().waiting, s.laneWait
			}
		})
		return settled && waiting == 0
	})
	if laneWait {
		t.Fatal("the stalled session still holds its turn in the lane")
	}
}

// TestIdleSessionKeepsNoLargeBuffer: a client that read a large value and
// went idle does not pin the response buffer (on either listener).
func TestIdleSessionKeepsNoLargeBuffer(t *testing.T) {
	s := startTLSProxyTail(t, false, "", "[[bucket]]\nname = \"default\"\n")
	big := bytes.Repeat([]byte("x"), 900<<10)
	plain := dial(t, s.p.Addr)
	if r, err := plain.Set([]byte("big"), big); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	for _, c := range []*mcclient.Client{plain, s.client(t, nil)} {
		if r, err := c.Get([]byte("big")); err != nil || len(r.Value) != len(big) {
			t.Fatal(err, len(r.Value))
		}
		found := false
		onLoop(t, s.p, func(lp *loop) {
			if ss := sessionOf(lp, c.Conn().LocalAddr()); ss != nil {
				found = true
				if cap(ss.out) > 64<<10 {
					t.Errorf("an idle session keeps a %d-byte output buffer", cap(ss.out))
				}
			}
		})
		if !found {
			t.Fatal("session not found")
		}
	}
	// A large buffer kept while a command was in flight (a quiet SET
	// behind the large GET, say) goes at the flush that finds nothing in
	// flight, even with nothing to write.
	onLoop(t, s.p, func(lp *loop) {
		if ss := sessionOf(lp, plain.Conn().LocalAddr()); ss != nil && ss.pending() == 0 {
			ss.out = make([]byte, 0, 1<<20)
			ss.flush()
			if cap(ss.out) > 64<<10 {
				t.Errorf("a flush with nothing to write and nothing in flight keeps a %d-byte buffer", cap(ss.out))
			}
		}
	})
}
