package throttle

import (
	"testing"
	"time"
)

// Discard drops a client's refused bytes at the bucket's fastest rate in
// units of the unit size: over 2 s of a client pushing without pause, the
// bytes granted are 2 s of the rate plus one burst (and a byte), never
// more, and nearly all of that; the waits it gives are what the caller
// sleeps. Unlimited buckets drop at once; a bucket whose fastest rate is
// 0 never drops.
func TestDiscardPacesAtTheFastestRate(t *testing.T) {
	const unit = 4096
	for _, tc := range []struct {
		name           string
		capacity       Limit
		reserved, hard Limit
		rate           int64
	}{
		{"hard limit", Unlimited, 0, 500, 500},
		{"reservation plus pool", 3000, 1000, Unlimited, 3000},
		{"pool below the hard limit", 2500, 0, 4000, 2500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clk := newEngine(t, tc.capacity, 100*ms)
			b := addBucket(t, e, "b", tc.reserved, tc.hard)
			perSec := tc.rate * unit
			got, elapsed := discardFor(t, b, clk, unit, 2*time.Second)
			most := perSec*int64(elapsed)/int64(time.Second) + perSec/10 + 1
			if got > most || got < most*98/100 {
				t.Fatalf("granted %d bytes in %v at %d units/s of %d bytes: want at most %d, at least 98%% of it", got, elapsed, tc.rate, unit, most)
			}
		})
	}
	e, _ := newEngine(t, Unlimited, 100*ms)
	if n, wait := addBucket(t, e, "free", 0, Unlimited).Discard(5<<20, unit); n != 5<<20 || wait != 0 {
		t.Fatalf("unlimited bucket: Discard = %d, %v; want everything at once", n, wait)
	}
	if n, wait := addBucket(t, e, "closed", 0, 0).Discard(5<<20, unit); n != 0 || wait != InfDuration {
		t.Fatalf("hard limit 0: Discard = %d, %v; want nothing, ever", n, wait)
	}
}

// Discard with no burst (burst_ms = 0): a gauge paid up grants one unit's
// bytes, as rule 2 admits a bill larger than the burst on a gauge paid
// up, and the wait it gives is until the gauge is paid up again. So
// refused bytes are dropped at the rate, never more than one unit ahead
// (issue 28 review: with no room ever, Discard granted nothing, and a
// connection that sent a write too large for memcached stalled forever).
func TestDiscardWithoutBurst(t *testing.T) {
	const unit, rate = 4096, 10
	e, clk := newEngine(t, Unlimited, 0)
	b := addBucket(t, e, "b", 0, rate)
	got, elapsed := discardFor(t, b, clk, unit, 2*time.Second)
	paid := rate * unit * int64(elapsed) / int64(time.Second)
	if got > paid+unit || got < paid*98/100 {
		t.Fatalf("granted %d bytes in %v at %d units/s of %d bytes with no burst: want %d (98%%) to %d", got, elapsed, rate, unit, paid*98/100, paid+unit)
	}
}

// discardFor has a client push refused bytes to b without pause for d of
// clk, sleeping the waits Discard gives, and returns the bytes granted and
// the time it took.
func discardFor(t *testing.T, b *Bucket, clk *FakeClock, unit int64, d time.Duration) (got int64, elapsed time.Duration) {
	t.Helper()
	start := clk.Now()
	for clk.Now()-start < d {
		n, wait := b.Discard(1<<40, unit)
		got += n
		if wait <= 0 || wait == InfDuration {
			t.Fatalf("after %d bytes: Discard of more than granted: wait %v", got, wait)
		}
		clk.Advance(wait)
	}
	return got, clk.Now() - start
}
