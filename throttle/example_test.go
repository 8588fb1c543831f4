package throttle_test

import (
	"fmt"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// A proxy session admits each metered command, holds the connection when
// told to, and charges the command's units when the response is in.
func Example() {
	clock := throttle.NewFakeClock(0) // the proxy passes nil: the real clock
	// A burst of 1 ms: one unit at 1000 units/s. Every bill must fit in
	// it (or, if larger, find the gauge paid up).
	engine, _ := throttle.New(throttle.Config{Capacity: 10000, Burst: time.Millisecond, Clock: clock})
	bucket, _ := engine.AddBucket("default", 0, 1000) // 1000 units/s at most

	var w throttle.Waiter // one per connection
	run := func(valueBytes int64) {
		for {
			d, wait := bucket.Admit(&w, throttle.Blocking)
			if d == throttle.Held {
				// Hold the connection: stop dispatching its commands and wake
				// it after wait (a non-blocking client gets EWouldThrottle with
				// next_tick_us = ceil(wait/1µs) instead). Here: sleep on the
				// fake clock.
				fmt.Printf("%v: held for %v\n", clock.Now(), wait)
				clock.Advance(wait)
				continue
			}
			// ... send upstream; when the response is in:
			bucket.Charge(d, throttle.ReadUnits(valueBytes, throttle.DefaultUnitSize))
			fmt.Printf("%v: ran a %d-byte GET against the %v\n", clock.Now(), valueBytes, d)
			return
		}
	}
	run(100)
	run(40960) // 10 units: 10 ms of debt at 1000 units/s
	run(100)
	// When the connection closes while held: w.Cancel().
	w.Cancel()
	fmt.Println(bucket.Stats().Units, "units")

	// Output:
	// 0s: ran a 100-byte GET against the free_pool
	// 0s: held for 1ms
	// 1ms: ran a 40960-byte GET against the free_pool
	// 1ms: held for 10ms
	// 11ms: ran a 100-byte GET against the free_pool
	// 12 units
}
