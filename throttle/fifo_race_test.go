package throttle

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// Two Admits on two event loops that find the same room unclaimed at the
// same moment forgive one place between them, not one each. Probabilistic:
// counts the runs where served moved by 2 on one forgiveness opportunity
// (about 1 in 100,000 runs did before forgiveness was claimed).
//
// Under -race a tenth of the runs: each run has the two Admits race for
// the same room, so 30,000 runs give the race detector that overlap
// 30,000 times (a data race shows in the first few); the double
// forgiveness itself, a logic race too rare for 30,000 runs to catch
// reliably, is counted over the full 300,000 runs without -race (make
// test-norace).
func TestFIFOConcurrentForgivenessForgivesOne(t *testing.T) {
	runs := testmc.UnderRace(300000, 30000)
	double := 0
	for iter := 0; iter < runs; iter++ {
		e, clk := newEngine(t, Unlimited, 0)
		b := addBucket(t, e, "a", 0, 1000)
		t0 := clk.Now()
		wantAdmit(t, b, Blocking, 1, FreePool)
		ws := make([]Waiter, 6)
		for i := range ws {
			b.Admit(&ws[i], Blocking)
		}
		clk.Set(t0 + time.Duration(abandonAfter) + 10*ms) // places 1..4 stalled; 5 and 6 re-try at once on two loops
		var wg sync.WaitGroup
		var ready atomic.Int32
		for _, w := range []*Waiter{&ws[4], &ws[5]} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ready.Load() == 0 {
				}
				b.Admit(w, Blocking)
			}()
		}
		ready.Store(1)
		wg.Wait()
		if s := b.served.Load(); s >= 2 {
			double++
		}
	}
	if double > 0 {
		t.Errorf("%d of %d runs forgave two places in the same instant", double, runs)
	}
}
