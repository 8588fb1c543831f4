package throttle

import (
	"flag"
	"fmt"
	"math"
	"math/rand"
	"sort"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// The fair sharing of the free pool (DESIGN.md section 13), on a fake
// clock: shares by weight, work conservation, no starvation, no banking,
// with WaterFill as the reference for what each bucket should get.

var fairSeeds = flag.Int("fair.seeds", 12, "random workloads TestFairSimulatedProperties runs")

func fairSim(capacity Limit) simConfig {
	cfg := defaultSim(capacity)
	cfg.freePool = FreePoolFair
	return cfg
}

// shareWithin checks got against want within tol (a fraction of want).
func shareWithin(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > want*tol+1 {
		t.Errorf("%s = %.0f units/s, want %.0f ±%.1f%%", what, got, want, tol*100)
	}
}

// The scenario: three buckets without reservation or hard limit
// saturate a free pool of 9000 with 16, 4 and 1 connections, each woken up
// to 2 ms late (as a busy proxy wakes held sessions). First come, first
// served favours the buckets with more connections (more of them are
// awake when room appears); fair mode gives each a third.
func TestFairSharesIgnoreConnections(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	buckets := func() []*simBucket {
		return []*simBucket{
			{name: "A", hard: Unlimited, conns: 16, maxUnits: 2},
			{name: "B", hard: Unlimited, conns: 4, maxUnits: 2},
			{name: "C", hard: Unlimited, conns: 1, maxUnits: 2},
		}
	}
	fcfsCfg := defaultSim(9000)
	fcfsCfg.late = 2 * ms
	fcfs := simulate(t, fcfsCfg, buckets())
	t.Logf("fcfs: A %.0f B %.0f C %.0f, Jain %.3f", fcfs["A"], fcfs["B"], fcfs["C"],
		JainIndex([]float64{fcfs["A"], fcfs["B"], fcfs["C"]}, nil))
	fairCfg := fairSim(9000)
	fairCfg.late = 2 * ms
	got := simulate(t, fairCfg, buckets())
	j := JainIndex([]float64{got["A"], got["B"], got["C"]}, nil)
	t.Logf("fair: A %.0f B %.0f C %.0f, Jain %.4f", got["A"], got["B"], got["C"], j)
	for _, n := range []string{"A", "B", "C"} {
		shareWithin(t, n, got[n], 3000, 0.02)
	}
	if j < 0.999 {
		t.Errorf("Jain's index %.4f, want >= 0.999", j)
	}
	if total := got["A"] + got["B"] + got["C"]; total < 9000*0.98 {
		t.Errorf("pool used %.0f of 9000", total)
	}
	if fcfs["C"] > 3000*0.9 {
		t.Errorf("fcfs gave the 1-connection bucket %.0f: the scenario no longer shows what fair mode is for", fcfs["C"])
	}
}

func TestFairSharesByWeight(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	got := simulate(t, fairSim(9000), []*simBucket{
		{name: "A", hard: Unlimited, conns: 1, weight: 1, maxUnits: 3},
		{name: "B", hard: Unlimited, conns: 8, weight: 2, maxUnits: 1},
		{name: "C", hard: Unlimited, conns: 3, weight: 3, maxUnits: 2},
	})
	t.Logf("A %.0f B %.0f C %.0f", got["A"], got["B"], got["C"])
	shareWithin(t, "A (weight 1)", got["A"], 1500, 0.02)
	shareWithin(t, "B (weight 2)", got["B"], 3000, 0.02)
	shareWithin(t, "C (weight 3)", got["C"], 4500, 0.02)
}

// Reservations stay outside the pool; hard limits cap a bucket's part of
// it, and what a capped or modest bucket leaves goes to the others.
func TestFairCapsAndModestDemand(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	got := simulate(t, fairSim(10000), []*simBucket{
		{name: "res", reserved: 2000, hard: Unlimited, conns: 4}, // 2000 + its part of 8000
		{name: "capped", hard: 1000, conns: 4},                   // 1000 of the pool
		{name: "modest", hard: Unlimited, demand: 500, conns: 1}, // 500
		{name: "heavy", hard: Unlimited, conns: 6, weight: 2},    // twice "res"'s part
		{name: "idle", reserved: 0, hard: Unlimited},             // nothing
	})
	// The pool is 8000: capped 1000 and modest 500 leave 6500 split 1:2.
	t.Logf("%v", got)
	shareWithin(t, "res", got["res"], 2000+6500.0/3, 0.02)
	shareWithin(t, "capped", got["capped"], 1000, 0.02)
	shareWithin(t, "modest", got["modest"], 500, 0.02)
	shareWithin(t, "heavy", got["heavy"], 6500.0*2/3, 0.02)
}

// The seed's examples 2 and 3 hold in fair mode as they do first come,
// first served.
func TestFairSeedExamples(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	t.Run("example 2, A idle", func(t *testing.T) {
		got := simulate(t, fairSim(10000), []*simBucket{
			{name: "A", reserved: 2000, hard: 8000},
			{name: "B", reserved: 2000, hard: 8000, conns: 8, maxUnits: 3},
		})
		within(t, "B", got["B"], 8000, 0.02)
	})
	t.Run("example 2, A at 3000", func(t *testing.T) {
		got := simulate(t, fairSim(10000), []*simBucket{
			{name: "A", reserved: 2000, hard: 8000, demand: 3000, conns: 4, maxUnits: 3},
			{name: "B", reserved: 2000, hard: 8000, conns: 8, maxUnits: 3},
		})
		within(t, "A", got["A"], 3000, 0.02)
		within(t, "B", got["B"], 7000, 0.02)
	})
	t.Run("example 2, both saturating", func(t *testing.T) {
		got := simulate(t, fairSim(10000), []*simBucket{
			{name: "A", reserved: 2000, hard: 8000, conns: 1, maxUnits: 3},
			{name: "B", reserved: 2000, hard: 8000, conns: 8, maxUnits: 3},
		})
		within(t, "A", got["A"], 5000, 0.02) // fair: the pool's 6000 split evenly
		within(t, "B", got["B"], 5000, 0.02)
	})
	t.Run("example 3, A and B idle", func(t *testing.T) {
		got := simulate(t, fairSim(10000), []*simBucket{
			{name: "A", reserved: 3000, hard: 6000},
			{name: "B", reserved: 2000, hard: 5000},
			{name: "C", reserved: 0, hard: Unlimited, conns: 8, maxUnits: 4},
		})
		within(t, "C", got["C"], 5000, 0.02)
	})
	t.Run("example 3, all saturating", func(t *testing.T) {
		got := simulate(t, fairSim(10000), []*simBucket{
			{name: "A", reserved: 3000, hard: 6000, conns: 4, maxUnits: 2},
			{name: "B", reserved: 2000, hard: 5000, conns: 4, maxUnits: 2},
			{name: "C", reserved: 0, hard: Unlimited, conns: 4, maxUnits: 2},
		})
		// The pool (5000) split three ways: A 3000+1667, B 2000+1667, C 1667.
		within(t, "A", got["A"], 3000+5000.0/3, 0.02)
		within(t, "B", got["B"], 2000+5000.0/3, 0.02)
		within(t, "C", got["C"], 5000.0/3, 0.02)
	})
}

// A bucket that becomes busy gets its share within 100 ms, and one that
// was idle banks nothing: from then on it gets its share, not more.
func TestFairNewcomerGetsShareAtOnce(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	cfg := fairSim(9000)
	cfg.window = 50 * time.Millisecond
	cfg.warm, cfg.span = time.Second, 4*time.Second
	late := 3 * time.Second
	bs := []*simBucket{
		{name: "A", hard: Unlimited, conns: 16},
		{name: "B", hard: Unlimited, conns: 4},
		{name: "C", hard: Unlimited, conns: 1, start: late},
	}
	simulate(t, cfg, bs)
	first := int((late + 100*time.Millisecond) / cfg.window) // the windows from 100 ms on
	for i := first; i < len(bs[2].windows); i++ {
		rate := float64(bs[2].windows[i]) / cfg.window.Seconds()
		if rate < 3000*0.95 || rate > 3000*1.05 {
			t.Errorf("C in window %d (%v after it became busy): %.0f units/s, want 3000", i, time.Duration(i)*cfg.window-late, rate)
		}
	}
	// Before C: A and B split the pool evenly.
	for i := int(2 * time.Second / cfg.window); i < int(late/cfg.window); i++ {
		a, b := float64(bs[0].windows[i]), float64(bs[1].windows[i])
		if math.Abs(a-b) > 0.05*(a+b)/2 {
			t.Errorf("window %d: A %.0f, B %.0f units", i, a, b)
		}
	}
}

// A random workload: many buckets with random weights, caps, reservations,
// connection counts, command sizes, and demands (saturating, modest, or
// starting late). Each bucket's measured rate must match the weighted
// max-min split WaterFill computes from the same demands, the pool must be
// used in full when demand exceeds it, and nobody is starved.
//
// make test runs 12 seeds (about 15 s under the race detector); run more
// with -fair.seeds, e.g. go test -run TestFairSimulatedProperties
// -fair.seeds 300 ./throttle (300 pass).
func TestFairSimulatedProperties(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	seeds := *fairSeeds
	if testing.Short() {
		seeds = min(seeds, 4)
	}
	for seed := int64(1); seed <= int64(seeds); seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) { fairProperties(t, seed) })
	}
}

func fairProperties(t *testing.T, seed int64) {
	r := rand.New(rand.NewSource(seed))
	capacity := Limit(5000 + r.Intn(20000))
	n := 3 + r.Intn(10)
	var bs []*simBucket
	var reservedSum Limit
	for i := 0; i < n; i++ {
		sb := &simBucket{name: fmt.Sprintf("b%d", i), hard: Unlimited, weight: 1 + r.Intn(8),
			conns: 1 + r.Intn(12), maxUnits: int64(1 + r.Intn(4))}
		if r.Intn(4) == 0 && reservedSum < capacity/3 {
			sb.reserved = Limit(r.Intn(int(capacity) / (2 * n)))
			reservedSum += sb.reserved
		}
		if r.Intn(3) == 0 {
			sb.hard = sb.reserved + Limit(r.Intn(int(capacity)/n+1))
		}
		if r.Intn(3) == 0 {
			sb.demand = float64(r.Intn(int(capacity) / n))
		}
		bs = append(bs, sb)
	}
	pool := float64(capacity - reservedSum)
	cfg := fairSim(capacity)
	cfg.seed = seed
	cfg.span = 5 * time.Second
	got := simulate(t, cfg, bs)
	// What each bucket should get: what it ran against its reservation
	// (rule 2 decides that, whatever the mode) plus its WaterFill share of
	// the pool, where a bucket wants from the pool what its demand leaves
	// beyond that (all it can get when it saturates) and may take at most
	// hard - reserved.
	claims := make([]Claim, n)
	res := make([]float64, n)
	for i, sb := range bs {
		res[i] = float64(sb.resUnits) / cfg.span.Seconds()
		c := Claim{Weight: sb.weight, Cap: math.Inf(1), Demand: math.Inf(1)}
		if sb.hard != Unlimited {
			c.Cap = float64(sb.hard - sb.reserved)
		}
		if sb.demand > 0 {
			c.Demand = max(sb.demand-res[i], 0)
		}
		claims[i] = c
	}
	WaterFill(pool, claims)
	var used, usable float64
	for i, sb := range bs {
		want := res[i] + claims[i].Share
		used += got[sb.name] - res[i]
		usable += claims[i].usable()
		// Commands run whole, and a bucket may run a lag bound ahead: a
		// tolerance of 3% plus a few units per second.
		if math.Abs(got[sb.name]-want) > 0.03*want+5 {
			t.Errorf("%s (weight %d, reserved %v, hard %v, demand %.0f, %d conns): %.0f units/s (%.0f against its reservation), want %.0f",
				sb.name, sb.weight, sb.reserved, sb.hard, sb.demand, sb.conns, got[sb.name], res[i], want)
		}
	}
	if need := min(pool, usable); used < 0.98*need {
		t.Errorf("pool used %.0f units/s of %.0f wanted (pool %.0f)", used, need, pool)
	}
}

// Held commands of different buckets are released in order of their
// virtual times: with the pool exhausted, buckets of weights 1, 2 and 3
// asking in random order are admitted 1:2:3 over every stretch of a few
// lag bounds, however often each asks.
func TestFairReleaseOrder(t *testing.T) {
	e, clk := newEngine(t, 1000, 10*ms)
	if err := e.SetFreePoolMode(FreePoolFair); err != nil {
		t.Fatal(err)
	}
	var bs [3]*Bucket
	var ws [3]Waiter
	for i := range bs {
		bs[i] = addBucket(t, e, fmt.Sprint("w", i+1), 0, Unlimited)
		if err := bs[i].SetWeight(i + 1); err != nil {
			t.Fatal(err)
		}
	}
	r := rand.New(rand.NewSource(7))
	var order []int
	for step := 0; step < 30000; step++ {
		clk.Advance(100 * time.Microsecond)
		// Bucket 0 asks ten times as often as the others.
		for _, i := range r.Perm(3) {
			tries := 1
			if i == 0 {
				tries = 10
			}
			for ; tries > 0; tries-- {
				if d, _ := bs[i].Admit(&ws[i], Blocking); d != Held {
					order = append(order, i)
				}
			}
		}
	}
	// 30000 steps of 100 µs are 3 s of a 1000 units/s pool: about 3000
	// admissions, the first 600 left out as warm-up.
	window := 600
	for start := 600; start+window <= len(order); start += window {
		var n [3]int
		for _, i := range order[start : start+window] {
			n[i]++
		}
		for i := range n {
			want := float64(window) * float64(i+1) / 6
			if math.Abs(float64(n[i])-want) > 0.05*want+4 {
				t.Errorf("admissions %d..%d: %v, want about 1:2:3", start, start+window, n)
				break
			}
		}
	}
	t.Logf("%d admissions", len(order))
	if len(order) < 2900 {
		t.Errorf("%d admissions in 3 s of a 1000 units/s pool", len(order))
	}
}

// p99 of how long held commands wait, per bucket, in both modes, side by
// side (logged; the proxy's BenchmarkFairFreePool measures them for real).
func TestFairHeldWaits(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	for _, mode := range []FreePoolMode{FreePoolFCFS, FreePoolFair} {
		cfg := defaultSim(9000)
		cfg.freePool = mode
		cfg.span = 5 * time.Second
		bs := []*simBucket{
			{name: "A", hard: Unlimited, conns: 16},
			{name: "B", hard: Unlimited, conns: 4},
			{name: "C", hard: Unlimited, conns: 1},
		}
		got := simulate(t, cfg, bs)
		line := fmt.Sprintf("%s:", mode)
		for _, sb := range bs {
			p := p99(sb.waits)
			line += fmt.Sprintf("  %s %.0f units/s, p99 held %v (%d held)", sb.name, got[sb.name], p, len(sb.waits))
		}
		t.Log(line)
	}
}

func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)*99)/100]
}

// A bucket that comes and goes banks nothing: busy 5 ms out of every 20
// while two others saturate the pool, it gets about its share while busy
// (a third of 9000), not the credit of its idle spells. (Raised only to V
// less the lag bound, it got 2.5 times its share.)
func TestFairOnOffBanksNothing(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	for _, c := range []struct{ on, period time.Duration }{{5 * ms, 20 * ms}, {10 * ms, 20 * ms}, {20 * ms, 100 * ms}} {
		cfg := fairSim(9000)
		cfg.span = 5 * time.Second
		bs := []*simBucket{
			{name: "A", hard: Unlimited, conns: 4, on: func(now time.Duration) bool { return now%c.period < c.on }},
			{name: "B", hard: Unlimited, conns: 4},
			{name: "C", hard: Unlimited, conns: 4},
		}
		got := simulate(t, cfg, bs)
		whileOn := float64(bs[0].units) / bs[0].onTime.Seconds()
		t.Logf("A on %v of every %v: %.0f units/s while on (a share is 3000); B %.0f, C %.0f", c.on, c.period, whileOn, got["B"], got["C"])
		if whileOn > 3000*1.4 {
			t.Errorf("A on %v of every %v got %.0f units/s while on, more than 1.4 times its share", c.on, c.period, whileOn)
		}
	}
}

// Fairness does not depend on held callers waking on time: woken up to
// 5 ms late (a loaded machine), buckets of weights 1, 2 and 3 with 16, 4
// and 1 connections still get 1/6, 2/6 and 3/6 of the pool, used in full.
func TestFairLateWakers(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	for _, late := range []time.Duration{2 * ms, 5 * ms, 10 * ms} {
		cfg := fairSim(6000)
		cfg.span = 5 * time.Second
		cfg.late = late
		got := simulate(t, cfg, []*simBucket{
			{name: "A", hard: Unlimited, conns: 16, weight: 1},
			{name: "B", hard: Unlimited, conns: 4, weight: 2},
			{name: "C", hard: Unlimited, conns: 1, weight: 3},
		})
		t.Logf("late up to %v: A %.0f B %.0f C %.0f", late, got["A"], got["B"], got["C"])
		shareWithin(t, fmt.Sprintf("late %v: A", late), got["A"], 1000, 0.05)
		shareWithin(t, fmt.Sprintf("late %v: B", late), got["B"], 2000, 0.05)
		shareWithin(t, fmt.Sprintf("late %v: C", late), got["C"], 3000, 0.05)
	}
}

// With burst_ms = 0 (no gauge banks anything) the pool is used as fully
// as first come, first served uses it: waiting for one's turn does not
// leave it idle. (With no burst, room nobody claims at once is lost in
// both modes; in this simulation, whose connections are woken in steps of
// 10 µs, fcfs uses about 93% of it.)
func TestFairNoBurst(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	used := func(mode FreePoolMode) float64 {
		cfg := defaultSim(9000)
		cfg.freePool = mode
		cfg.burst = -1 // Config.Burst < 0: no burst
		cfg.step = 10 * time.Microsecond
		cfg.span = 2 * time.Second
		got := simulate(t, cfg, []*simBucket{
			{name: "A", hard: Unlimited, conns: 16},
			{name: "B", hard: Unlimited, conns: 4},
			{name: "C", hard: Unlimited, conns: 1},
		})
		t.Logf("%v, no burst: A %.0f B %.0f C %.0f", mode, got["A"], got["B"], got["C"])
		return got["A"] + got["B"] + got["C"]
	}
	fcfs, fair := used(FreePoolFCFS), used(FreePoolFair)
	if fair < fcfs-0.02*9000 {
		t.Errorf("no burst: fair mode ran the pool at %.0f of 9000, first come first served at %.0f", fair, fcfs)
	}
}

// A bucket whose unthrottled connection ran far past its share (12000
// units/s for a second, against a pool of 9000) waits out the pool's debt
// like everybody, and is then not held back a second time for the same
// units: once the others run again, its throttled connections get their
// share alike.
func TestFairUnthrottledBurst(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	cfg := fairSim(9000)
	cfg.warm, cfg.span = 0, 5*time.Second
	cfg.window = 100 * ms
	bs := []*simBucket{
		{name: "X", hard: Unlimited, conns: 4, uDemand: 12000, uUntil: time.Second},
		{name: "B", hard: Unlimited, conns: 4},
		{name: "C", hard: Unlimited, conns: 4},
	}
	simulate(t, cfg, bs)
	x, b := bs[0], bs[1]
	resumed := -1
	for i := int(time.Second / cfg.window); i < len(b.windows); i++ {
		if b.windows[i] > 0 {
			resumed = i
			break
		}
	}
	if resumed < 0 {
		t.Fatal("B never ran again after the unthrottled burst")
	}
	t.Logf("the others ran again in window %d (%v)", resumed, time.Duration(resumed)*cfg.window)
	for i := resumed + 1; i < len(b.windows); i++ {
		var xi int64
		if i < len(x.windows) {
			xi = x.windows[i]
		}
		if xi < b.windows[i]*3/4 {
			t.Errorf("window %d (%v): X %d units, B %d: X is held back for its unthrottled units twice", i, time.Duration(i)*cfg.window, xi, b.windows[i])
		}
	}
}

// A bucket held for its turn is told how long until it may go (the time V
// takes to catch up at the pool's rate over the weights of the buckets
// that want more), not merely "after the next recomputation": a
// non-blocking client that obeys next_tick_us is refused a few times, not
// every 2 ms for as long as it is ahead.
func TestFairTurnWait(t *testing.T) {
	e, clk := newEngine(t, 1000, 10*ms)
	if err := e.SetFreePoolMode(FreePoolFair); err != nil {
		t.Fatal(err)
	}
	x := addBucket(t, e, "x", 0, Unlimited)
	y := addBucket(t, e, "y", 0, Unlimited)
	// x runs one 300-unit write while nobody else wants the pool: it is
	// then 300 units ahead; the pool's debt holds everybody for about
	// 290 ms, then y (saturating) needs 300 ms to catch up.
	if g, _ := x.AdmitCost(nil, NonBlocking, Cost{Known: 300}); g.Domain != FreePool {
		t.Fatalf("x's write: %v", g.Domain)
	}
	var wy Waiter
	start := clk.Now()
	xNext, refusals, admittedAt := time.Duration(0), 0, time.Duration(-1)
	for clk.Now() < start+3*time.Second && admittedAt < 0 {
		clk.Advance(100 * time.Microsecond)
		for {
			if d, _ := y.Admit(&wy, Blocking); d == Held {
				break
			}
		}
		if clk.Now() >= xNext {
			g, wait := x.AdmitCost(nil, NonBlocking, Cost{Known: 1})
			if g.Domain != Held {
				admittedAt = clk.Now() - start
				break
			}
			refusals++
			xNext = clk.Now() + wait
		}
	}
	t.Logf("x admitted at %v after %d refusals", admittedAt, refusals)
	if admittedAt < 0 || refusals > 20 {
		t.Errorf("x admitted at %v after %d refusals: its waits do not say when it may go", admittedAt, refusals)
	}
	if admittedAt >= 0 && (admittedAt < 550*ms || admittedAt > 700*ms) {
		t.Errorf("x admitted %v after its write, want about 590 ms (when y has caught up)", admittedAt)
	}
}

// The shares do not depend on the scale of the weights: 10000:5000:5000
// splits the pool as 2:1:1 does. (With the lag bound counted at weight 1,
// a bucket of weight 10000 could run 10000 times 4 ms of the pool ahead.)
func TestFairWeightScale(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	for _, scale := range []int{1, 1000, 5000} {
		got := simulate(t, fairSim(9000), []*simBucket{
			{name: "A", hard: Unlimited, conns: 1, weight: 2 * scale},
			{name: "B", hard: Unlimited, conns: 8, weight: scale},
			{name: "C", hard: Unlimited, conns: 4, weight: scale},
		})
		t.Logf("weights x%d: A %.0f B %.0f C %.0f", scale, got["A"], got["B"], got["C"])
		shareWithin(t, fmt.Sprint("A, weights x", scale), got["A"], 4500, 0.03)
		shareWithin(t, fmt.Sprint("B, weights x", scale), got["B"], 2250, 0.03)
		shareWithin(t, fmt.Sprint("C, weights x", scale), got["C"], 2250, 0.03)
	}
}

// A place in line whose caller never comes back (a Waiter dropped without
// Cancel, or a session that stopped at its client's unread output while
// holding it) holds the other buckets' turns for at most abandonAfter, not
// for good.
func TestFairLostPlace(t *testing.T) {
	e, clk := newEngine(t, 9000, 20*ms)
	if err := e.SetFreePoolMode(FreePoolFair); err != nil {
		t.Fatal(err)
	}
	a := addBucket(t, e, "a", 0, Unlimited)
	b := addBucket(t, e, "b", 0, Unlimited)
	s := addBucket(t, e, "s", 0, Unlimited)
	var wa, wb, ws Waiter
	lost := false
	perWindow := map[int]int{} // units of a and b per 100 ms
	for step := 0; step < 30000; step++ {
		clk.Advance(100 * time.Microsecond)
		now := clk.Now() - time.Second
		for _, c := range []struct {
			b *Bucket
			w *Waiter
		}{{a, &wa}, {b, &wb}} {
			for {
				if d, _ := c.b.Admit(c.w, Blocking); d == Held {
					break
				}
				perWindow[int(now/(100*ms))]++
			}
		}
		if !lost && now >= time.Second {
			// s saturates until it is held, then its caller is gone.
			for {
				if d, _ := s.Admit(&ws, Blocking); d == Held {
					lost = true
					break
				}
			}
		}
	}
	for i := 12; i < 30; i++ { // from 200 ms after s's caller was lost
		if n := perWindow[i]; n < 850 {
			t.Errorf("window %d (%v after the place was lost): a and b ran %d units, want the pool's 900", i, time.Duration(i-10)*100*ms, n)
		}
	}
}
