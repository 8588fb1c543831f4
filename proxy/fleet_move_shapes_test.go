package proxy

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// The outside review of issue 29's load that moves, through two real
// instances and a real Redis on fake clocks (fleetFake): shapes the
// author's TestFleetLoadThatMoves did not try. Each segment of the
// schedule gives each instance's closed-loop clients for seg.

// moveShape is one load shape: clients(k) is each instance's
// connections during the k-th segment of seg.
type moveShape struct {
	name    string
	seg     time.Duration
	clients func(k int) [2]int
}

// startMoveFleet starts two instances on fake clocks sharing bucket b
// (hard_limit 1500, 1 s periods), the default bucket of both, with no
// clients yet.
func startMoveFleet(t *testing.T) (*fleetTest, *fleetClients) {
	f := newFakeFleetTest(t, "[[bucket]]\nname = \"b\"\nhard_limit = 1500\n", "1s")
	for i := range 2 {
		f.start(i, `default_bucket = "b"`)
	}
	return f, &fleetClients{}
}

// runMoveShape runs a shape for span (10 s; under -race 4 s, see
// moveSpan) after a 2 s warm-up on its first segment, and returns the
// fleet's mean rate and its worst sliding 1 s window. It fails the test
// when the hard limits in force ever add up to more than 1500 or a client
// sees an error.
func runMoveShape(t *testing.T, sh moveShape, span time.Duration) (rate, worst float64) {
	const limit = 1500.0
	f, l := startMoveFleet(t)
	defer l.close(f)
	have := [2]int{}
	set := func(want [2]int) {
		for i := range 2 {
			if want[i] > have[i] {
				l.add(f, i, want[i]-have[i])
			} else if want[i] < have[i] {
				l.remove(f, i, have[i]-want[i])
			}
		}
		have = want
	}
	set(sh.clients(0))
	f.pass(2 * time.Second)
	worstOf := watchWindows(t, f, "b", int64(limit))
	u0 := sum(f.units("b"))
	for k := range int(span / sh.seg) {
		set(sh.clients(k))
		f.pass(sh.seg)
	}
	rate, worst = (sum(f.units("b"))-u0)/span.Seconds(), worstOf()
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d client errors", n)
	}
	return rate, worst
}

// moveSpan is how long the moving-load tests measure under -race: 4 s,
// where the race detector's time grows with every fake step; every
// sliding 1 s window and the clamp are checked there as over 10 s, and
// make test runs them again without -race over 10 s (PROXY_NORACE_TESTS).
const moveSpan = 4 * time.Second

// watchWindows makes each step of f check that the hard limits the
// instances enforce for bucket add up to at most limit, and track the
// largest sliding 1 s window of its units; the function returned gives it.
func watchWindows(t *testing.T, f *fleetTest, bucket string, limit int64) func() float64 {
	var ring [int(time.Second / fleetStep)]float64
	steps, worst := 0, 0.0
	f.fake.onStep = func() {
		if s := f.hardSum(bucket); s > limit {
			t.Fatalf("at %v the instances enforce hard limits adding up to %d, above the fleet's %d", f.fake.clock.Now(), s, limit)
		}
		now := sum(f.units(bucket))
		i := steps % len(ring)
		if steps >= len(ring) {
			worst = max(worst, now-ring[i])
		}
		ring[i] = now
		steps++
	}
	return func() float64 { return worst }
}

// TestFleetLoadShapes: a load moving every 0.25 s, and a 100 ms
// on/off load beside a steady one. The hard limits in force never add up
// to more than 1500; the figures are logged for the review, and a window
// above +10% (the bound docs/fleet.md states for a load moving every
// second) is reported.
func TestFleetLoadShapes(t *testing.T) {
	t.Parallel()
	span := testmc.UnderRace(10*time.Second, moveSpan)
	for _, sh := range []moveShape{
		{name: "moving every 0.25s", seg: 250 * time.Millisecond, clients: func(k int) [2]int {
			if k%2 == 0 {
				return [2]int{0, 8}
			}
			return [2]int{8, 0}
		}},
		{name: "100ms on-off beside a steady load", seg: 100 * time.Millisecond, clients: func(k int) [2]int {
			if k%2 == 0 {
				return [2]int{8, 8}
			}
			return [2]int{0, 8}
		}},
	} {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			rate, worst := runMoveShape(t, sh, span)
			t.Logf("%s: %.0f units/s (%.1f%% of 1500), worst 1 s window %.0f (%+.1f%%)", sh.name, rate, 100*rate/1500, worst, 100*(worst/1500-1))
			if worst > 1500*1.10 {
				t.Errorf("%s: %.0f units in a 1 s window, more than 1500 +10%%", sh.name, worst)
			}
		})
	}
}

// onOffAlone is a 100 ms on/off load (eight connections) on instance 0,
// instance 1 idle; shift 1 starts it off, so that the instances' periodic
// calls (one phase: they start together) fall on an "on" segment.
func onOffAlone(shift int) moveShape {
	return moveShape{name: "100ms on-off alone", seg: 100 * time.Millisecond, clients: func(k int) [2]int {
		if (k+shift)%2 == 0 {
			return [2]int{8, 0}
		}
		return [2]int{0, 0}
	}}
}

// TestFleetBurstyLoadBesideIdleInstance: a 100 ms on/off load on one instance
// while the other is idle could use half the limit (750 units/s). Found
// by the review: the load is off at the instances' periodic calls, so
// instance 0's periodic report releases its share and the idle instance 1,
// calling next, gets what nobody asks for (1496 of 1500). Instance 0's
// early calls are then cut to 2-4 units/s, and instance 1, not saturated,
// never calls early to give it back: the load gets 108 units/s (7.2% of
// the limit, 14% of what it could use; worst 1 s window 615) for the
// whole run. With the load on at the periodic calls (shift 1) it gets
// 468 units/s (62% of what it could use; worst window 780).
func TestFleetBurstyLoadBesideIdleInstance(t *testing.T) {
	t.Skip("issue 29 review: a 100 ms on/off load alone gets 108 units/s (7.2% of hard limit 1500, 14% of the 750 it could use): an idle instance takes the unasked share at its periodic call and never releases it early")
	t.Parallel()
	for shift := range 2 {
		rate, worst := runMoveShape(t, onOffAlone(shift), 10*time.Second)
		t.Logf("100ms on-off alone (shift %d): %.0f units/s (%.1f%% of 1500), worst 1 s window %.0f", shift, rate, 100*rate/1500, worst)
		if rate < 750*0.5 {
			t.Errorf("100ms on-off alone (shift %d): %.0f units/s, less than half of the 750 it could use", shift, rate)
		}
	}
}

// TestFleetFastMovesWithinTenPercent: the whole load (eight
// connections) moving between the two instances every 0.3, 0.6 or 0.7 s.
// Found by the review: a sliding 1 s window holds 1680 units (+12% of
// 1500) in each (0.3 s: 97.9% delivered, 0.6 s: 95.3%, 0.7 s: 97.4%);
// 0.35 and 0.4 s give 1635 (+9%), 0.15 s 1530 (+2%). The shares never add
// up to more than 1500: what passes is the engine's burst on a share that
// rose while its gauge was idle, twice in one window (docs/fleet.md says
// +20% is possible in theory below a second; the issue wants +10% at most).
func TestFleetFastMovesWithinTenPercent(t *testing.T) {
	t.Parallel()
	span := testmc.UnderRace(10*time.Second, moveSpan)
	for _, seg := range []time.Duration{300 * time.Millisecond, 600 * time.Millisecond, 700 * time.Millisecond} {
		t.Run(seg.String(), func(t *testing.T) {
			t.Parallel()
			rate, worst := runMoveShape(t, moveShape{name: "moving every " + seg.String(), seg: seg, clients: func(k int) [2]int {
				if k%2 == 0 {
					return [2]int{0, 8}
				}
				return [2]int{8, 0}
			}}, span)
			t.Logf("moving every %v: %.1f%% of 1500 delivered, worst 1 s window %.0f (%+.1f%%)", seg, 100*rate/1500, worst, 100*(worst/1500-1))
			if worst > 1500*1.10 {
				t.Errorf("moving every %v: %.0f units in a 1 s window, more than 1500 +10%%", seg, worst)
			}
		})
	}
}
