package throttle

import (
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// newLeaseEngine returns an engine on a fake clock reading 1 s with the
// given burst (leases need one: their chunk is at most burst/8 of a rate).
func newLeaseEngine(t testing.TB, capacity Limit, burst time.Duration, mode FreePoolMode) (*Engine, *FakeClock) {
	t.Helper()
	clk := NewFakeClock(time.Second)
	e, err := New(Config{Capacity: capacity, Burst: burst, Clock: clk, FreePool: mode})
	if err != nil {
		t.Fatal(err)
	}
	return e, clk
}

type gaugeState struct{ res, hard, pool int64 }

func gauges(b *Bucket) gaugeState {
	return gaugeState{b.res.tat.Load(), b.hard.tat.Load(), b.e.pool.tat.Load()}
}

// A lease admits from its stock without writing the bucket's gauges or
// counters, draws a new chunk when the stock runs short, and once its
// stock is given back the gauges and counters are where the same
// admissions through the bucket leave them.
func TestLeaseStockAndRefund(t *testing.T) {
	for _, c := range []struct {
		name     string
		reserved Limit
		want     Domain
	}{{"reserved", 100000, Reserved}, {"free pool", 0, FreePool}} {
		t.Run(c.name, func(t *testing.T) {
			// Rates that divide 10^9: every unit costs a whole ns.
			e, _ := newLeaseEngine(t, 2000000, 20*ms, FreePoolFCFS)
			ref, _ := newLeaseEngine(t, 2000000, 20*ms, FreePoolFCFS)
			b := addBucket(t, e, "a", c.reserved, 1000000)
			rb := addBucket(t, ref, "a", c.reserved, 1000000)
			l := b.NewLease()
			chunk := l.chunk(c.want)
			if chunk < 10 {
				t.Fatalf("chunk %d: too small for the test", chunk)
			}
			var w Waiter
			g, wait := l.AdmitCost(&w, Blocking, Cost{Known: 1})
			if g.Domain != c.want || wait != 0 {
				t.Fatalf("first AdmitCost = %v, %v; want %v", g.Domain, wait, c.want)
			}
			if d, n := l.Stock(); d != c.want || n != chunk {
				t.Fatalf("stock after the draw = %v %d, want %v %d", d, n, c.want, chunk)
			}
			drawn := gauges(b)
			commands := b.commands.Load()
			// The stock covers chunk units: commands of 1, 2 and 3 units.
			used := int64(0)
			for i := int64(0); used+1+i%3 <= chunk; i++ {
				u := 1 + i%3
				g, _ := l.AdmitCost(&w, Blocking, Cost{Known: u})
				if g.Domain != c.want {
					t.Fatalf("admission %d from the stock: %v", i, g.Domain)
				}
				used += u
				if gauges(b) != drawn || b.commands.Load() != commands {
					t.Fatalf("admission %d from the stock wrote the bucket's gauges or counters", i)
				}
			}
			if _, n := l.Stock(); n != chunk-used {
				t.Fatalf("stock = %d, want %d", n, chunk-used)
			}
			usedTotal := used
			// One more than what is left: a new draw.
			l.AdmitCost(&w, Blocking, Cost{Known: chunk - used + 1})
			if gauges(b) == drawn {
				t.Fatal("a command larger than the stock did not draw")
			}
			// A write that cost less than billed gives back to the stock.
			g, _ = l.AdmitCost(&w, Blocking, Cost{Known: 3})
			_, before := l.Stock()
			l.Settle(g, 1)
			if _, n := l.Stock(); n != before+2 {
				t.Fatalf("stock after settling 3 as 1 = %d, want %d", n, before+2)
			}
			// And one that cost more takes from it.
			g, _ = l.AdmitCost(&w, Blocking, Cost{Known: 1})
			l.Settle(g, 4)
			if _, n := l.Stock(); n != before+2-1-3 {
				t.Fatalf("stock after settling 1 as 4 = %d, want %d", n, before+2-4)
			}
			// The same through the bucket.
			rb.AdmitCost(nil, Blocking, Cost{Known: 1})
			for i := int64(0); used > 0; i++ {
				u := 1 + i%3
				rb.AdmitCost(nil, Blocking, Cost{Known: u})
				used -= u
			}
			for _, step := range []struct{ known, units int64 }{{chunk - usedTotal + 1, 0}, {3, 1}, {1, 4}} {
				g, _ := rb.AdmitCost(nil, Blocking, Cost{Known: step.known})
				if step.units > 0 {
					rb.Settle(g, step.units)
				}
			}
			l.Return()
			if d, n := l.Stock(); d != Held || n != 0 || b.stocked.Load() != 0 {
				t.Fatalf("after Return: stock %v %d, stocked %d", d, n, b.stocked.Load())
			}
			if got, want := gauges(b), gauges(rb); got != want {
				t.Errorf("gauges after Return = %+v, through the bucket %+v", got, want)
			}
			if got, want := b.Stats().Units, rb.Stats().Units; got != want {
				t.Errorf("units counted = %d, through the bucket %d", got, want)
			}
			if got, want := b.Stats().Commands, rb.Stats().Commands; got != want {
				t.Errorf("commands counted = %d, through the bucket %d", got, want)
			}
		})
	}
}

// A stock nobody uses goes back after LeaseTTL (Expire), and at once when
// the limits change; the gauges are then as if it had never been drawn.
func TestLeaseExpiry(t *testing.T) {
	e, clk := newLeaseEngine(t, 1<<20, 20*ms, FreePoolFCFS)
	b := addBucket(t, e, "a", 0, 1<<19)
	l := b.NewLease()
	l.AdmitCost(nil, NonBlocking, Cost{Known: 1})
	_, chunk := l.Stock()
	if chunk == 0 {
		t.Fatal("no stock drawn")
	}
	t0 := b.hard.tat.Load()
	for _, dt := range []time.Duration{0, ms, ms / 2, ms / 4} {
		clk.Advance(dt)
		l.Expire()
		if _, n := l.Stock(); n != chunk {
			t.Fatalf("stock given back %v after the first Expire, before LeaseTTL", clk.Now())
		}
	}
	clk.Advance(ms / 4) // LeaseTTL since the Expire that saw it used
	l.Expire()
	if d, n := l.Stock(); d != Held || n != 0 {
		t.Fatalf("stock %v %d kept past LeaseTTL", d, n)
	}
	if got, want := b.hard.tat.Load(), t0-b.lim.Load().hrd.ns(chunk); got != want {
		t.Errorf("hard limit's tat after expiry = %d, want %d (one unit billed)", got, want)
	}

	// A change of limits: the stock goes back at the next Expire ...
	l.AdmitCost(nil, NonBlocking, Cost{Known: 1})
	if _, n := l.Stock(); n == 0 {
		t.Fatal("no stock drawn")
	}
	if err := b.SetLimits(0, 1<<18); err != nil {
		t.Fatal(err)
	}
	l.Expire()
	if _, n := l.Stock(); n != 0 || b.stocked.Load() != 0 {
		t.Fatalf("stock %d kept after SetLimits and Expire", n)
	}
	// ... or at the next use, and a new one is drawn under the new limits.
	l.AdmitCost(nil, NonBlocking, Cost{Known: 1})
	_, chunk = l.Stock()
	if err := e.SetCapacity(1 << 21); err != nil {
		t.Fatal(err)
	}
	before := b.hard.tat.Load()
	g, _ := l.AdmitCost(nil, NonBlocking, Cost{Known: 1})
	lim := b.lim.Load()
	if got, want := b.hard.tat.Load()-before, lim.hrd.ns(1+l.chunkPool)-lim.hrd.ns(chunk); got != want || g.Domain != FreePool {
		t.Errorf("after SetCapacity the next admission moved the hard limit by %d ns, want %d (old stock back, new chunk drawn)", got, want)
	}
	// A removed bucket: the stock goes back and the lease admits through
	// the bucket.
	if err := e.RemoveBucket("a"); err != nil {
		t.Fatal(err)
	}
	l.AdmitCost(nil, NonBlocking, Cost{Known: 1})
	if d, n := l.Stock(); d != Held || n != 0 || b.stocked.Load() != 0 {
		t.Fatalf("removed bucket: lease keeps %v %d", d, n)
	}
}

// A caller held on one lease is not starved by another lease's stock: the
// hold recalls it (the other lease gives it back at its next Expire or
// use), and the other lease's callers queue behind the held one.
func TestLeaseHeldCallerRecallsStock(t *testing.T) {
	for _, mode := range []Mode{Blocking, NonBlocking} {
		t.Run(fmt.Sprint("mode=", mode), func(t *testing.T) {
			// Hard limit 2^17 units/s: 7629 ns per unit; burst 2 ms.
			e, clk := newLeaseEngine(t, Unlimited, 2*ms, FreePoolFCFS)
			b := addBucket(t, e, "a", 0, 1<<17)
			cost := b.lim.Load().hrd.one
			l1, l2 := b.NewLease(), b.NewLease()
			// Fill the hard limit to the edge of its burst: room for
			// one draw (a unit and a chunk, rule 2).
			now := int64(clk.Now())
			b.hard.tat.Store(now + e.burst - b.lim.Load().hrd.ns(1+l1.chunkPool))
			// l1 may still admit (room), and draws its chunk.
			var w1, w2 Waiter
			if g, _ := l1.AdmitCost(&w1, Blocking, Cost{Known: 1}); g.Domain != FreePool {
				t.Fatalf("l1 held: %v", g.Domain)
			}
			_, chunk := l1.Stock()
			if chunk < 10 {
				t.Fatalf("chunk %d too small", chunk)
			}
			// l2's caller is held by l1's chunk.
			g, wait := l2.AdmitCost(&w2, mode, Cost{Known: 1})
			if g.Domain != Held || wait < time.Duration(chunk*cost) {
				t.Fatalf("l2: %v wait %v, want held for l1's chunk (%v)", g.Domain, wait, time.Duration(chunk*cost))
			}
			// l1's loop ticks: it gives its stock back.
			l1.Expire()
			if _, n := l1.Stock(); n != 0 {
				t.Fatalf("l1 keeps %d units after a caller of another lease was held", n)
			}
			// l2's caller runs once its own unit fits, not the chunk.
			clk.Advance(time.Duration(cost + 1))
			if g, wait := l2.AdmitCost(&w2, mode, Cost{Known: 1}); g.Domain != FreePool {
				t.Fatalf("l2 still held (%v) after l1 gave its stock back", wait)
			}
		})
	}
}

// The counts of reads in flight (what a raise of the ceiling waits for)
// never go negative and nothing of them leaks: many leases' reads,
// admitted, settled (some through the bucket), with Expire, limit changes
// and Return, leave them at 0; and every unit is counted and billed
// exactly once.
func TestLeaseReadFlightAndExactBills(t *testing.T) {
	// 10^9 units/s: one ns per unit, so the gauges' bills are exact.
	e, clk := newLeaseEngine(t, 2000000000, 20*ms, FreePoolFCFS)
	e.maxRead = 64
	b := addBucket(t, e, "a", 1000000000, 1000000000)
	const loops = 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int64
	var negative bool
	start := b.res.tat.Load()
	startHard := b.hard.tat.Load()
	for i := 0; i < loops; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewSource(int64(i)))
			l := b.NewLease()
			var w Waiter
			var inflight []Grant
			var sum int64
			defer func() {
				for p := range l.flight {
					if n := l.flight[p].Load(); n != 0 {
						t.Errorf("lease: %d reads of parity %d still counted in flight", n, p)
					}
				}
			}()
			for n := 0; n < 20000; n++ {
				c := Cost{Known: r.Int63n(3), Read: r.Intn(3) > 0}
				if g, wait := l.AdmitCost(&w, Blocking, c); g.Domain != Held {
					inflight = append(inflight, g)
				} else if wait <= 0 {
					t.Errorf("held with wait %v", wait)
				}
				for len(inflight) > 0 && (len(inflight) > 8 || r.Intn(2) == 0) {
					k := r.Intn(len(inflight))
					g := inflight[k]
					inflight[k] = inflight[len(inflight)-1]
					inflight = inflight[:len(inflight)-1]
					u := g.known + 1 + r.Int63n(5)
					if r.Intn(10) == 0 {
						b.Settle(g, u) // from another goroutine's point of view
					} else {
						l.Settle(g, u)
					}
					sum += u
				}
				switch r.Intn(50) {
				case 0:
					l.Expire()
				case 1:
					l.Return()
				}
				if l.flight[0].Load() < 0 || l.flight[1].Load() < 0 || b.rc.flight[0].Load() < 0 {
					negative = true
				}
			}
			for _, g := range inflight {
				l.Settle(g, g.known+1)
				sum += g.known + 1
			}
			l.Return()
			mu.Lock()
			total += sum
			mu.Unlock()
		}()
	}
	wg.Wait()
	_ = clk
	if negative {
		t.Error("a count of reads in flight went negative")
	}
	if !b.rc.TryDrain() || b.rc.flight[0].Load()+b.rc.flight[1].Load() != 0 {
		t.Errorf("reads still counted in flight after everything settled")
	}
	if n := b.stocked.Load(); n != 0 {
		t.Errorf("stocked = %d after Return", n)
	}
	if got := int64(b.Stats().Units); got != total {
		t.Errorf("units counted = %d, settled %d", got, total)
	}
	// Everything ran against the reservation (room for 2*10^7 units):
	// billed 1 ns/unit to it, 1 ns/unit to the hard limit.
	if got := b.res.tat.Load() - max(start, int64(clk.Now())); got != total {
		t.Errorf("reservation billed %d ns, want %d (one per unit)", got, total)
	}
	if got := b.hard.tat.Load() - max(startHard, int64(clk.Now())); got != total {
		t.Errorf("hard limit billed %d ns, want %d", got, total)
	}
}

// In fair mode a draw bills the bucket's virtual time as an admission of
// the chunk would, and the stock given back takes it back.
func TestLeaseFairBills(t *testing.T) {
	e, _ := newLeaseEngine(t, 1<<20, 20*ms, FreePoolFair)
	b := addBucket(t, e, "a", 0, Unlimited)
	addBucket(t, e, "b", 0, Unlimited)
	vt0 := b.vt.Load()
	l := b.NewLease()
	l.AdmitCost(nil, Blocking, Cost{Known: 1})
	_, chunk := l.Stock()
	if chunk == 0 {
		t.Fatal("no stock")
	}
	if got, want := b.vt.Load()-vt0, (1+chunk)*b.vInc.Load(); got != want {
		t.Errorf("vt moved by %d on the draw, want %d", got, want)
	}
	for i := 0; i < 5; i++ {
		l.AdmitCost(nil, Blocking, Cost{Known: 1})
	}
	l.Return()
	if got, want := b.vt.Load()-vt0, 6*b.vInc.Load(); got != want {
		t.Errorf("vt moved by %d after Return, want %d (6 units)", got, want)
	}
}

// simulateLeased is simulate with each bucket's connections spread over
// loops event loops, each loop admitting through its own Lease of each
// bucket, in its own goroutine: every step of the fake clock, the loops
// run their connections concurrently, then wait for each other. Each loop
// calls Expire on its leases every millisecond.
func simulateLeased(t testing.TB, cfg simConfig, buckets []*simBucket, loops int) map[string]float64 {
	t.Helper()
	clk := NewFakeClock(0)
	e, err := New(Config{Capacity: cfg.capacity, Burst: cfg.burst, Clock: clk, FreePool: cfg.freePool})
	if err != nil {
		t.Fatal(err)
	}
	type conn struct {
		sb     *simBucket
		lease  *Lease
		w      Waiter
		wake   time.Duration
		units  int64
		fast   int64 // admissions from the stock after warm-up
		demand float64
		back   float64
	}
	type loop struct {
		conns  []*conn
		leases []*Lease
		r      *rand.Rand
	}
	ls := make([]*loop, loops)
	for i := range ls {
		ls[i] = &loop{r: rand.New(rand.NewSource(cfg.seed + int64(i)))}
	}
	for _, sb := range buckets {
		sb.add(t, e)
		leases := make([]*Lease, loops)
		for i := range leases {
			leases[i] = sb.b.NewLease()
			ls[i].leases = append(ls[i].leases, leases[i])
		}
		for i := 0; i < sb.conns; i++ {
			ls[i%loops].conns = append(ls[i%loops].conns, &conn{sb: sb, lease: leases[i%loops], demand: sb.demand / float64(sb.conns)})
		}
	}
	end := cfg.warm + cfg.span
	var now time.Duration
	step := func(lp *loop) {
		if now%ms == 0 {
			for _, l := range lp.leases {
				l.Expire()
			}
		}
		lp.r.Shuffle(len(lp.conns), func(i, j int) { lp.conns[i], lp.conns[j] = lp.conns[j], lp.conns[i] })
		for _, c := range lp.conns {
			if c.demand > 0 {
				c.back = min(c.back+c.demand*cfg.step.Seconds(), c.demand)
			}
			for n := 0; c.wake <= now && n < 64; n++ {
				if c.demand > 0 && c.back < 1 {
					break
				}
				u := 1 + lp.r.Int63n(c.sb.maxUnits)
				_, before := c.lease.Stock()
				g, wait := c.lease.AdmitCost(&c.w, c.sb.mode, Cost{Known: 1})
				if _, after := c.lease.Stock(); after == before-1 && now >= cfg.warm {
					c.fast++ // from the stock
				}
				if g.Domain == Held {
					c.wake = now + min(wait, end)
					break
				}
				c.lease.Settle(g, u)
				c.back -= float64(u)
				if now >= cfg.warm {
					c.units += u
				}
			}
		}
	}
	start := make([]chan struct{}, loops)
	var done sync.WaitGroup
	for i := range ls {
		start[i] = make(chan struct{})
		ch := start[i]
		go func() {
			for range ch {
				step(ls[i])
				done.Done()
			}
		}()
	}
	// The loops run in a random order each step, one after the other (each
	// on its own goroutine): the first to run takes the room that built up
	// since the last step. One after the other, so that the order is the
	// seed's, not the scheduler's: run at once, a loaded machine (CI) let
	// the same loop go first step after step, and A got 28,748 of its
	// 30,000. (Concurrent use of one bucket's leases is
	// TestLeaseReadBudgetAndExactBills'.)
	order := rand.New(rand.NewSource(cfg.seed))
	for now = 0; now < end; now += cfg.step {
		clk.Set(now)
		order.Shuffle(len(start), func(i, j int) { start[i], start[j] = start[j], start[i] })
		for _, ch := range start {
			done.Add(1)
			ch <- struct{}{}
			done.Wait()
		}
	}
	for _, ch := range start {
		close(ch)
	}
	got := map[string]float64{}
	for _, lp := range ls {
		for _, c := range lp.conns {
			got[c.sb.name] += float64(c.units) / cfg.span.Seconds()
			got[c.sb.name+"/fast"] += float64(c.fast) / cfg.span.Seconds()
		}
		for _, l := range lp.leases {
			l.Return()
		}
	}
	for _, sb := range buckets {
		if n := sb.b.stocked.Load(); n != 0 {
			t.Errorf("%s: %d leases hold stock after Return", sb.name, n)
		}
	}
	return got
}

// The accuracy rules of DESIGN.md section 4 hold with 2 and 8 leases per
// bucket admitting concurrently: a bucket at its hard limit gets it
// within 2%, the node its capacity within 2%, reservations are honoured
// within 2% (the seed's examples, at 10 times their rates so that the
// leases' chunks are several units).
func TestLeaseAccuracy(t *testing.T) {
	// The loops take turns (simulateLeased hands each step from one to the
	// next), so the race detector has nothing to find.
	testmc.SkipUnderRace(t)
	cfg := defaultSim(100000)
	cfg.span = 4 * time.Second
	if testing.Short() {
		cfg.span = 2 * time.Second
	}
	for _, loops := range []int{2, 8} {
		t.Run(fmt.Sprint("loops=", loops), func(t *testing.T) {
			t.Run("hard-limit", func(t *testing.T) {
				got := simulateLeased(t, cfg, []*simBucket{
					{name: "A", hard: 30000, conns: 8, maxUnits: 4},
					{name: "B", hard: Unlimited, conns: 2},
				}, loops)
				within(t, "A", got["A"], 30000, 0.02)
				within(t, "A+B", got["A"]+got["B"], 100000, 0.02)
			})
			t.Run("reserved-hard-limit", func(t *testing.T) {
				got := simulateLeased(t, cfg, []*simBucket{
					{name: "A", reserved: 10000, hard: 30000, conns: 6, maxUnits: 5},
				}, loops)
				within(t, "A", got["A"], 30000, 0.02)
			})
			t.Run("node-capacity", func(t *testing.T) {
				got := simulateLeased(t, cfg, []*simBucket{
					{name: "A", hard: Unlimited, conns: 4, maxUnits: 4},
					{name: "B", reserved: 10000, hard: 60000, conns: 4, maxUnits: 2},
					{name: "C", hard: Unlimited, conns: 4, mode: NonBlocking},
				}, loops)
				within(t, "A+B+C", got["A"]+got["B"]+got["C"], 100000, 0.02)
				if got["B"] < 10000*0.98 {
					t.Errorf("B = %.0f below its reservation", got["B"])
				}
			})
			t.Run("example2", func(t *testing.T) {
				got := simulateLeased(t, cfg, []*simBucket{
					{name: "A", reserved: 20000, hard: 80000, conns: 8, maxUnits: 3},
					{name: "B", reserved: 20000, hard: 80000, conns: 8, maxUnits: 3},
				}, loops)
				within(t, "A+B", got["A"]+got["B"], 100000, 0.02)
				for _, n := range []string{"A", "B"} {
					if got[n] < 20000*0.98 {
						t.Errorf("%s = %.0f, below its reservation", n, got[n])
					}
				}
			})
			t.Run("example2-A-at-30000", func(t *testing.T) {
				got := simulateLeased(t, cfg, []*simBucket{
					{name: "A", reserved: 20000, hard: 80000, demand: 30000, conns: 4, maxUnits: 3},
					{name: "B", reserved: 20000, hard: 80000, conns: 8, maxUnits: 3},
				}, loops)
				within(t, "A", got["A"], 30000, 0.02)
				within(t, "B", got["B"], 70000, 0.02)
				// A, below its limits, runs mostly from its leases' stock.
				if got["A/fast"] < 0.5*got["A"]/2 {
					t.Errorf("A ran %.0f commands/s from its leases' stock, want most of its %.0f", got["A/fast"], got["A"]/2)
				}
				t.Logf("from the stock: A %.0f, B %.0f commands/s", got["A/fast"], got["B/fast"])
			})
			t.Run("fair-weights", func(t *testing.T) {
				c := cfg
				c.freePool = FreePoolFair
				got := simulateLeased(t, c, []*simBucket{
					{name: "A", hard: Unlimited, conns: 8, maxUnits: 2, weight: 1},
					{name: "B", hard: Unlimited, conns: 2, maxUnits: 2, weight: 3},
				}, loops)
				within(t, "A", got["A"], 25000, 0.05)
				within(t, "B", got["B"], 75000, 0.05)
			})
		})
	}
}

// A stock drawn while a gauge's rate had no cost ("unlimited") billed that
// gauge nothing: when the limits change to a finite rate, giving the stock
// back must not take it off the gauge's bill (which would put the bill in
// the past, where later bills vanish).
func TestLeaseStockFromUnlimitedOwesNothing(t *testing.T) {
	e, _ := newLeaseEngine(t, Unlimited, 20*ms, FreePoolFCFS)
	b := addBucket(t, e, "a", 0, Unlimited)
	l := b.NewLease()
	if g, _ := l.AdmitCost(nil, NonBlocking, Cost{Known: 1}); g.Domain != FreePool {
		t.Fatalf("admitted against %v", g.Domain)
	}
	if _, n := l.Stock(); n == 0 {
		t.Fatal("no stock drawn")
	}
	if err := b.SetLimits(0, 1000); err != nil {
		t.Fatal(err)
	}
	before := b.hard.tat.Load()
	l.Expire() // sees the new limits: gives the stock back
	if d, n := l.Stock(); d != Held || n != 0 {
		t.Fatalf("stock %v %d kept across a change of limits", d, n)
	}
	if got := b.hard.tat.Load(); got != before {
		t.Errorf("giving back a stock drawn under no hard limit moved the hard limit's bill by %v", time.Duration(got-before))
	}
}
