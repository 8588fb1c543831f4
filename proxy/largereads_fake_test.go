package proxy

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// fakeNeighbour is a client that sends one small GET at a time at readings
// of a fake clock the test chooses, and records how long (on that clock)
// each waited for its answer.
type fakeNeighbour struct {
	c        *mcclient.Client
	clock    *throttle.FakeClock
	sentAt   atomic.Int64 // the reading the outstanding GET was sent at
	out      atomic.Bool  // a GET is outstanding
	sent     atomic.Int64 // GETs sent
	received atomic.Int64
	mu       sync.Mutex
	waits    []time.Duration
}

// send sends a GET of key if none is outstanding.
func (n *fakeNeighbour) send(t testing.TB, key string) {
	if n.out.Load() {
		return
	}
	n.sentAt.Store(int64(n.clock.Now()))
	n.out.Store(true)
	n.sent.Add(1)
	n.c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte(key)})
	if err := n.c.Flush(); err != nil {
		t.Errorf("neighbour's GET: %v", err)
	}
}

// read records the answers until the connection closes.
func (n *fakeNeighbour) read(t testing.TB, stop <-chan struct{}) {
	for {
		r, err := n.c.Read()
		select {
		case <-stop:
			return
		default:
		}
		if err != nil || r.Status() != mc.StatusSuccess {
			t.Errorf("neighbour's GET: %v %v", err, r)
			return
		}
		n.mu.Lock()
		n.waits = append(n.waits, n.clock.Now()-time.Duration(n.sentAt.Load()))
		n.mu.Unlock()
		n.out.Store(false)
		n.received.Add(1)
	}
}

// largeReadsFake is largeReadsBesideNeighbours on the fake clock: one
// event loop; the clock stepped 2 ms (ten units of the capacity, a
// twenty-fifth of a large read) at a time, the proxy settling after each
// step with every answer read; the neighbours send their GET (when the last one is answered) every 10 ms of the clock,
// with the clock standing still, and their waits are counted on it. The
// node's rate and the free pool's (the big bucket's and spare's) are the
// engine's units over largeReadsWindow after 500 ms of warm-up.
//
// The clock first moves once the big bucket's eight sessions are open and
// held, and a reading settles only once the proxy has read the GETs the
// neighbours sent at it (taken: admitted, or held in the bucket's line).
// Before, the first settle (any number held) passed before those
// sessions had opened, and a settle before the loop had read a
// neighbour's GET, which then went at a later reading: with the GETs
// written 3 ms late (and the big bucket's pipelines 50 ms) the reserved
// neighbour waited up to 206 ms and the free pool ran at 3,685 to 3,930
// units/s.
func largeReadsFake(t testing.TB) largeReadsResult {
	const (
		step   = 2 * time.Millisecond
		warm   = 250 // steps: the burst spent, the pool saturated
		window = int(largeReadsWindow / step)
		pace   = 5 // steps between a neighbour's GETs: 10 ms
	)
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{
		throttle: fmt.Sprintf("capacity = %d\nburst_ms = 100", largeReadsCapacity),
		tail:     largeReadsTail(t),
		loops:    1,
	}, clock)
	seedLarge(t, p)
	node := p.Engine()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	neighbour := func(user, bucket string) *fakeNeighbour {
		c := login(t, p.Addr, user)
		if r, err := c.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte(bucket)}); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("select %s: %v %v", bucket, r, err)
		}
		if r, err := c.Set([]byte("small"), []byte("x")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("set small: %v %v", r, err)
		}
		n := &fakeNeighbour{c: c, clock: clock}
		wg.Add(1)
		go func() { defer wg.Done(); n.read(t, stop) }()
		go func() { <-stop; c.Close() }()
		return n
	}
	calm, spare := neighbour("alice", "calm"), neighbour("bob", "spare")
	bases := map[string]uint64{}
	for _, b := range []string{"default", "calm", "spare"} {
		bases[b] = node.Bucket(b).Stats().Commands
	}
	var big atomic.Int64
	for range 8 {
		c := dial(t, p.Addr) // patient: the fake clock's holds last as long as the test takes
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipelineGets(t, c, largeKey, 100, stop, func(time.Time) { big.Add(1) })
		}()
	}
	answered := func(b string) int64 { return int64(node.Bucket(b).Stats().Commands - bases[b]) }
	// taken: the proxy has read n's outstanding GET (admitted, or held
	// in its bucket's line, n's session being the bucket's only one).
	taken := func(n *fakeNeighbour, b string) bool {
		return !n.out.Load() || answered(b) == n.sent.Load() || node.Bucket(b).Stats().Waiting > 0
	}
	ready := func() bool {
		return big.Load() == answered("default") && calm.received.Load() == answered("calm") && spare.received.Load() == answered("spare") &&
			taken(calm, "calm") && taken(spare, "spare")
	}
	units := func(buckets ...string) (u uint64) {
		for _, b := range buckets {
			u += node.Bucket(b).Stats().Units
		}
		return u
	}
	all := []string{"default", "calm", "spare"}
	ft := &fakeTime{t: t, p: p, clock: clock}
	ft.settle(8, ready) // the big bucket's eight sessions opened, and held for its first burst
	var u0, pool0 uint64
	for i := range warm + window {
		if i == warm {
			u0, pool0 = units(all...), units("default", "spare")
			calm.mu.Lock()
			calm.waits = calm.waits[:0]
			calm.mu.Unlock()
			spare.mu.Lock()
			spare.waits = spare.waits[:0]
			spare.mu.Unlock()
		}
		if i%pace == 0 {
			calm.send(t, "small")
			spare.send(t, "small")
			ft.settle(anyHeld, ready)
		}
		ft.step(step, anyHeld, ready)
	}
	rate := float64(units(all...)-u0) / largeReadsWindow.Seconds()
	poolRate := float64(units("default", "spare")-pool0) / largeReadsWindow.Seconds()
	calm.mu.Lock()
	spare.mu.Lock()
	defer calm.mu.Unlock()
	defer spare.mu.Unlock()
	cw, sw := slices.Clone(calm.waits), slices.Clone(spare.waits)
	slices.Sort(cw)
	slices.Sort(sw)
	if len(cw) == 0 || len(sw) == 0 {
		t.Fatalf("the neighbours were answered %d and %d times in the window", len(cw), len(sw))
	}
	st := node.Bucket("calm").Stats()
	t.Logf("fake clock: node %.0f units/s (capacity %d), free pool %.0f; reserved neighbour: %d GETs, longest wait %v, held %d; "+
		"free-pool neighbour: %d GETs, waits p50 %v, p90 %v, longest %v; big bucket %d GETs",
		rate, largeReadsCapacity, poolRate, len(cw), cw[len(cw)-1], st.Held, len(sw), sw[len(sw)/2], sw[len(sw)*9/10], sw[len(sw)-1], big.Load())
	return largeReadsResult{rate: rate, spareP50: sw[len(sw)/2], spareLongest: sw[len(sw)-1], calmHeld: st.Held, calmLongest: cw[len(cw)-1], poolRate: poolRate}
}
