package throttle

import (
	"sync/atomic"
	"time"
)

// Clock is a monotonic clock: Now returns the time elapsed since an
// arbitrary fixed origin. It must be safe for concurrent use and never go
// backwards.
type Clock interface {
	Now() time.Duration
}

type realClock struct{ start time.Time }

func (c realClock) Now() time.Duration { return time.Since(c.start) }

// NewRealClock returns a Clock reading the process's monotonic clock, with
// its origin at the call.
func NewRealClock() Clock { return realClock{start: time.Now()} }

// FakeClock is a Clock that moves only when told to, for tests. The zero
// value reads 0. It is safe for concurrent use.
type FakeClock struct{ ns atomic.Int64 }

// NewFakeClock returns a FakeClock reading t.
func NewFakeClock(t time.Duration) *FakeClock {
	c := &FakeClock{}
	c.ns.Store(int64(t))
	return c
}

// Now returns the clock's current reading.
func (c *FakeClock) Now() time.Duration { return time.Duration(c.ns.Load()) }

// Advance moves the clock forward by d (a negative d is ignored).
func (c *FakeClock) Advance(d time.Duration) {
	if d > 0 {
		c.ns.Add(int64(d))
	}
}

// Set sets the clock to t. Setting it backwards is allowed only in tests
// that know what they do: the engine assumes a monotonic clock.
func (c *FakeClock) Set(t time.Duration) { c.ns.Store(int64(t)) }
