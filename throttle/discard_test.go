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
			var got int64
			start := clk.Now()
			for clk.Now()-start < 2*time.Second {
				n, wait := b.Discard(1<<40, unit)
				got += n
				if wait <= 0 || wait == InfDuration {
					t.Fatalf("Discard of more than granted: wait %v", wait)
				}
				clk.Advance(wait)
			}
			elapsed := clk.Now() - start
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
