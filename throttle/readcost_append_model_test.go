package throttle

// APPEND reservations (readcost_append.go): a random model of one proxy's
// calls (SET raises, APPEND reserve/raise/attempts, memcached running each
// write in between, answers in any order, NOT_STORED, unknown outcomes,
// releases, DELETEs, FLUSHes) checked after every step against what
// memcached holds.

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

type appendOp struct {
	key      int
	v        int64
	res      AppendRes
	went     bool // forwarded: memcached runs it some time
	ran      bool // memcached ran it
	stored   bool
	epoch    int
	attempts int
}

func TestAppendReservationsModel(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { appendModel(t, seed, 400, 0, false) })
		t.Run(fmt.Sprint(seed, "-limit"), func(t *testing.T) { appendModel(t, seed, 400, 1<<20, false) })
	}
}

// release: an attempt that does not go releases its bytes, and its next
// attempt reserves again (as proxy/request.go forward does); else it keeps
// them while it waits (the API allows both). A SET runs after the APPENDs
// of its key forwarded before it: on two upstream connections memcached
// may run them the other way round, the surprise docs/throttling.md
// states as a worst case.
func appendModel(t *testing.T, seed uint64, steps int, limit int64, release bool) {
	rng := rand.New(rand.NewPCG(seed, seed*7+1))
	rc, _ := newCostBucket(t)
	nkeys := 40 + rng.IntN(60)
	keys := make([][]byte, nkeys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key%d", i)
	}
	actual := make([]int64, nkeys) // -1: missing
	for i := range actual {
		actual[i] = -1
	}
	epoch := 1
	var ops []*appendOp
	size := func() int64 {
		switch rng.IntN(4) {
		case 0:
			return 1 + rng.Int64N(100)
		case 1:
			return 1 + rng.Int64N(5000)
		case 2:
			return 1 + rng.Int64N(50_000)
		}
		return 1 + rng.Int64N(300_000)
	}
	var log []string
	fail := func(format string, a ...any) {
		t.Helper()
		n := len(log)
		if n > 30 {
			log = log[n-30:]
		}
		for _, l := range log {
			t.Log(l)
		}
		t.Fatalf(format, a...)
	}
	run := func(o *appendOp) { // memcached runs a forwarded APPEND
		o.ran = true
		if o.epoch != epoch {
			return // another namespace
		}
		if actual[o.key] >= 0 && (limit == 0 || actual[o.key]+o.v <= limit-100) {
			actual[o.key] += o.v
			o.stored = true
		}
	}
	check := func(what string) {
		t.Helper()
		for k, a := range actual {
			if a < 0 {
				continue
			}
			if need, got := rc.valueUnits(a), rc.KeyBound(keys[k]); got < need {
				fail("after %s: %s holds %d bytes (%d units), billed %d (listed %d, largest %d, in flight %d)",
					what, keys[k], a, need, got, rc.Listed(), rc.LargestValue(), rc.InFlight())
			}
			var probe AppendRes
			base := rc.ReserveAppend(&probe, keys[k], 0, 0)
			probe.Release()
			if base < a {
				fail("after %s: %s holds %d bytes; an APPEND to it starts from %d", what, keys[k], a, base)
			}
		}
	}
	for step := 0; step < steps; step++ {
		var what string
		switch c := rng.IntN(100); {
		case c < 18: // SET, after the APPENDs of its key forwarded before it (one connection)
			k := rng.IntN(nkeys)
			for _, o := range ops {
				if o.went && !o.ran && o.key == k {
					run(o)
				}
			}
			s := size()
			raiseAll(t, rc, keys[k], s)
			actual[k] = s
			what = fmt.Sprintf("SET %s %d", keys[k], s)
		case c < 40: // a new APPEND's first attempt
			k := rng.IntN(nkeys)
			o := &appendOp{key: k, v: size(), epoch: epoch}
			ops = append(ops, o)
			reserveAll(t, rc, &o.res, keys[k], o.v, limit)
			o.attempts++
			what = fmt.Sprintf("APPEND %s %d attempt", keys[k], o.v)
			if rng.IntN(3) > 0 {
				o.went = true
				what += " (goes)"
			} else if release {
				o.res.Release()
				what += " (waits: released)"
			}
		case c < 50: // a waiting APPEND tries again, goes or is refused
			for _, o := range ops {
				if o.went || !release && !o.res.Held() && o.attempts > 0 || release && o.ran {
					continue
				}
				if o.epoch != epoch {
					o.epoch = epoch // tried in the new epoch: reserves anew
				}
				reserveAll(t, rc, &o.res, keys[o.key], o.v, limit)
				o.attempts++
				what = fmt.Sprintf("APPEND %s %d attempt %d", keys[o.key], o.v, o.attempts)
				switch rng.IntN(3) {
				case 0:
					o.went = true
					what += " (goes)"
				case 1:
					o.res.Release()
					o.ran, o.went = true, true // done: never went
					o.stored = false
					o.res = AppendRes{}
					what += " (refused)"
				default:
					if release {
						o.res.Release()
						what += " (waits: released)"
					}
				}
				break
			}
		case c < 70: // memcached runs one forwarded APPEND
			for _, i := range rng.Perm(len(ops)) {
				if o := ops[i]; o.went && !o.ran {
					run(o)
					what = fmt.Sprintf("memcached runs APPEND %s %d (stored %v)", keys[o.key], o.v, o.stored)
					break
				}
			}
		case c < 88: // an answer comes in (or the upstream fails)
			if release && rng.IntN(4) == 0 { // failed, never written upstream (upstream.MayHaveRun false)
				for _, i := range rng.Perm(len(ops)) {
					if o := ops[i]; o.went && !o.ran && o.res.Held() {
						o.ran = true
						o.res.Complete(keys[o.key], false)
						what = fmt.Sprintf("APPEND %s %d fails, never sent", keys[o.key], o.v)
						break
					}
				}
				break
			}
			for _, i := range rng.Perm(len(ops)) {
				o := ops[i]
				if !o.went || !o.res.Held() {
					continue
				}
				if rng.IntN(5) == 0 { // failed: may or may not have run
					if !o.ran && rng.IntN(2) == 0 {
						run(o)
					}
					o.ran = true
					o.res.Complete(keys[o.key], true)
					what = fmt.Sprintf("APPEND %s %d fails (unknown)", keys[o.key], o.v)
				} else {
					if !o.ran {
						run(o)
					}
					o.res.Complete(keys[o.key], o.stored)
					what = fmt.Sprintf("APPEND %s %d answered (stored %v)", keys[o.key], o.v, o.stored)
				}
				break
			}
		case c < 95: // DELETE
			k := rng.IntN(nkeys)
			for _, o := range ops {
				if o.went && !o.ran && o.key == k {
					run(o)
				}
			}
			actual[k] = -1
			what = fmt.Sprintf("DELETE %s", keys[k])
		case c < 97: // FLUSH
			epoch++
			rc.Reset(uint64(epoch))
			for i := range actual {
				actual[i] = -1
			}
			what = "FLUSH"
		default: // a client gone while its APPEND waits
			for _, o := range ops {
				if !o.went && (o.res.Held() || release && !o.ran) {
					o.res.Release()
					o.went, o.ran = true, true
					what = fmt.Sprintf("APPEND %s %d: client gone", keys[o.key], o.v)
					break
				}
			}
		}
		if what == "" {
			continue
		}
		log = append(log, what)
		check(what)
	}
	// Everything answers: nothing stays in flight.
	for _, o := range ops {
		if o.res.Held() {
			if o.went {
				if !o.ran {
					run(o)
				}
				o.res.Complete(keys[o.key], o.stored)
			} else {
				o.res.Release()
			}
		}
	}
	if f := rc.InFlight(); f != 0 {
		fail("%d bytes in flight once every APPEND was answered or released", f)
	}
	check("the end")
}

// The same with the proxy's attempts: one that waits
// releases its bytes and reserves again when it tries again, and an
// APPEND may fail without having been written upstream.
func TestAppendReservationsModelReleasing(t *testing.T) {
	for seed := uint64(1); seed <= 300; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { appendModel(t, seed, 400, 0, true) })
		t.Run(fmt.Sprint(seed, "-limit"), func(t *testing.T) { appendModel(t, seed, 400, 1<<20, true) })
	}
}

// The calls from several loops at once, under the race detector: every
// reservation ends, so nothing stays in flight.
func TestAppendReservationsConcurrent(t *testing.T) {
	rc, _ := newCostBucket(t)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for i := 0; i < 3000; i++ {
				k := fmt.Appendf(nil, "k%d", rng.IntN(100))
				switch rng.IntN(10) {
				case 0:
					rc.RaiseKey(k, rng.Int64N(200_000))
					rc.TryDrain()
				case 1:
					if g == 0 && rng.IntN(50) == 0 {
						rc.Reset(uint64(2 + i))
					}
				default:
					var a AppendRes
					for j := 0; j < 1+rng.IntN(3); j++ {
						b := rc.ReserveAppend(&a, k, rng.Int64N(10_000), 1<<20)
						rc.RaiseAppend(k, max(b, 1))
						rc.TryDrain()
					}
					if rng.IntN(4) == 0 {
						a.Release()
					} else {
						a.Complete(k, rng.IntN(2) == 0)
					}
				}
			}
		}(g)
	}
	wg.Wait()
	if f := rc.InFlight(); f != 0 {
		t.Fatalf("%d bytes in flight after every reservation ended", f)
	}
}
