package fleet

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestFleetTicksOnItsClock: the periodic work runs on the Fleet's clock,
// not on real time: with a fake clock standing still nothing happens after
// Start's sync, however long the test waits; each twentieth of a period
// the clock is moved brings one sample, each period one sync. With
// Store.SetClock the store's time is that clock's reading, in the member
// record the script keeps (its first field, in ms), not Redis's TIME.
func TestFleetTicksOnItsClock(t *testing.T) {
	st, rdb := realStore(t, "clock")
	clock := throttle.NewFakeClock(time.Hour)
	st.SetClock(clock)
	var samples, syncs atomic.Int64
	f, err := New(Config{Store: st, Instance: "i0", Period: time.Second, Clock: clock, CallTimeout: time.Minute}, Hooks{
		Usage: func(dst []Usage) (Node, []Usage) {
			samples.Add(1)
			return Node{Capacity: throttle.Unlimited, FreePool: throttle.Unlimited},
				append(dst, Usage{Name: "b", Reserved: 0, HardLimit: 300})
		},
		State:   func([]byte, string) error { return nil },
		Seed:    func() []byte { return []byte(`{}`) },
		Granted: func(*Grants) {},
		Synced: func(_ time.Duration, err error) {
			if err != nil {
				t.Errorf("sync: %v", err)
			}
			syncs.Add(1)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	f.Start()
	defer f.Close()
	// waitTicks moves the clock by d and waits until every tick due has run.
	waitTicks := func(d time.Duration) {
		t.Helper()
		clock.Advance(d)
		deadline := time.Now().Add(time.Minute) // liveness
		for f.NextTick() <= clock.Now() {
			if time.Now().After(deadline) {
				t.Fatalf("at %v the tick due at %v has not run", clock.Now(), f.NextTick())
			}
			time.Sleep(time.Millisecond)
		}
	}
	s0, y0 := samples.Load(), syncs.Load() // Start: one sample, one sync (2 Usage calls)
	time.Sleep(200 * time.Millisecond)     // four ticks' worth of real time
	if s, y := samples.Load(), syncs.Load(); s != s0 || y != y0 {
		t.Fatalf("with the clock standing still: %d samples and %d syncs after Start's, want none", s-s0, y-y0)
	}
	for k := 1; k < samplesPerPeriod; k++ {
		waitTicks(50 * time.Millisecond)
	}
	if s, y := samples.Load()-s0, syncs.Load()-y0; s != samplesPerPeriod-1 || y != 0 {
		t.Fatalf("19 ticks: %d Usage calls and %d syncs, want 19 samples and no sync", s, y)
	}
	waitTicks(50 * time.Millisecond)
	if s, y := samples.Load()-s0, syncs.Load()-y0; s != samplesPerPeriod+1 || y != 1 {
		t.Fatalf("a period: %d Usage calls and %d syncs, want 20 samples and one sync's report, one sync", s, y)
	}
	rec, err := rdb.HGet(t.Context(), st.keys[1], "i0").Result()
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprint((time.Hour + time.Second).Milliseconds()); strings.Fields(rec)[0] != want {
		t.Errorf("member record %q: last seen at %s, want the fake clock's %s ms", rec, strings.Fields(rec)[0], want)
	}
}
