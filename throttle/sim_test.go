package throttle

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

func within(t *testing.T, what string, got, want, tol float64) {
	t.Helper()
	if math.Abs(got-want) > want*tol {
		t.Errorf("%s = %.0f units/s, want %.0f ±%.0f%%", what, got, want, tol*100)
	} else {
		t.Logf("%s = %.0f units/s (want %.0f)", what, got, want)
	}
}

// Seed example 2: capacity 10000, A and B each reserve 2000 with a hard
// limit of 8000.
func TestSimExample2(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	ex2 := func(demandA float64, connsA int) map[string]float64 {
		return simulate(t, defaultSim(10000), []*simBucket{
			{name: "A", reserved: 2000, hard: 8000, demand: demandA, conns: connsA, maxUnits: 3},
			{name: "B", reserved: 2000, hard: 8000, conns: 8, maxUnits: 3},
		})
	}
	t.Run("A idle", func(t *testing.T) {
		got := ex2(0, 0)
		within(t, "B", got["B"], 8000, 0.02)
	})
	t.Run("A at 3000", func(t *testing.T) {
		got := ex2(3000, 4)
		within(t, "A", got["A"], 3000, 0.02)
		within(t, "B", got["B"], 7000, 0.02)
	})
	t.Run("both saturating", func(t *testing.T) {
		got := ex2(0, 8)
		within(t, "A+B", got["A"]+got["B"], 10000, 0.02)
		for _, n := range []string{"A", "B"} {
			if got[n] < 2000*0.98 {
				t.Errorf("%s = %.0f, below its reservation", n, got[n])
			}
		}
		t.Logf("A = %.0f, B = %.0f", got["A"], got["B"])
	})
}

// Seed example 3: A 3000/6000, B 2000/5000, C 0/unlimited; A and B idle, so
// C gets the free pool (5000) and no more: idle reservations are not lent.
func TestSimExample3(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	got := simulate(t, defaultSim(10000), []*simBucket{
		{name: "A", reserved: 3000, hard: 6000},
		{name: "B", reserved: 2000, hard: 5000},
		{name: "C", reserved: 0, hard: Unlimited, conns: 8, maxUnits: 4},
	})
	within(t, "C", got["C"], 5000, 0.02)

	// With all three saturating, everyone gets at least its reservation and
	// the node its capacity.
	got = simulate(t, defaultSim(10000), []*simBucket{
		{name: "A", reserved: 3000, hard: 6000, conns: 4, maxUnits: 2},
		{name: "B", reserved: 2000, hard: 5000, conns: 4, maxUnits: 2},
		{name: "C", reserved: 0, hard: Unlimited, conns: 4, maxUnits: 2},
	})
	within(t, "A+B+C", got["A"]+got["B"]+got["C"], 10000, 0.02)
	if got["A"] < 3000*0.98 || got["B"] < 2000*0.98 {
		t.Errorf("reservations not honoured: %v", got)
	}
	t.Logf("A = %.0f, B = %.0f, C = %.0f", got["A"], got["B"], got["C"])
}

// A bucket at its hard limit gets that limit, whatever the capacity, the
// command sizes and the callers' mode.
func TestSimHardLimit(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	for _, c := range []struct {
		capacity Limit
		reserved Limit
		mode     Mode
		maxUnits int64
	}{
		{10000, 0, Blocking, 1}, {10000, 1000, Blocking, 5}, {Unlimited, 0, Blocking, 3},
		{10000, 0, NonBlocking, 3},
	} {
		t.Run(fmt.Sprintf("cap=%v,res=%v,mode=%d,units=%d", c.capacity, c.reserved, c.mode, c.maxUnits), func(t *testing.T) {
			got := simulate(t, defaultSim(c.capacity), []*simBucket{
				{name: "A", reserved: c.reserved, hard: 3000, conns: 6, mode: c.mode, maxUnits: c.maxUnits},
			})
			within(t, "A", got["A"], 3000, 0.02)
		})
	}
}

// The node admits its capacity, not more, however many buckets push.
func TestSimNodeCapacity(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	got := simulate(t, defaultSim(10000), []*simBucket{
		{name: "A", hard: Unlimited, conns: 4, maxUnits: 4},
		{name: "B", hard: Unlimited, conns: 4, maxUnits: 1},
		{name: "C", reserved: 1000, hard: Unlimited, conns: 2, maxUnits: 8},
	})
	within(t, "A+B+C", got["A"]+got["B"]+got["C"], 10000, 0.02)
	if got["C"] < 1000*0.98 {
		t.Errorf("C = %.0f below its reservation", got["C"])
	}
}

// An unthrottled connection is never held, but its units slow down its
// bucket's other connections: together they stay at the hard limit. Over
// its hard limit it still runs, and the others wait out the debt.
func TestSimUnthrottledShare(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	got := simulate(t, defaultSim(10000), []*simBucket{
		{name: "A", hard: 4000, conns: 4, maxUnits: 2, uDemand: 1000},
	})
	within(t, "A unthrottled", got["A/unthrottled"], 1000, 0.02)
	within(t, "A throttled", got["A"], 3000, 0.02)

	got = simulate(t, defaultSim(10000), []*simBucket{
		{name: "A", hard: 4000, conns: 4, uDemand: 5000},
		{name: "B", hard: Unlimited, conns: 4},
	})
	within(t, "A unthrottled", got["A/unthrottled"], 5000, 0.02)
	within(t, "B", got["B"], 5000, 0.02) // the pool minus A's use
	if got["A"] > 10 {
		t.Errorf("A's throttled conns ran %.0f units/s over a hard limit used up", got["A"])
	}
}

// The property: over any window in which the limits do not change, a gauge
// of rate r passes at most r*window + r*burst + the largest charge. For
// random workloads (modes, command sizes, gaps) and random limit changes:
//   - each bucket's units charged to its reservation stay within its rate;
//   - all units charged to the free pool stay within its rate;
//   - each bucket's units stay within its hard limit, plus the
//     reservation's burst and largest charge (rule 2 does not look at the
//     hard limit).
func TestPropertyWindowBound(t *testing.T) {
	iters := 60
	if testing.Short() {
		iters = 10
	}
	for seed := int64(1); seed <= int64(iters); seed++ {
		propertyRun(t, seed)
	}
}

type event struct {
	at    int64
	units float64
}

func propertyRun(t *testing.T, seed int64) {
	r := rand.New(rand.NewSource(seed))
	clk := NewFakeClock(time.Duration(r.Int63n(int64(time.Hour))))
	burst := time.Duration(1 + r.Int63n(int64(50*ms)))
	randLimit := func(max int64) Limit {
		if r.Intn(8) == 0 {
			return Unlimited
		}
		return Limit(r.Int63n(max))
	}
	e, err := New(Config{Capacity: randLimit(20000), Burst: burst, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	const nb = 3
	var bs [nb]*Bucket
	var ws [nb][4]Waiter
	randLimits := func() (Limit, Limit) {
		h := randLimit(10000)
		res := Limit(0)
		if h != 0 && r.Intn(3) > 0 {
			if h == Unlimited {
				res = Limit(r.Int63n(5000))
			} else {
				res = Limit(r.Int63n(int64(h) + 1))
			}
		}
		return res, h
	}
	for i := range bs {
		res, h := randLimits()
		if bs[i], err = e.AddBucket(fmt.Sprint(i), res, h); err != nil {
			t.Fatal(err)
		}
	}
	var resEv, allEv [nb][]event
	var poolEv []event
	maxUnits := 1 + r.Int63n(50)
	check := func() {
		tau := float64(burst)
		pool := e.FreePool()
		if pool != Unlimited {
			checkBound(t, seed, "pool", poolEv, float64(pool), tau, float64(maxUnits))
		}
		for i, b := range bs {
			res, h := b.Limits()
			if res != Unlimited {
				checkBound(t, seed, "reservation "+b.Name(), resEv[i], float64(res), tau, float64(maxUnits))
			}
			if h != Unlimited {
				slack := float64(res)*tau/1e9 + float64(maxUnits)
				checkBound(t, seed, "hard "+b.Name(), allEv[i], float64(h), tau, float64(maxUnits)+slack)
			}
			resEv[i], allEv[i] = resEv[i][:0], allEv[i][:0]
		}
		poolEv = poolEv[:0]
	}
	for step := 0; step < 4000; step++ {
		switch x := r.Intn(1000); {
		case x < 3: // a limit change ends a period
			check()
			i := r.Intn(nb)
			res, h := randLimits()
			if err := bs[i].SetLimits(res, h); err != nil {
				t.Fatal(err)
			}
		case x < 5:
			check()
			if err := e.SetCapacity(randLimit(20000)); err != nil {
				t.Fatal(err)
			}
		case x < 500:
			clk.Advance(time.Duration(r.Int63n(int64(2 * ms))))
		}
		i := r.Intn(nb)
		mode := Blocking
		if r.Intn(4) == 0 {
			mode = NonBlocking
		}
		w := &ws[i][r.Intn(4)]
		d, _ := bs[i].Admit(w, mode)
		if d == Held {
			if r.Intn(10) == 0 {
				w.Cancel()
			}
			continue
		}
		u := 1 + r.Int63n(maxUnits)
		bs[i].Charge(d, u)
		ev := event{int64(clk.Now()), float64(u)}
		allEv[i] = append(allEv[i], ev)
		switch d {
		case Reserved:
			resEv[i] = append(resEv[i], ev)
		case FreePool:
			poolEv = append(poolEv, ev)
		}
	}
	check()
}

// checkBound verifies that for every window [ev[i].at, ev[j].at] the units
// of ev[i..j] are at most rate*(window + tau) + slack (rate in units/s, tau
// in ns), in O(n) with a running maximum from the right.
func checkBound(t *testing.T, seed int64, what string, ev []event, rate, tau, slack float64) {
	t.Helper()
	if len(ev) == 0 {
		return
	}
	perNs := rate / 1e9
	bound := perNs*tau + slack + 1e-6
	// prefix[i] = units of ev[:i]; window i..j has prefix[j+1]-prefix[i].
	prefix := 0.0
	for _, e := range ev {
		prefix += e.units
	}
	best := math.Inf(-1) // max over j >= i of prefix[j+1] - perNs*at[j]
	for i := len(ev) - 1; i >= 0; i-- {
		best = max(best, prefix-perNs*float64(ev[i].at))
		prefix -= ev[i].units
		if over := best - (prefix - perNs*float64(ev[i].at)); over > bound {
			t.Fatalf("seed %d: %s (rate %.0f, burst %.0f ns): a window from event %d of %d passes %.2f units over rate*window, allowed %.2f",
				seed, what, rate, tau, i, len(ev), over, bound)
		}
	}
}
