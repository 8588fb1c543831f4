package fleet

// Store-loss simulations beyond TestSimStoreLoss: stores that time out,
// mixed failure modes, a store that flaps, and the capped fallback's
// limits (from the outside review of the Share fallback's cap).

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// windowCheck returns a callback for sim.run that reports every 1 s window
// (after the first) in which the fleet used more than limit*tol of bucket,
// and a function returning the largest window seen.
func windowCheck(t *testing.T, s *sim, bucket string, limit, tol float64) (func(), func() float64) {
	var ring [int(time.Second / simStep)]float64
	steps, worst := 0, 0.0
	return func() {
			_, now := delta(make([]float64, len(s.inst)), s.units(bucket))
			i := steps % len(ring)
			if steps >= len(ring) {
				used := now - ring[i]
				worst = max(worst, used)
				if used > limit*tol {
					t.Errorf("at %v the fleet used %.0f units in the last second, limit %.0f", s.clock.Now(), used, limit)
				}
			}
			ring[i] = now
			steps++
		}, func() float64 {
			return worst
		}
}

// runStopped advances the sim by d with every store call failing after
// taking callDur (a stopped store: calls time out at Period/2). A call's
// outcome is applied when it ends (syncOnce runs then, so lost() sees the
// clock at the call's end); the next call starts 19 ticks after it ended
// plus the one tick buffered while it blocked, as in Fleet.run.
func runStopped(s *sim, d time.Duration, callDur func(i int) time.Duration, each func()) {
	type st struct{ start time.Duration }
	next := make([]st, len(s.inst))
	now := s.clock.Now()
	for i, in := range s.inst {
		at := (now - in.phase) % s.period
		next[i].start = now - at + s.period // next phase point
	}
	for end := now + d; s.clock.Now() < end; {
		now := s.step()
		for i, in := range s.inst {
			cd := callDur(i)
			if now == next[i].start+cd {
				in.f.syncOnce() // fails (store down): lost() at the call's end
				step := s.period + cd
				if cd >= s.period/samplesPerPeriod {
					step -= s.period / samplesPerPeriod // the buffered tick
				}
				next[i].start += step
			}
		}
		if each != nil {
			each()
		}
	}
}

// TestSimStoppedStore: the store stops (SIGSTOP): every call times out at
// Period/2, so the instances call every ~1.45 periods and fall back at the
// end of a call; or one instance's calls fail at once (its connections
// refused) while the others' time out, so that its cap must not lift
// before the slow ones have fallen back. The fleet stays within the limit
// in every 1 s window through the fallback and the cap's end, and then
// each instance enforces a third of it.
func TestSimStoppedStore(t *testing.T) {
	for fast := -1; fast < 3; fast++ {
		for _, split := range [][]int{{6, 3, 1}, {1, 3, 6}, {8, 1, 1}, {1, 8, 1}, {1, 1, 8}} {
			s := newSim(t, time.Second, throttle.Unlimited, simBucket{name: "b", hard: 3000})
			for _, c := range split {
				s.add().clients["b"] = c
			}
			s.run(3*time.Second, nil)
			check, worst := windowCheck(t, s, "b", 3000, 1.001)
			s.lose.down = true
			runStopped(s, 12*time.Second, func(i int) time.Duration {
				if i == fast {
					return 0
				}
				return s.period / 2
			}, check)
			for i, in := range s.inst {
				if _, h := in.f.Grants().Limits("b", 0, 3000); h != 1000 {
					t.Errorf("fast %d split %v: instance %d enforces %v after 12 periods, want 1000", fast, split, i, h)
				}
			}
			t.Logf("fast %d split %v: worst 1 s window %.0f", fast, split, worst())
		}
	}
}

// TestSimStoreFlap: the store (not emptied: it persists) comes back for
// a moment in which only one instance calls, then is lost again. The store
// has forgotten the other two (their leases ran out), so that instance is
// granted the whole limit and learns it is alone (1 live instance); when
// the store is lost again its Share fallback is the whole limit, while the
// other two still enforce a third each: the fleet runs at 5/3 of the
// limit for as long as the store stays lost. (Not introduced by ae0d9d7:
// the fallback's divisor was lastLive before it too.)
func TestSimStoreFlap(t *testing.T) {
	for _, empty := range []bool{false, true} {
		t.Run(map[bool]string{false: "persisted", true: "restarted-empty"}[empty], func(t *testing.T) { simStoreFlap(t, empty) })
	}
}

// simFallenBack starts three instances (6, 3 and 1 saturating clients of
// bucket "b", hard limit 3000; 1 s periods), runs 3 s, then loses the
// store for 8 s: every instance is in the plain fallback.
func simFallenBack(t *testing.T) *sim {
	s := newSim(t, time.Second, throttle.Unlimited, simBucket{name: "b", hard: 3000})
	for _, c := range []int{6, 3, 1} {
		s.add().clients["b"] = c
	}
	s.run(3*time.Second, nil)
	s.lose.down = true
	s.run(8*time.Second, nil)
	return s
}

// runToSync runs s until in's next sync is at the next step.
func runToSync(s *sim, in *simInstance) {
	for (s.clock.Now()+simStep-in.phase)%s.period != 0 {
		s.run(simStep, nil)
	}
}

func simStoreFlap(t *testing.T, empty bool) {
	s := simFallenBack(t)
	// Up for exactly one step: the step at which instance 2 syncs.
	flap := s.inst[2]
	runToSync(s, flap)
	if empty {
		s.mr.FlushAll()
	}
	s.lose.down = false
	s.run(simStep, nil)
	s.lose.down = true
	_, h := flap.f.Grants().Limits("b", 0, 3000)
	t.Logf("after the flap instance 2 sees %d live instance(s), is granted %v", flap.f.Grants().Instances(), h)
	s.run(8*time.Second, nil)
	u0 := s.units("b")
	s.run(4*time.Second, nil)
	per, total := delta(u0, s.units("b"))
	if rate := total / 4; rate > 3000*1.10 {
		t.Errorf("store lost again after a flap: the fleet uses %.0f units/s (per instance %.0f), limit 3000", rate, per)
	}
}

// TestCappedFallbackLimitsOrdered: in the capped fallback, reserved <= hard
// holds for every mix of configured limits and last grants (present,
// absent, -1, above the limit), finite or unlimited.
func TestCappedFallbackLimitsOrdered(t *testing.T) {
	lims := []throttle.Limit{0, 1, 2, 5, 100, 3000, throttle.Unlimited}
	grants := []int64{-1, 0, 1, 50, 2000, 5000}
	for _, live := range []int{1, 2, 3, 7} {
		for _, gr := range grants {
			for _, gh := range grants {
				last := &Grants{mode: modeGranted, policy: Share, live: live, freePool: 10,
					buckets: map[string]BucketGrant{"b": {Reserved: gr, HardLimit: gh}}}
				g := &Grants{mode: modeFallback, policy: Share, live: live, last: last}
				for _, res := range lims {
					for _, hard := range lims {
						if !res.LessOrEqual(hard) {
							continue
						}
						for _, name := range []string{"b", "new"} {
							r, h := g.Limits(name, res, hard)
							_, ph := (&Grants{mode: modeFallback, policy: Share, live: live}).Limits(name, res, hard)
							if !r.LessOrEqual(h) || !h.LessOrEqual(ph) {
								t.Errorf("live %d grants %d/%d limits %v/%v %s: capped %v/%v, plain hard %v", live, gr, gh, res, hard, name, r, h, ph)
							}
						}
					}
				}
			}
		}
	}
}

// TestSimFallbackOfferedEveryCall: while the store stays lost, every failed
// call offers the grants in force to the Granted hook again, so an
// instance that could not apply them once (the proxy skips a sync's grants
// while an admin change holds its lock) applies them at the next call, the
// capped fallback's end included.
func TestSimFallbackOfferedEveryCall(t *testing.T) {
	s := newSim(t, time.Second, throttle.Unlimited, simBucket{name: "b", hard: 3000})
	for _, c := range []int{6, 3, 1} {
		s.add().clients["b"] = c
	}
	s.run(3*time.Second, nil)
	s.lose.down = true
	s.run(4*time.Second, nil) // in the fallback
	before := s.inst[2].granted
	s.run(5*time.Second, nil)
	if got := s.inst[2].granted - before; got < 5 {
		t.Errorf("the Granted hook ran %d times in 5 failed calls, want each", got)
	}
}

// TestSimStoreBackInstancesApart: the whole fleet lost the store and fell
// back (a third of the limit each); the store comes back, emptied (a
// restart without persistence) or as it was, and instance 1's first call
// after it fails (its connection still broken), so it comes back a period
// after the others. The limits the instances enforce add up to at most the
// fleet's at every step: the first callers back leave room for the
// instances not back yet, however few instances their own last reply
// counted.
func TestSimStoreBackInstancesApart(t *testing.T) {
	for _, empty := range []bool{true, false} {
		t.Run(map[bool]string{false: "persisted", true: "restarted-empty"}[empty], func(t *testing.T) {
			s := simFallenBack(t)
			runToSync(s, s.inst[0])
			if empty {
				s.mr.FlushAll()
			}
			late := s.inst[1]
			late.cut.down = true
			s.lose.down = false
			worst := int64(0)
			check := func() {
				var sum int64
				for _, in := range s.inst {
					_, h := in.f.Grants().Limits("b", 0, 3000)
					n, _ := h.Finite()
					sum += n
				}
				if sum > worst {
					worst = sum
				}
			}
			s.run(s.period, check) // instance 1's call at its phase fails
			late.cut.down = false
			s.run(3*s.period, check)
			if worst > 3000 {
				t.Errorf("after the store's return the instances enforced hard limits adding up to %d, above the fleet's 3000", worst)
			}
			u0 := s.units("b")
			s.run(2*time.Second, check)
			per, total := delta(u0, s.units("b"))
			if rate := total / 2; rate > 3000*1.001 || rate < 3000*0.95 {
				t.Errorf("after the return the fleet used %.0f units/s (per instance %.0f), want 3000 +-5%%", rate, per)
			}
		})
	}
}
