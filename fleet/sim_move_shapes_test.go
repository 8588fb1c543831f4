package fleet

// The outside review of issue 29's load that moves (move.go): shapes the
// author's simulations did not try. Each runs the real script in miniredis
// with the fluid instances of sim_test.go, on the fake clock.

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// reviewShape is one load shape: clients(step) gives each instance's
// saturating clients at a 10 ms step of the measured run, down(step)
// whether the store is unreachable then.
type reviewShape struct {
	name    string
	inst    int
	clients func(step int) []int
	down    func(step int) bool
	// reachable is the share of the limit the load could use at best
	// (an on/off load alone uses it half the time).
	reachable float64
	// phases, when set, gives each instance's sync phase, instead of
	// sim.add's spread of 7/23 of a period per instance.
	phases []time.Duration
}

// reviewResult is what a shape's run measured over its 10 s.
type reviewResult struct {
	rate      float64 // the fleet's mean units/s
	worst     float64 // the largest 1 s sliding window
	maxShares int64   // the largest sum of the hard shares in force
	calls     []int   // store calls per instance over the run
	maxWindow int     // most store calls by one instance in a sliding period
	maxPeriod int     // most store calls by one instance between two periodic ones
}

// runReviewShape warms up for 2 s with the shape's first step, then runs
// it for 10 s, measuring every 10 ms step.
func runReviewShape(t *testing.T, sh reviewShape, hard int64) reviewResult {
	t.Helper()
	s := newSim(t, time.Second, throttle.Unlimited, simBucket{name: "b", reserved: 0, hard: throttle.Limit(hard)})
	for i := 0; i < sh.inst; i++ {
		if sh.phases != nil {
			s.nextPhase = sh.phases[i]
		}
		s.add()
	}
	apply := func(n int) {
		for i, c := range sh.clients(n) {
			s.inst[i].clients["b"] = c
		}
		if sh.down != nil {
			s.lose.mu.Lock()
			s.lose.down = sh.down(n)
			s.lose.mu.Unlock()
		}
	}
	apply(0)
	s.run(2*time.Second, nil)
	var res reviewResult
	res.calls = make([]int, sh.inst)
	lastSeq := make([]int64, sh.inst)
	callAt := make([][]time.Duration, sh.inst)
	for i, in := range s.inst {
		lastSeq[i] = in.f.seq
	}
	const perWindow = int(time.Second / simStep)
	var ring [perWindow]float64
	u0 := s.units("b")
	n := 0
	s.run(10*time.Second, func() {
		_, now := delta(u0, s.units("b"))
		if n >= perWindow {
			res.worst = max(res.worst, now-ring[n%perWindow])
		} else {
			res.worst = max(res.worst, now)
		}
		ring[n%perWindow] = now
		var sum int64
		for i, in := range s.inst {
			if _, h := in.f.Grants().Limits("b", 0, throttle.Limit(hard)); h != throttle.Unlimited {
				sum += int64(h)
			}
			// A call moves seq on (a seed resets it: counted as one).
			if seq := in.f.seq; seq != lastSeq[i] {
				res.calls[i]++
				callAt[i] = append(callAt[i], s.clock.Now())
				lastSeq[i] = seq
			}
		}
		res.maxShares = max(res.maxShares, sum)
		n++
		apply(n)
	})
	_, total := delta(u0, s.units("b"))
	res.rate = total / 10
	for k, at := range callAt {
		phase := s.inst[k].phase
		per := map[time.Duration]int{}
		for _, c := range at {
			per[(c-phase)/time.Second]++ // the periodic call opens its period
		}
		for _, c := range per {
			res.maxPeriod = max(res.maxPeriod, c)
		}
		for i := range at {
			j := i
			for j < len(at) && at[j]-at[i] < time.Second {
				j++
			}
			res.maxWindow = max(res.maxWindow, j-i)
		}
	}
	return res
}

// every returns a clients function that gives all clients to one
// instance at a time, moving to the next every d, in the given order.
func every(d time.Duration, clients int, order ...int) func(int) []int {
	return func(n int) []int {
		k := int(time.Duration(n) * simStep / d)
		out := make([]int, len(order))
		out[order[k%len(order)]] = clients
		return out
	}
}

func reviewShapes() []reviewShape {
	onOff := func(n int) bool { return (n/10)%2 == 0 } // on 100 ms, off 100 ms
	return []reviewShape{
		{name: "three instances, every 1s", inst: 3, clients: every(time.Second, 8, 0, 1, 2), reachable: 1},
		{name: "three instances, every 0.5s", inst: 3, clients: every(500*time.Millisecond, 8, 0, 1, 2), reachable: 1},
		{name: "three instances, every 0.25s", inst: 3, clients: every(250*time.Millisecond, 8, 0, 1, 2), reachable: 1},
		{name: "two instances, every 0.25s", inst: 2, clients: every(250*time.Millisecond, 8, 0, 1), reachable: 1},
		{name: "two instances, every tick (50ms)", inst: 2, clients: every(50*time.Millisecond, 8, 0, 1), reachable: 1},
		{name: "bursty 100ms on/off alone", inst: 2, clients: func(n int) []int {
			if onOff(n) {
				return []int{8, 0}
			}
			return []int{0, 0}
		}, reachable: 0.5},
		{name: "bursty 100ms on/off beside a steady load", inst: 2, clients: func(n int) []int {
			if onOff(n) {
				return []int{8, 8}
			}
			return []int{0, 8}
		}, reachable: 1},
		{name: "uneven 7:1 flipping every 0.5s", inst: 2, clients: func(n int) []int {
			if (n/50)%2 == 0 {
				return []int{7, 1}
			}
			return []int{1, 7}
		}, reachable: 1},
		{name: "uneven 5/2/1 rotating every 0.5s", inst: 3, clients: func(n int) []int {
			k := n / 50
			out := make([]int, 3)
			for i, c := range []int{5, 2, 1} {
				out[(i+k)%3] = c
			}
			return out
		}, reachable: 1},
		{name: "every 0.5s, store down 2-8s", inst: 2, clients: every(500*time.Millisecond, 8, 0, 1),
			down: func(n int) bool { return n >= 200 && n < 800 }, reachable: 1},
		{name: "three instances every 0.5s, store down 2-8s", inst: 3, clients: every(500*time.Millisecond, 8, 0, 1, 2),
			down: func(n int) bool { return n >= 200 && n < 800 }, reachable: 1},
	}
}

// TestSimLoadShapes runs load shapes beyond the two of issue 29 (hard limit 1500, 1 s
// periods): the shares in force never add up to more than the limit
// (the fluid serves exactly its shares, so no window exceeds it either),
// and no instance calls the store more than 1+earlyPerPeriod times in an
// aligned period. The figures are logged for the review.
func TestSimLoadShapes(t *testing.T) {
	const hard = 1500
	for _, sh := range reviewShapes() {
		t.Run(sh.name, func(t *testing.T) {
			r := runReviewShape(t, sh, hard)
			t.Logf("%s: delivered %.1f%% of the limit (%.1f%% of what the load could use), worst 1 s window %.0f (%+.1f%%), max shares sum %d, calls %v over 10 s, at most %d in a period, %d in a sliding second",
				sh.name, 100*r.rate/hard, 100*r.rate/(hard*sh.reachable), r.worst, 100*(r.worst/hard-1), r.maxShares, r.calls, r.maxPeriod, r.maxWindow)
			if r.worst > hard*1.10 {
				t.Errorf("%s: a 1 s window held %.0f, over +10%% of %d", sh.name, r.worst, hard)
			}
			if r.maxShares > hard {
				t.Errorf("%s: the shares in force added up to %d", sh.name, r.maxShares)
			}
			if r.maxPeriod > 1+earlyPerPeriod {
				t.Errorf("%s: an instance called the store %d times in one period", sh.name, r.maxPeriod)
			}
			// Early calls use up their budget at the end of one period
			// and the start of the next: a sliding period sees up to
			// 2*earlyPerPeriod+1.
			if r.maxWindow > 2*earlyPerPeriod+1 {
				t.Errorf("%s: an instance called the store %d times in a sliding period", sh.name, r.maxWindow)
			}
		})
	}
}

// TestSimBurstyLoadBesideIdleInstance: a 100 ms on/off load on one instance
// beside an idle one; the load could use half the limit (750 units/s).
// Found by the review: when the busy instance's last report before the
// idle one's periodic call released its share (its load was off then, or
// its early calls ran out on a release), the idle instance takes what
// nobody asks for (up to 1496 of 1500); the busy instance's early calls
// are cut, and the idle one, not saturated, never calls early to give it
// back, until its next periodic call, which can repeat it. Over the idle
// instance's phases 0..950 ms (step 50) and both alignments of the load,
// the load got 1.2% to 67.5% of the 750 it could use; 25 of the 40 runs
// under 26% (e.g. phase 300 ms, about sim.add's spread: 67.5% and 1.2%).
// Through real instances: TestFleetBurstyLoadBesideIdleInstance (proxy).
func TestSimBurstyLoadBesideIdleInstance(t *testing.T) {
	t.Skip("issue 29 review: a 100 ms on/off load beside an idle instance is starved at most phases (1.2%-67.5% of the 750 units/s it could use): the idle instance takes the released share at its periodic call and never calls early to give it back")
	const hard = 1500
	for ph := time.Duration(0); ph < time.Second; ph += 50 * time.Millisecond {
		for shift := range 2 {
			sh := reviewShape{name: "bursty 100ms on/off alone", inst: 2, phases: []time.Duration{0, ph}, reachable: 0.5,
				clients: func(n int) []int {
					if (n/10+shift)%2 == 0 {
						return []int{8, 0}
					}
					return []int{0, 0}
				}}
			r := runReviewShape(t, sh, hard)
			t.Logf("idle instance at phase %v, shift %d: delivered %.1f%% of the limit (%.1f%% of what the load could use), worst 1 s window %.0f",
				ph, shift, 100*r.rate/hard, 100*r.rate/(hard*sh.reachable), r.worst)
			if r.rate < 0.5*hard*sh.reachable {
				t.Errorf("idle instance at phase %v, shift %d: the load got %.0f units/s, less than half of the %.0f it could use", ph, shift, r.rate, hard*sh.reachable)
			}
		}
	}
}
