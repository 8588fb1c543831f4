package throttle

import (
	"math"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func wantHeld(t *testing.T, b *Bucket, mode Mode, want time.Duration) {
	t.Helper()
	d, wait := b.Admit(nil, mode)
	if d != Held || wait != want {
		t.Fatalf("%s: Admit = %v, %v; want held for %v", b.Name(), d, wait, want)
	}
}

func TestUnits(t *testing.T) {
	for _, c := range []struct{ bytes, size, want int64 }{
		{0, 4096, 1}, {-5, 4096, 1}, {1, 4096, 1}, {4096, 4096, 1}, {4097, 4096, 2},
		{8192, 4096, 2}, {10, 0, 1}, {4097, -1, 2}, {100, 10, 10}, {101, 10, 11},
		{math.MaxInt64, 1, math.MaxInt64}, {math.MaxInt64, 2, math.MaxInt64/2 + 1},
	} {
		if got := Units(c.bytes, c.size); got != c.want {
			t.Errorf("Units(%d, %d) = %d, want %d", c.bytes, c.size, got, c.want)
		}
	}
	if ReadUnits(5000, 4096) != 2 || WriteUnits(5000, 1024) != 5 {
		t.Error("ReadUnits/WriteUnits")
	}
}

// Huge limits saturate instead of overflowing.
func TestHugeLimits(t *testing.T) {
	e, clk := newEngine(t, math.MaxInt64, 0)
	a := addBucket(t, e, "a", math.MaxInt64, Unlimited)
	b := addBucket(t, e, "b", math.MaxInt64-1, math.MaxInt64)
	c := addBucket(t, e, "c", 0, Unlimited)
	if e.FreePool() != 0 {
		t.Fatalf("free pool %v", e.FreePool())
	}
	wantAdmit(t, a, Blocking, math.MaxInt64, Reserved)
	wantAdmit(t, b, Blocking, math.MaxInt64, Reserved)
	wantHeld(t, c, Blocking, InfDuration)
	// A huge charge at a slow rate caps the debt instead of wrapping.
	s := addBucket(t, e, "slow", 1, 1)
	wantAdmit(t, s, Blocking, math.MaxInt64, Reserved) // ~2.3 years of debt
	for i := 0; i < 200; i++ {
		wantAdmit(t, s, Unthrottled, math.MaxInt64, FreePool) // hard: capped
	}
	year := 365 * 24 * time.Hour
	if d, wait := s.Admit(nil, Blocking); d != Held || wait < 2*year || wait > 3*year {
		t.Errorf("slow: %v %v", d, wait) // the reservation's debt, not the hard limit's
	}
	if got := s.hard.tat.Load(); got != tatCap {
		t.Errorf("hard limit's bill %d, want capped at %d", got, tatCap)
	}
	clk.Advance(time.Hour)
	if d, wait := s.Admit(nil, NonBlocking); d != Held || wait <= 0 {
		t.Errorf("slow after an hour: %v %v", d, wait)
	}
	if !Limit(0).Valid() || Limit(-2).Valid() || !Unlimited.Valid() {
		t.Error("Valid")
	}
}

func TestValidation(t *testing.T) {
	if _, err := New(Config{Capacity: -2}); err != ErrInvalidLimit {
		t.Fatalf("New(-2) = %v", err)
	}
	e, _ := newEngine(t, 1000, 0)
	for _, c := range []struct {
		r, h Limit
		err  error
	}{
		{-2, 10, ErrInvalidLimit}, {0, -3, ErrInvalidLimit}, {11, 10, ErrReservedOverHard},
		{Unlimited, 10, ErrReservedOverHard}, {Unlimited, Unlimited, nil}, {10, 10, nil},
		{0, 0, nil}, {5, Unlimited, nil},
	} {
		if _, err := e.AddBucket("x", c.r, c.h); err != c.err {
			t.Errorf("AddBucket(%v, %v) = %v, want %v", c.r, c.h, err, c.err)
		}
		e.RemoveBucket("x")
	}
	b := addBucket(t, e, "a", 1, 2)
	if _, err := e.AddBucket("a", 0, 0); err != ErrBucketExists {
		t.Errorf("duplicate AddBucket = %v", err)
	}
	if err := b.SetLimits(3, 2); err != ErrReservedOverHard {
		t.Errorf("SetLimits(3, 2) = %v", err)
	}
	if err := e.SetCapacity(-7); err != ErrInvalidLimit {
		t.Errorf("SetCapacity(-7) = %v", err)
	}
	if err := e.RemoveBucket("nope"); err != ErrUnknownBucket {
		t.Errorf("RemoveBucket(nope) = %v", err)
	}
	if e.Bucket("a") != b || e.Bucket("nope") != nil || len(e.Buckets()) != 1 {
		t.Error("Bucket lookup")
	}
	if Unlimited.String() != "unlimited" || Limit(5).String() != "5" || FreePool.String() != "free_pool" {
		t.Error("String")
	}
	b.Charge(Held, 5) // ignored
	b.Charge(Domain(99), 5)
	if b.Stats().Units != 0 {
		t.Error("Charge(Held) charged")
	}
}

// Rule 1: unthrottled callers and unlimited reservations are never held, and
// unthrottled units still count.
func TestRuleUnthrottled(t *testing.T) {
	e, clk := newEngine(t, 1000, 0)
	a := addBucket(t, e, "a", 0, 100)
	wantAdmit(t, a, Blocking, 10, FreePool) // hard: 100 ms of debt
	wantHeld(t, a, Blocking, 100*ms)
	for i := 0; i < 3; i++ {
		wantAdmit(t, a, Unthrottled, 10, FreePool) // never held, charged
	}
	wantHeld(t, a, Blocking, 400*ms)
	wantHeld(t, a, NonBlocking, 400*ms)
	clk.Advance(400 * ms)
	wantAdmit(t, a, Blocking, 1, FreePool)

	u := addBucket(t, e, "u", Unlimited, Unlimited)
	for i := 0; i < 100; i++ {
		wantAdmit(t, u, Blocking, 1000, Unmetered)
	}
	if s := u.Stats(); s.Commands != 100 || s.Units != 100000 {
		t.Errorf("unmetered stats %+v", s)
	}
	if e.FreePool() != 1000 {
		t.Errorf("unlimited reservation took %v from the pool", 1000-e.FreePool())
	}
}

// Rule 2: below its reservation a bucket runs even when the pool is
// exhausted and its hard limit is reached.
func TestRuleReservation(t *testing.T) {
	e, clk := newEngine(t, 1000, 0)
	a := addBucket(t, e, "a", 100, 200)
	b := addBucket(t, e, "b", 0, Unlimited)
	if e.FreePool() != 900 {
		t.Fatalf("free pool %v", e.FreePool())
	}
	wantAdmit(t, b, Blocking, 900, FreePool) // pool: 1 s of debt
	wantAdmit(t, a, Blocking, 5, Reserved)   // reservation: 50 ms, hard: 25 ms
	// Reservation spent, pool exhausted: held until the reservation has room.
	wantHeld(t, a, Blocking, 50*ms)
	clk.Advance(50 * ms)
	wantAdmit(t, a, Blocking, 1, Reserved)
	// Hard limit full (a reserved charge counts against it), reservation
	// still runs.
	wantAdmit(t, a, Unthrottled, 100, FreePool) // hard: ~500 ms of debt
	clk.Advance(10 * ms)
	wantAdmit(t, a, Blocking, 1, Reserved)
	if s := a.Stats(); s.Commands != 4 || s.Units != 107 {
		t.Errorf("stats %+v", s)
	}
}

// Rule 3: with the free pool exhausted, held until it has room; the wait is
// the later of pool and hard limit, or the reservation if that is sooner.
func TestRulePoolExhausted(t *testing.T) {
	e, clk := newEngine(t, 1000, 0)
	a := addBucket(t, e, "a", 0, 500)
	b := addBucket(t, e, "b", 0, Unlimited)
	wantAdmit(t, b, Blocking, 50, FreePool)
	wantHeld(t, a, Blocking, 50*ms)
	wantHeld(t, b, Blocking, 50*ms)
	clk.Advance(50 * ms)
	wantAdmit(t, a, Blocking, 10, FreePool) // pool 10 ms, a's hard 20 ms
	wantHeld(t, a, Blocking, 20*ms)         // the later of the two
	wantHeld(t, b, Blocking, 10*ms)
	// Give a a reservation: it is sooner than the pool.
	if err := a.SetLimits(250, 500); err != nil {
		t.Fatal(err)
	}
	if e.FreePool() != 750 {
		t.Fatalf("free pool %v", e.FreePool())
	}
	wantAdmit(t, a, Blocking, 5, Reserved) // reservation: 20 ms
	wantAdmit(t, b, Unthrottled, 75, FreePool)
	// pool: ~10*4/3 + 100 ms away, hard: ~30 ms, reservation: 20 ms
	wantHeld(t, a, Blocking, 20*ms)
}

// Rule 4: at its hard limit a bucket is held even with a free pool.
func TestRuleHardLimit(t *testing.T) {
	e, clk := newEngine(t, 10000, 0)
	a := addBucket(t, e, "a", 0, 1000)
	wantAdmit(t, a, Blocking, 30, FreePool)
	wantHeld(t, a, Blocking, 30*ms)
	clk.Advance(29 * ms)
	wantHeld(t, a, Blocking, 1*ms)
	clk.Advance(1 * ms)
	wantAdmit(t, a, Blocking, 1, FreePool) // rule 5

	// A zero hard limit holds forever; only a change admits.
	z := addBucket(t, e, "z", 0, 0)
	wantHeld(t, z, Blocking, InfDuration)
	if err := z.SetLimits(0, 10); err != nil {
		t.Fatal(err)
	}
	clk.Advance(ms) // the pool has paid for a's last unit
	wantAdmit(t, z, Blocking, 1, FreePool)
}

// With capacity unlimited nothing but hard limits throttles.
func TestUnlimitedCapacity(t *testing.T) {
	e, clk := newEngine(t, Unlimited, 0)
	a := addBucket(t, e, "a", 100, 1000)
	b := addBucket(t, e, "b", 0, Unlimited)
	if e.FreePool() != Unlimited || e.Capacity() != Unlimited {
		t.Fatal("pool not unlimited")
	}
	for i := 0; i < 1000; i++ {
		wantAdmit(t, b, Blocking, 1000, FreePool)
	}
	wantAdmit(t, a, Blocking, 1, Reserved) // reservation 10 ms, hard 1 ms
	clk.Advance(ms)
	wantAdmit(t, a, Blocking, 100, FreePool) // hard 100 ms
	wantHeld(t, a, Blocking, 9*ms)           // the reservation is sooner
	clk.Advance(9 * ms)
	wantAdmit(t, a, Blocking, 1, Reserved)
}

// A zero free pool without a reservation never admits by itself.
func TestZeroPool(t *testing.T) {
	e, clk := newEngine(t, 1000, 0)
	a := addBucket(t, e, "a", 500, 1000)
	b := addBucket(t, e, "b", 600, Unlimited) // oversubscribed: pool 0
	c := addBucket(t, e, "c", 0, Unlimited)
	if e.FreePool() != 0 {
		t.Fatalf("free pool %v", e.FreePool())
	}
	wantHeld(t, c, Blocking, InfDuration)
	wantHeld(t, c, NonBlocking, InfDuration)
	wantAdmit(t, a, Blocking, 5, Reserved)
	wantAdmit(t, b, Blocking, 6, Reserved)
	wantHeld(t, a, Blocking, 10*ms) // reservation, not the closed pool
	if err := e.RemoveBucket("b"); err != nil {
		t.Fatal(err)
	}
	if e.FreePool() != 500 {
		t.Fatalf("free pool after remove %v", e.FreePool())
	}
	wantAdmit(t, c, Blocking, 1, FreePool)
	// The removed bucket still works, from the pool only.
	if r, h := b.Limits(); r != 0 || h != Unlimited {
		t.Errorf("removed limits %v %v", r, h)
	}
	if err := b.SetLimits(1, 2); err != ErrUnknownBucket {
		t.Errorf("SetLimits on removed = %v", err)
	}
	clk.Advance(2 * ms) // c's unit
	wantAdmit(t, b, Blocking, 1, FreePool)
}

// Debt is exact, carries over limit changes and is rescaled to the new rate.
func TestDebtAndRescale(t *testing.T) {
	e, clk := newEngine(t, 1000, 0)
	a := addBucket(t, e, "a", 0, Unlimited)
	wantAdmit(t, a, Blocking, 1000, FreePool) // 1 s of debt
	wantHeld(t, a, Blocking, time.Second)
	if err := e.SetCapacity(2000); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, a, Blocking, 500*ms) // same 1000 units owed, twice the rate
	clk.Advance(250 * ms)
	if err := e.SetCapacity(500); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, a, Blocking, time.Second) // 500 units owed at 500/s
	if err := a.SetLimits(0, 100); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	wantAdmit(t, a, Blocking, 20, FreePool) // hard: 200 ms
	if err := a.SetLimits(0, 200); err != nil {
		t.Fatal(err)
	}
	wantHeld(t, a, Blocking, 100*ms)
	// Reservations rescale too.
	if err := a.SetLimits(100, 200); err != nil {
		t.Fatal(err)
	}
	clk.Advance(100 * ms)
	wantAdmit(t, a, Blocking, 10, Reserved) // reservation: 100 ms
	if err := a.SetLimits(50, 200); err != nil {
		t.Fatal(err)
	}
	if err := e.SetCapacity(50); err != nil { // pool 0: only the reservation
		t.Fatal(err)
	}
	wantHeld(t, a, Blocking, 200*ms)
}

// A limit raised while the bucket is idle keeps what it had banked: the
// room fills to the new burst at the new rate, not at once (a fleet share
// moving to the instance its load moved to admits no second burst). A
// lowered one keeps its debt and at most its new burst.
func TestRaisedLimitKeepsItsBank(t *testing.T) {
	e, clk := newEngine(t, Unlimited, 100*ms)
	a := addBucket(t, e, "a", 0, 100) // burst: 10 units
	clk.Advance(time.Second)          // idle: the whole burst banked
	if err := a.SetLimits(0, 1000); err != nil {
		t.Fatal(err)
	}
	if n := admitAll(a); n != 10 {
		t.Errorf("raised from 100 to 1000/s while idle: %d admitted at once, want the 10 banked", n)
	}
	clk.Advance(time.Second)
	if n := admitAll(a); n != 100 {
		t.Errorf("a second later: %d admitted at once, want the new burst of 100", n)
	}
	clk.Advance(time.Second)
	if err := a.SetLimits(0, 100); err != nil {
		t.Fatal(err)
	}
	if n := admitAll(a); n != 10 {
		t.Errorf("lowered from 1000 to 100/s while idle: %d admitted at once, want the new burst of 10", n)
	}
}

// admitAll admits 1-unit commands on b until one is held, and returns how
// many were admitted.
func admitAll(b *Bucket) int {
	n := 0
	for {
		if d, _ := run(b, nil, Blocking, 1); d == Held {
			return n
		}
		n++
	}
}

// A burst lets a gauge run ahead by rate*burst units (plus one command).
func TestBurst(t *testing.T) {
	e, clk := newEngine(t, 1000, 50*ms)
	if e.Burst() != 50*ms {
		t.Fatal(e.Burst())
	}
	a := addBucket(t, e, "a", 0, Unlimited)
	n := 0
	for {
		if d, _ := run(a, nil, Blocking, 1); d == Held {
			break
		}
		n++
	}
	if n != 51 {
		t.Errorf("burst admitted %d commands, want 51", n)
	}
	wantHeld(t, a, Blocking, 1*ms)
	clk.Advance(10 * ms)
	for i := 0; i < 10; i++ {
		wantAdmit(t, a, Blocking, 1, FreePool)
	}
	wantHeld(t, a, Blocking, 1*ms)
	// Idle time does not accumulate beyond the burst.
	clk.Advance(time.Hour)
	n = 0
	for {
		if d, _ := run(a, nil, Blocking, 1); d == Held {
			break
		}
		n++
	}
	if n != 51 {
		t.Errorf("after idling admitted %d, want 51", n)
	}
	if def, _ := New(Config{Capacity: 1}); def.Burst() != DefaultBurst {
		t.Errorf("default burst %v", def.Burst())
	}
}

func TestStatsWindow(t *testing.T) {
	e, clk := newEngine(t, Unlimited, 0)
	a := addBucket(t, e, "a", 0, Unlimited)
	for i := 0; i < 3000; i++ { // 3000 units/s for 3 s
		clk.Advance(ms)
		wantAdmit(t, a, Blocking, 3, FreePool)
	}
	s := a.Stats()
	if math.Abs(s.UnitsPerSecond-3000) > 3000*0.01 {
		t.Errorf("UnitsPerSecond = %v, want 3000", s.UnitsPerSecond)
	}
	if s.Units != 9000 || s.Commands != 3000 {
		t.Errorf("stats %+v", s)
	}
	clk.Advance(2 * time.Second)
	if r := a.Stats().UnitsPerSecond; r != 0 {
		t.Errorf("idle UnitsPerSecond = %v", r)
	}
}

// fifoSetup returns a bucket at 1000 units/s whose gauge is 10 ms in debt.
func fifoSetup(t *testing.T) (*Engine, *FakeClock, *Bucket) {
	e, clk := newEngine(t, Unlimited, 0)
	b := addBucket(t, e, "b", 0, 1000)
	wantAdmit(t, b, Blocking, 10, FreePool)
	return e, clk, b
}

// drive steps the clock by 100 µs and re-tries every due waiter, the latest
// held first, admitting (and charging units) whoever may run. It returns
// the order of admission.
func drive(t *testing.T, clk *FakeClock, b *Bucket, conns []*fifoConn, units int64) []int {
	t.Helper()
	var order []int
	for step := 0; len(order) < len(conns) && step < 100000; step++ {
		clk.Advance(100 * time.Microsecond)
		for i := len(conns) - 1; i >= 0; i-- {
			c := conns[i]
			if c.wake < 0 || c.wake > clk.Now() {
				continue
			}
			d, wait := b.Admit(&c.w, Blocking)
			if d == Held {
				c.wake = clk.Now() + wait
				continue
			}
			b.Charge(d, units)
			order = append(order, c.id)
			c.wake = -1
		}
	}
	return order
}

func holdAll(t *testing.T, clk *FakeClock, b *Bucket, n int) []*fifoConn {
	t.Helper()
	var conns []*fifoConn
	var last time.Duration
	for i := 0; i < n; i++ {
		c := &fifoConn{id: i}
		d, wait := b.Admit(&c.w, Blocking)
		if d != Held || !c.w.Waiting() {
			t.Fatalf("conn %d not held: %v", i, d)
		}
		if i == 0 && wait != 10*ms {
			t.Fatalf("head wait %v, want 10ms", wait)
		}
		if wait < last {
			t.Fatalf("conn %d waits %v, less than the place before (%v)", i, wait, last)
		}
		last = wait
		c.wake = clk.Now() + wait
		conns = append(conns, c)
	}
	return conns
}

func TestFIFO(t *testing.T) {
	for _, units := range []int64{1, 7} {
		_, clk, b := fifoSetup(t)
		conns := holdAll(t, clk, b, 8)
		if s := b.Stats(); s.Waiting != 8 || s.Held != 8 {
			t.Fatalf("stats %+v", s)
		}
		// Waking all at once, in reverse order, changes nothing.
		for _, c := range conns {
			c.wake = clk.Now()
		}
		order := drive(t, clk, b, conns, units)
		if !equalOrder(order, []int{0, 1, 2, 3, 4, 5, 6, 7}) {
			t.Errorf("units %d: order %v", units, order)
		}
		if s := b.Stats(); s.Waiting != 0 || s.Commands != 9 {
			t.Errorf("stats after %+v", s)
		}
	}
}

// A newcomer queues behind the held, even when the gauge has room.
func TestFIFONewcomerQueues(t *testing.T) {
	_, clk, b := fifoSetup(t)
	conns := holdAll(t, clk, b, 2)
	clk.Advance(15 * ms) // room; the held have not come back (yet)
	var w Waiter
	if d, wait := b.Admit(&w, Blocking); d != Held || wait <= 0 {
		t.Fatalf("newcomer: %v %v", d, wait)
	}
	// NonBlocking and Unthrottled callers ignore the line.
	wantAdmit(t, b, NonBlocking, 1, FreePool)
	wantAdmit(t, b, Unthrottled, 1, FreePool)
	conns = append(conns, &fifoConn{id: 2, w: w, wake: clk.Now()})
	if order := drive(t, clk, b, conns, 1); !equalOrder(order, []int{0, 1, 2}) {
		t.Errorf("order %v", order)
	}
}

// Places given back from the front keep the order exact; so do places given
// back further back, for callers that re-try at the times they were given.
func TestFIFOCancel(t *testing.T) {
	_, clk, b := fifoSetup(t)
	conns := holdAll(t, clk, b, 5)
	conns[0].w.Cancel()
	conns[0].w.Cancel() // twice is harmless
	conns[1].w.Cancel()
	if conns[0].w.Waiting() || b.Stats().Waiting != 3 {
		t.Fatalf("waiting %v %d", conns[0].w.Waiting(), b.Stats().Waiting)
	}
	live := conns[2:]
	for _, c := range live {
		c.wake = clk.Now() // all at once, the latest first
	}
	if order := drive(t, clk, b, live, 1); !equalOrder(order, []int{2, 3, 4}) {
		t.Errorf("order %v", order)
	}

	clk.Advance(time.Second)
	wantAdmit(t, b, Blocking, 10, FreePool)
	conns = holdAll(t, clk, b, 6)
	conns[2].w.Cancel()
	conns[4].w.Cancel()
	conns[0].w.Cancel()
	live = []*fifoConn{conns[1], conns[3], conns[5]} // at their own times
	if order := drive(t, clk, b, live, 1); !equalOrder(order, []int{1, 3, 5}) {
		t.Errorf("order %v", order)
	}
	if s := b.Stats(); s.Waiting != 0 {
		t.Errorf("after: waiting %d", s.Waiting)
	}
	// The line is empty: a newcomer with room runs at once.
	clk.Advance(time.Second)
	wantAdmit(t, b, Blocking, 1, FreePool)
}

// A first place that never comes back is forgiven after abandonAfter, and
// nobody else is; when it does come back it is first in line.
func TestFIFOAbandonedHead(t *testing.T) {
	_, clk, b := fifoSetup(t)
	conns := holdAll(t, clk, b, 4)
	lost := conns[0]
	lost.wake = -1 // never re-tries
	order := drive(t, clk, b, conns[1:], 1)
	if !equalOrder(order, []int{1, 2, 3}) {
		t.Fatalf("order %v", order)
	}
	// Skipped only after abandonAfter past its time (10 ms).
	if s := b.Stats(); s.Commands != 4 || s.Waiting != 0 {
		t.Errorf("stats %+v", s)
	}
	var other Waiter
	if d, _ := b.Admit(&other, Blocking); d != Held {
		t.Fatal("other admitted")
	}
	clk.Advance(time.Second)
	if d, _ := b.Admit(&lost.w, Blocking); d != FreePool || lost.w.Waiting() {
		t.Fatalf("late head: %v", d)
	}
	b.Charge(FreePool, 1)
	clk.Advance(ms)
	if d, _ := b.Admit(&other, Blocking); d != FreePool {
		t.Fatalf("other: %v", d)
	}
}

// A lost place is forgiven no sooner than abandonAfter after its room came.
func TestFIFOForgiveLostPlace(t *testing.T) {
	_, clk, b := fifoSetup(t) // room at 1.010 s
	conns := holdAll(t, clk, b, 2)
	clk.Set(time.Second + 10*ms + time.Duration(abandonAfter) - 1)
	if d, _ := b.Admit(&conns[1].w, Blocking); d != Held {
		t.Fatal("forgiven too early")
	}
	clk.Advance(1)
	if d, _ := b.Admit(&conns[1].w, Blocking); d != FreePool {
		t.Fatal("not forgiven")
	}
}

// A place in another bucket's line is given back when the waiter moves.
func TestFIFOWaiterMoves(t *testing.T) {
	e, clk, b := fifoSetup(t)
	c := addBucket(t, e, "c", 0, Unlimited)
	var w Waiter
	if d, _ := b.Admit(&w, Blocking); d != Held {
		t.Fatal("not held")
	}
	if d, _ := c.Admit(&w, Blocking); d != FreePool || w.Waiting() {
		t.Fatalf("moved: %v waiting=%v", d, w.Waiting())
	}
	clk.Advance(10 * ms)
	wantAdmit(t, b, Blocking, 1, FreePool) // b's line is empty again
}

// Hammer one engine from several goroutines, with limit changes, under -race.
func TestConcurrent(t *testing.T) {
	e, err := New(Config{Capacity: 200000, Burst: ms})
	if err != nil {
		t.Fatal(err)
	}
	bs := []*Bucket{addBucket(t, e, "a", 1000, 50000), addBucket(t, e, "b", 0, Unlimited)}
	var admitted, units [2]atomic.Uint64
	var hammers, config sync.WaitGroup
	stop := make(chan struct{})
	for g := 0; g < 6; g++ {
		hammers.Add(1)
		go func(g int) {
			defer hammers.Done()
			r := rand.New(rand.NewSource(int64(g)))
			var w Waiter
			for i := 0; i < 20000; i++ {
				k := r.Intn(2) // switching buckets gives the old place back
				d, wait := bs[k].Admit(&w, Mode(r.Intn(3)))
				if d == Held {
					if wait <= 0 {
						t.Errorf("held with wait %v", wait)
						return
					}
					if r.Intn(50) == 0 {
						w.Cancel()
					}
					continue
				}
				admitted[k].Add(1)
				u := int64(r.Intn(5)) // 0 counts as 1
				units[k].Add(uint64(max(u, 1)))
				bs[k].Charge(d, u)
			}
			w.Cancel()
		}(g)
	}
	config.Add(1)
	go func() {
		defer config.Done()
		r := rand.New(rand.NewSource(99))
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = bs[0].SetLimits(Limit(r.Intn(2000)), Limit(2000+r.Intn(100000)))
			_ = e.SetCapacity(Limit(100000 + r.Intn(200000)))
			if x, err := e.AddBucket("x", 10, 20); err == nil {
				x.Admit(nil, Blocking)
				_ = e.RemoveBucket("x")
			}
			_ = bs[1].Stats()
			time.Sleep(100 * time.Microsecond)
		}
	}()
	hammers.Wait()
	close(stop)
	config.Wait()
	for k, b := range bs {
		if s := b.Stats(); s.Commands != admitted[k].Load() || s.Units != units[k].Load() || s.Waiting != 0 {
			t.Errorf("%s: commands %d units %d, admitted %d units %d, waiting %d",
				b.Name(), s.Commands, s.Units, admitted[k].Load(), units[k].Load(), s.Waiting)
		}
	}
}

// Admit, Charge and Cancel allocate nothing, held or not.
func TestNoAllocs(t *testing.T) {
	e, clk := newEngine(t, 10000, ms)
	a := addBucket(t, e, "a", 100, 1000)
	var w1, w2 Waiter
	allocs := testing.AllocsPerRun(1000, func() {
		for _, mode := range []Mode{Blocking, NonBlocking, Unthrottled} {
			if d, _ := a.Admit(&w1, mode); d != Held {
				a.Charge(d, 5)
			}
		}
		a.Admit(&w2, Blocking)
		w2.Cancel()
		clk.Advance(100 * time.Microsecond)
		_ = a.Stats()
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run", allocs)
	}
	if a.Stats().Held == 0 {
		t.Error("never held: the test does not cover the held path")
	}
}

// A limit change through "unlimited" (or 0) forgives the gauge's debt: kept
// as it was, in nanoseconds of the old, slow rate, it would be read at the
// new, fast rate and hold the bucket for as long as the old rate needed.
func TestLimitChangeThroughUnlimitedForgivesDebt(t *testing.T) {
	e, _ := newEngine(t, Unlimited, 0)
	b := addBucket(t, e, "a", 0, 10)
	wantAdmit(t, b, Blocking, 256, FreePool) // a 1 MiB value: 25.6 s of debt at 10/s

	// Direct change 10 -> 100000: the debt is rescaled (2.56 ms).
	ref := addBucket(t, e, "ref", 0, 10)
	wantAdmit(t, ref, Blocking, 256, FreePool)
	if err := ref.SetLimits(0, 100000); err != nil {
		t.Fatal(err)
	}
	_, refWait := ref.Admit(nil, Blocking)

	// Same change, via "unlimited" in between.
	if err := b.SetLimits(0, Unlimited); err != nil {
		t.Fatal(err)
	}
	if err := b.SetLimits(0, 100000); err != nil {
		t.Fatal(err)
	}
	d, wait := b.Admit(nil, Blocking)
	t.Logf("direct: wait %v; via unlimited: %v %v", refWait, d, wait)
	if d == Held && wait > 100*time.Millisecond {
		t.Fatalf("hard limit 100000/s after 10 -> unlimited -> 100000: held for %v (stale debt of the 10/s rate); direct change waits %v", wait, refWait)
	}
}

// The same for a reservation going 10 -> 0 -> 10000: the new reservation
// is honoured at once, not after the old debt's 25.6 s at 10/s.
func TestReservationChangeThroughZeroForgivesDebt(t *testing.T) {
	e, _ := newEngine(t, 10000, 0)
	b := addBucket(t, e, "a", 10, 10)
	wantAdmit(t, b, Blocking, 256, Reserved) // 25.6 s of debt at 10/s
	if err := b.SetLimits(0, Unlimited); err != nil {
		t.Fatal(err)
	}
	if err := b.SetLimits(10000, 10000); err != nil { // the whole node reserved for a
		t.Fatal(err)
	}
	d, wait := b.Admit(nil, Blocking)
	if d == Held && wait > 100*time.Millisecond {
		t.Fatalf("reservation 10000/s: held for %v (stale debt of the old 10/s reservation)", wait)
	}
}

// And for the free pool, via capacity "unlimited".
func TestCapacityChangeThroughUnlimitedForgivesDebt(t *testing.T) {
	e, _ := newEngine(t, 10, 0)
	b := addBucket(t, e, "a", 0, Unlimited)
	wantAdmit(t, b, Blocking, 256, FreePool) // 25.6 s of pool debt at 10/s
	if err := e.SetCapacity(Unlimited); err != nil {
		t.Fatal(err)
	}
	if err := e.SetCapacity(100000); err != nil {
		t.Fatal(err)
	}
	d, wait := b.Admit(nil, Blocking)
	if d == Held && wait > 100*time.Millisecond {
		t.Fatalf("capacity 100000/s after 10 -> unlimited -> 100000: held for %v", wait)
	}
}

// Stats.Held ("commands held at least once", kvthrottle_throttled_total)
// does not count a command that takes a place behind a waiter and is
// admitted by the same Admit, the gauges having room for both.
//
// The commands are of 1 unit, so that the room for the place ahead is one
// unit (the bucket's average command): 50 ms at 1000 units/s leave room
// for both.
func TestHeldCountsOnlyHeldCommands(t *testing.T) {
	e, clk := newEngine(t, 1000, 100*time.Millisecond)
	b := addBucket(t, e, "a", 0, Unlimited)
	var first Waiter
	for i := 0; ; i++ { // use up the burst, 1 unit at a time, until first is held
		if d, _ := run(b, &first, Blocking, 1); d == Held {
			break
		}
		if i > 1000 {
			t.Fatal("never held")
		}
	}
	clk.Advance(50 * time.Millisecond) // room for about 50 commands; first has not re-tried yet
	var newcomer Waiter
	if d, wait := b.Admit(&newcomer, Blocking); d == Held {
		t.Fatalf("newcomer held for %v behind one 1-unit place with 50 units of room", wait)
	}
	if s := b.Stats(); s.Held != 1 {
		t.Fatalf("newcomer admitted at once, yet Held = %d (want 1: only the first was held)", s.Held)
	}
}

// FIFO holds when the reservation is what limits the bucket: with the free
// pool taken by another tenant, the bucket's room grows at its reservation's
// rate only, and a place behind another must not take the room of the place
// ahead, even when that one re-tries a little late.
func TestFIFOWhileAnotherTenantTakesThePool(t *testing.T) {
	e, clk := newEngine(t, 11000, 20*time.Millisecond)
	a := addBucket(t, e, "a", 1000, Unlimited) // free pool: 10000/s
	other := addBucket(t, e, "other", 0, Unlimited)
	wantAdmit(t, other, Blocking, 10000, FreePool) // the pool is busy for 1 s
	for i := 0; ; i++ {                            // a runs on its reservation until held
		if d, _ := run(a, nil, Blocking, 1); d == Held {
			break
		}
		if i > 1000 {
			t.Fatal("never held")
		}
	}
	var conns []*fifoConn
	for i := range 3 {
		c := &fifoConn{id: i}
		d, wait := a.Admit(&c.w, Blocking)
		if d != Held {
			t.Fatalf("conn %d not held", i)
		}
		c.wake = clk.Now() + wait
		conns = append(conns, c)
	}
	conns[0].wake += 500 * time.Microsecond // late, well within the wake-up tolerance
	if order := drive(t, clk, a, conns, 1); !equalOrder(order, []int{0, 1, 2}) {
		t.Fatalf("order %v, want [0 1 2]", order)
	}
}
