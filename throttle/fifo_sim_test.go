package throttle

import (
	"fmt"
	"math"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// A huge command (Charge clamps its debt, "out-of-range units are
// clamped") makes the bucket's average command size huge; need() then
// multiplies it by the places ahead and overflows int64: a place with two
// places ahead is "admitted" by queue while the gauges hold it, and Admit
// returns Held with a zero wait (and counts a command that never ran).
func TestFIFOAfterHugeCharge(t *testing.T) {
	e, _ := newEngine(t, Unlimited, 20*ms)
	b := addBucket(t, e, "a", 0, 1000)
	// One command of 3<<61 units (Charge caps the debt at maxDebt): the
	// average command is 3<<61 units, and need(2) = 3<<62 wraps negative.
	wantAdmit(t, b, Blocking, 3<<61, FreePool)
	var ws [3]Waiter
	for i := range ws {
		d, wait := b.Admit(&ws[i], Blocking)
		t.Logf("place %d: %v %v waiting=%v", i+1, d, wait, ws[i].Waiting())
		if d == Held && wait <= 0 {
			t.Errorf("place %d: Held with wait %v (want > 0)", i+1, wait)
		}
		if d != Held {
			t.Errorf("place %d admitted with years of debt", i+1)
		}
	}
	if s := b.Stats(); s.Commands != 1 {
		t.Errorf("Commands = %d, want 1 (only the huge command ran)", s.Commands)
	}
}

// The same with a command of MaxInt64 units (as TestHugeLimits charges):
// need(2) = -2, so the third place is handed a wait shorter than the first
// place's, then waits of 1 ns (a busy loop), and is "admitted" (Held, 0)
// before the first place's time has come.
func TestFIFOAfterMaxInt64Charge(t *testing.T) {
	e, clk := newEngine(t, Unlimited, 20*ms)
	b := addBucket(t, e, "a", 0, 1000)
	wantAdmit(t, b, Blocking, math.MaxInt64, FreePool)
	var ws [3]Waiter
	var waits [3]time.Duration
	for i := range ws {
		d, wait := b.Admit(&ws[i], Blocking)
		if d != Held {
			t.Fatalf("place %d admitted", i+1)
		}
		waits[i] = wait
	}
	t.Logf("waits %v", waits)
	if waits[2] < waits[0] {
		t.Errorf("place 3 waits %v, less than place 1 (%v)", waits[2], waits[0])
	}
	// Place 3 re-tries at its time: how many re-tries before place 1's time?
	clk.Advance(waits[2])
	retries := 0
	for clk.Now() < time.Second+waits[0] && retries < 100000 {
		d, wait := b.Admit(&ws[2], Blocking)
		if d != Held || wait == 0 {
			t.Fatalf("place 3 got %v, %v at %v before place 1's time (%v ahead), after %d re-tries",
				d, wait, clk.Now()-time.Second, waits[0]-(clk.Now()-time.Second), retries)
		}
		retries++
		clk.Advance(wait)
	}
	if retries > 10 {
		t.Errorf("%d re-tries of place 3 before place 1's time", retries)
	}
}

// The waits handed to places behind others are computed with the bucket's
// average command size; when the places ahead run smaller commands than
// that (a new bucket whose first command was one big SET, then GETs), the
// places behind sleep long after their budget allows them, and the 20 ms
// forgiveness, seeing room unclaimed, skips them: a newcomer overtakes two
// places that re-try exactly on time, and one of them is then held.
func TestFIFOAverageDropKeepsOrder(t *testing.T) {
	e, clk := newEngine(t, Unlimited, 20*ms)
	b := addBucket(t, e, "a", 0, 1000)
	t0 := clk.Now()
	wantAdmit(t, b, Blocking, 200, FreePool) // a 800 KiB SET: 200 ms of debt
	conns := make([]*fifoConn, 3)
	for i := range conns {
		c := &fifoConn{id: i}
		d, wait := b.Admit(&c.w, Blocking)
		if d != Held {
			t.Fatalf("conn %d admitted", i)
		}
		c.wake = clk.Now() + wait
		conns[i] = c
		t.Logf("place %d wakes at +%v", i+1, c.wake-t0)
	}
	newcomer := &fifoConn{id: 3, wake: t0 + 250*ms} // a connection arriving later
	all := append(conns, newcomer)
	type adm struct {
		id   int
		at   time.Duration
		late bool
	}
	var order []adm
	heldOnTime := map[int]time.Duration{}
	for clk.Now() < t0+2*time.Second && len(order) < len(all) {
		clk.Advance(100 * time.Microsecond)
		for _, c := range all {
			if c.wake < 0 || c.wake > clk.Now() {
				continue
			}
			d, wait := b.Admit(&c.w, Blocking)
			if d == Held {
				if c.id < 3 && len(order) > 0 && order[len(order)-1].id == 3 {
					heldOnTime[c.id] = clk.Now() - t0
				}
				c.wake = clk.Now() + wait
				continue
			}
			units := int64(1)
			if c.id == 3 {
				units = 100 // the newcomer's command is a bigger SET
			}
			b.Charge(d, units)
			order = append(order, adm{c.id, clk.Now() - t0, false})
			c.wake = -1
		}
	}
	t.Logf("admissions %v", order)
	ids := []int{}
	for _, a := range order {
		ids = append(ids, a.id)
	}
	if !equalOrder(ids, []int{0, 1, 2, 3}) {
		t.Errorf("admission order %v, want [0 1 2 3]; places held on time after the newcomer ran: %v", ids, heldOnTime)
	}
}

// ---- a randomized closed-loop simulation ----

type fifoSimConn struct {
	id, bucket int
	mode       Mode
	w          Waiter
	ready      time.Duration // next command issued at
	wake       time.Duration // held: next re-try at (-1 when not held)
	due        time.Duration // held: the time the engine gave (without lateness)
	seq        int           // order of the place (first held), 0 when not held
	heldOnce   bool
	size       func() int64
	inversions map[int]bool // later places admitted while this one waited
}

type fifoSimResult struct {
	strict      int // a place held on a re-try after a later place ran
	inversions  int // a later place admitted while an earlier one waited
	busy        int // waits under 1 µs while held
	maxBeyond   time.Duration
	beyondWhere string
	msgs        []string
}

var fifoSimTrace func(format string, args ...any)

func fifoSim(t *testing.T, seed int64, lateness time.Duration, verbose bool) fifoSimResult {
	trace := func(format string, args ...any) {
		if verbose && fifoSimTrace != nil {
			fifoSimTrace(format, args...)
		}
	}
	r := rand.New(rand.NewSource(seed))
	var res fifoSimResult
	clk := NewFakeClock(time.Duration(r.Int63n(int64(time.Hour))) + time.Second)
	bursts := []time.Duration{-1, ms, 5 * ms, 20 * ms, 100 * ms}
	burst := bursts[r.Intn(len(bursts))]
	capacity := Limit(2000 + r.Int63n(30000))
	if r.Intn(5) == 0 {
		capacity = Unlimited
	}
	e, err := New(Config{Capacity: capacity, Burst: burst, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	nb := 1 + r.Intn(3)
	var bs []*Bucket
	var conns []*fifoSimConn
	maxUnits := int64(1)
	for i := 0; i < nb; i++ {
		hard := Limit(500 + r.Int63n(20000))
		if r.Intn(4) == 0 {
			hard = Unlimited
		}
		resv := Limit(0)
		if r.Intn(2) == 0 {
			top := int64(hard)
			if hard == Unlimited {
				top = 5000
			}
			resv = Limit(r.Int63n(top + 1))
		}
		b, err := e.AddBucket(fmt.Sprint("b", i), resv, hard)
		if err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
		var size func() int64
		k, kind := 1+r.Int63n(30), r.Intn(3)
		trace("seed %d cap %v burst %v bucket %d res %v hard %v sizes kind %d k %d", seed, capacity, burst, i, resv, hard, kind, k)
		switch kind {
		case 0:
			size = func() int64 { return 1 }
		case 1:
			size = func() int64 { return 1 + r.Int63n(k) }
			maxUnits = max(maxUnits, k)
		default:
			size = func() int64 {
				if r.Intn(10) == 0 {
					return 10 * k
				}
				return 1
			}
			maxUnits = max(maxUnits, 10*k)
		}
		n := 1 + r.Intn(6)
		for j := 0; j < n; j++ {
			conns = append(conns, &fifoSimConn{id: len(conns), bucket: i, mode: Blocking, wake: -1, size: size, inversions: map[int]bool{}})
		}
		if r.Intn(3) == 0 {
			conns = append(conns, &fifoSimConn{id: len(conns), bucket: i, mode: NonBlocking, wake: -1, size: size})
		}
	}
	seq := 0
	heldCmds := make([]uint64, nb)
	step := 50 * time.Microsecond
	end := clk.Now() + 3*time.Second
	// head tracking: since when the earliest held place's gauges admit
	admissibleSince := make([]time.Duration, nb)
	headSeq := make([]int, nb)
	for i := range admissibleSince {
		admissibleSince[i] = -1
	}
	for clk.Now() < end {
		clk.Advance(step)
		now := clk.Now()
		order := r.Perm(len(conns))
		for _, ci := range order {
			c := conns[ci]
			b := bs[c.bucket]
			if c.wake >= 0 {
				if c.wake > now {
					continue
				}
			} else if c.ready > now {
				continue
			}
			served0, tail0 := b.served.Load(), b.tail.Load()
			room0 := b.room(int64(now), b.lim.Load(), e.node.Load())
			place0 := c.w.place
			d, wait := b.Admit(&c.w, c.mode)
			trace("%v b%d conn %d mode %d seq %d place %d served %d tail %d room %d avg %d: %v %v", now, c.bucket, c.id, c.mode, c.seq, place0, served0, tail0, room0, b.need(1), d, wait)
			if d == Held {
				if wait <= 0 {
					res.msgs = append(res.msgs, fmt.Sprintf("held with wait %v", wait))
				}
				if wait < time.Microsecond {
					res.busy++

				}
				if c.mode == Blocking {
					if c.seq == 0 {
						seq++
						c.seq = seq
						c.heldOnce = true
						heldCmds[c.bucket]++
					} else if len(c.inversions) > 0 && now-c.due <= lateness+step {
						res.strict++
						if len(res.msgs) < 20 {
							res.msgs = append(res.msgs, fmt.Sprintf("seed %d: conn %d (place %d) re-trying %v after its time is held, later places %v ran", seed, c.id, c.seq, now-c.due, c.inversions))
						}
					}
				}
				c.due = now + wait
				if wait == InfDuration {
					c.wake = end + time.Hour
				} else {
					c.wake = now + wait
					if lateness > 0 {
						c.wake += time.Duration(r.Int63n(int64(lateness)))
					}
				}
				continue
			}
			// admitted
			if c.mode == Blocking {
				for _, o := range conns {
					if o != c && o.bucket == c.bucket && o.seq != 0 && (c.seq == 0 || o.seq < c.seq) {
						if c.seq == 0 && !o.w.Waiting() {
							continue
						}
						o.inversions[c.id] = true
						res.inversions++
					}
				}
				c.seq = 0
				c.inversions = map[int]bool{}
			}
			u := c.size()
			trace("   charged %d", u)
			b.Charge(d, u)
			c.wake = -1
			c.ready = now + time.Duration(r.Int63n(int64(2*ms)))
		}
		// the earliest waiting place of each bucket: how long have its
		// gauges admitted it without it running?
		for i, b := range bs {
			var head *fifoSimConn
			for _, c := range conns {
				if c.bucket == i && c.seq != 0 && (head == nil || c.seq < head.seq) {
					head = c
				}
			}
			if head == nil {
				admissibleSince[i] = -1
				continue
			}
			if head.seq != headSeq[i] {
				headSeq[i], admissibleSince[i] = head.seq, -1
			}
			lim := b.lim.Load()
			if d, _, _ := b.check(int64(now), lim, e.node.Load(), [2]int64{1, 1}); d == Held || lim.res.limit == Unlimited {
				admissibleSince[i] = -1
				continue
			}
			if admissibleSince[i] < 0 {
				admissibleSince[i] = now
			}
			if beyond := now - admissibleSince[i]; beyond > 10*ms && beyond <= 10*ms+step {
				trace("HEAD b%d conn %d seq %d place %d admissible since %v, not run", i, head.id, head.seq, head.w.place, admissibleSince[i])
			}
			if beyond := now - admissibleSince[i]; beyond > res.maxBeyond {
				res.maxBeyond = beyond
				res.beyondWhere = fmt.Sprintf("seed %d bucket %d (res %v hard %v cap %v burst %v) head conn %d", seed, i, lim.reserved, lim.hard, capacity, burst, head.id)
			}
		}
	}
	for i, b := range bs {
		if s := b.Stats(); s.Held != heldCmds[i] {
			res.msgs = append(res.msgs, fmt.Sprintf("seed %d bucket %d: Stats.Held %d, commands held at least once %d", seed, i, s.Held, heldCmds[i]))
		}
	}
	_ = maxUnits
	return res
}

func TestFIFOSimulated(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	for _, late := range []time.Duration{0, 5 * ms} {
		var tot fifoSimResult
		for seed := int64(1); seed <= 40; seed++ {
			res := fifoSim(t, seed, late, false)
			tot.strict += res.strict
			tot.inversions += res.inversions
			tot.busy += res.busy
			if res.maxBeyond > tot.maxBeyond {
				tot.maxBeyond, tot.beyondWhere = res.maxBeyond, res.beyondWhere
			}
			for _, m := range res.msgs {
				if strings.Contains(m, "Stats.Held") || strings.Contains(m, "held with wait") {
					t.Error(m)
				}
			}
		}
		t.Logf("lateness %v: strict %d inversions %d busy %d; longest a head was admissible but not run: %v (%s)",
			late, tot.strict, tot.inversions, tot.busy, tot.maxBeyond, tot.beyondWhere)
	}
}

// fifoSimRate runs conns saturating connections of one bucket (hard limit
// hard, capacity 10000, burst) for 11 s of fake time, issuing commands of
// size() units, each re-trying exactly when told (or late by up to
// lateness), and returns the bucket's rate over the last 10 s, and the
// worst time a held command ran after its budget allowed it (the first
// place's gauges admitting).
func fifoSimRate(t *testing.T, mode Mode, conns int, hard Limit, burst, lateness time.Duration, size func(r *rand.Rand) int64) (float64, time.Duration) {
	clk := NewFakeClock(0)
	e, err := New(Config{Capacity: 10000, Burst: burst, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.AddBucket("A", 0, hard)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(1))
	type conn struct {
		w    Waiter
		wake time.Duration
	}
	cs := make([]*conn, conns)
	for i := range cs {
		cs[i] = &conn{}
	}
	const step = 50 * time.Microsecond
	warm, end := time.Second, 11*time.Second
	var units int64
	for now := time.Duration(0); now < end; now += step {
		clk.Set(now)
		r.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
		for _, c := range cs {
			for n := 0; c.wake <= now && n < 64; n++ {
				d, wait := b.Admit(&c.w, mode)
				if d == Held {
					c.wake = now + wait
					if lateness > 0 {
						c.wake += time.Duration(r.Int63n(int64(lateness)))
					}
					break
				}
				u := size(r)
				b.Charge(d, u)
				if now >= warm {
					units += u
				}
			}
		}
	}
	return float64(units) / (end - warm).Seconds(), 0
}

// Commands of mixed sizes (most 1 unit, some big, as GETs beside bulk
// SETs): the bucket saturating its hard limit with Blocking connections
// should get that limit within 2%, as it does with NonBlocking ones.
func TestHardLimitMixedSizes(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	bimodal := func(r *rand.Rand) int64 {
		if r.Intn(10) == 0 {
			return 50
		}
		return 1
	}
	for _, burst := range []time.Duration{10 * ms, 20 * ms, 100 * ms} {
		for _, mode := range []Mode{Blocking, NonBlocking} {
			got, _ := fifoSimRate(t, mode, 6, 3000, burst, 0, bimodal)
			t.Logf("burst %v mode %d: %.0f units/s (hard limit 3000)", burst, mode, got)
			if math.Abs(got-3000) > 60 {
				t.Errorf("burst %v mode %d: %.0f units/s, want 3000 ±2%%", burst, mode, got)
			}
		}
	}
}

// Mostly 1-unit commands with a few big ones (5% of 200 units: average
// about 11): the places behind others are told waits for the average
// command of every place ahead, the places ahead mostly run 1 unit, so the
// line sleeps while the gauge has room, and the burst caps what is banked:
// 16 Blocking connections get far less than the hard limit that
// NonBlocking connections reach.
func TestBlockingReachesHardLimitWithMixedSizes(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	sizes := func(r *rand.Rand) int64 {
		if r.Intn(20) == 0 {
			return 200
		}
		return 1
	}
	for _, burst := range []time.Duration{20 * ms, 100 * ms} {
		blocking, _ := fifoSimRate(t, Blocking, 16, 3000, burst, 0, sizes)
		nonBlocking, _ := fifoSimRate(t, NonBlocking, 16, 3000, burst, 0, sizes)
		t.Logf("burst %v: Blocking %.0f, NonBlocking %.0f units/s (hard limit 3000)", burst, blocking, nonBlocking)
		if blocking < 3000*0.98 {
			t.Errorf("burst %v: 16 Blocking connections get %.0f units/s of a 3000 hard limit (NonBlocking: %.0f)", burst, blocking, nonBlocking)
		}
	}
}
