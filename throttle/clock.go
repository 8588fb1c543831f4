package throttle

import (
	"slices"
	"sync"
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

// Timer is a call of a function armed for a later reading of a Clock (see
// [AfterFunc]). Its methods are those of [time.Timer].
type Timer interface {
	// Reset re-arms the timer to fire d after now; it reports whether the
	// timer was armed.
	Reset(d time.Duration) bool
	// Stop disarms the timer; it reports whether the timer was armed.
	Stop() bool
}

// AfterFunc calls f in its own goroutine once c has moved d past its
// reading now: for a [FakeClock], when an Advance or Set brings it there
// (so that whatever a test's clock makes due happens at that reading, not
// after some real time); for any other clock, after d of real time
// ([time.AfterFunc]).
func AfterFunc(c Clock, d time.Duration, f func()) Timer {
	if fc, ok := c.(*FakeClock); ok {
		t := &fakeTimer{c: fc, f: f}
		t.Reset(d)
		return t
	}
	return time.AfterFunc(d, f)
}

// AtFunc calls f in its own goroutine once c reads at or later: for a
// [FakeClock], when an Advance or Set brings it there (at once if it
// already does); for any other clock, after at less c's reading now of
// real time. A caller that knows the reading it must wake at uses AtFunc
// (and [ResetAt]), not AfterFunc with a delay computed from an earlier
// reading: a FakeClock moved between the two would fire that delay after
// its new reading, past at, and a test waiting at a reading past at for
// what at makes due would wait forever.
func AtFunc(c Clock, at time.Duration, f func()) Timer {
	if fc, ok := c.(*FakeClock); ok {
		t := &fakeTimer{c: fc, f: f}
		t.resetAt(at)
		return t
	}
	return time.AfterFunc(at-c.Now(), f)
}

// ResetAt re-arms t, a timer of c (from [AtFunc] or [AfterFunc]), to fire
// once c reads at; it reports whether t was armed.
func ResetAt(c Clock, t Timer, at time.Duration) bool {
	if ft, ok := t.(*fakeTimer); ok && ft.c == c {
		return ft.resetAt(at)
	}
	return t.Reset(at - c.Now())
}

// FakeClock is a Clock that moves only when told to, for tests. The zero
// value reads 0. It is safe for concurrent use.
type FakeClock struct {
	ns atomic.Int64

	mu     sync.Mutex
	timers map[*fakeTimer]struct{} // armed timers (AfterFunc)
}

// NewFakeClock returns a FakeClock reading t.
func NewFakeClock(t time.Duration) *FakeClock {
	c := &FakeClock{}
	c.ns.Store(int64(t))
	return c
}

// Now returns the clock's current reading.
func (c *FakeClock) Now() time.Duration { return time.Duration(c.ns.Load()) }

// Advance moves the clock forward by d (a negative d is ignored) and
// fires the timers the new reading makes due.
func (c *FakeClock) Advance(d time.Duration) {
	if d > 0 {
		c.ns.Add(int64(d))
		c.fire()
	}
}

// Set sets the clock to t and fires the timers that makes due. Setting it
// backwards is allowed only in tests that know what they do: the engine
// assumes a monotonic clock.
func (c *FakeClock) Set(t time.Duration) {
	c.ns.Store(int64(t))
	c.fire()
}

// fire disarms every timer due at the clock's reading and starts its
// function, each in its own goroutine as time.AfterFunc does.
func (c *FakeClock) fire() {
	now := c.Now()
	c.mu.Lock()
	var due []func()
	for t := range c.timers {
		if t.at <= now {
			delete(c.timers, t)
			due = append(due, t.f)
		}
	}
	c.mu.Unlock()
	for _, f := range due {
		go f()
	}
}

// fakeTimer is a Timer of a FakeClock.
type fakeTimer struct {
	c  *FakeClock
	f  func()
	at time.Duration // the reading it fires at; guarded by c.mu
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	return t.resetAt(t.c.Now() + d)
}

// resetAt arms t for the reading at, and fires it if the clock is there.
func (t *fakeTimer) resetAt(at time.Duration) bool {
	c := t.c
	c.mu.Lock()
	_, armed := c.timers[t]
	t.at = at
	if c.timers == nil {
		c.timers = make(map[*fakeTimer]struct{})
	}
	c.timers[t] = struct{}{}
	c.mu.Unlock()
	if at <= c.Now() {
		c.fire()
	}
	return armed
}

func (t *fakeTimer) Stop() bool {
	c := t.c
	c.mu.Lock()
	_, armed := c.timers[t]
	delete(c.timers, t)
	c.mu.Unlock()
	return armed
}

// Armed returns the readings at which the clock's armed timers (AfterFunc)
// will fire, earliest first: a test reads what the code under test
// scheduled, and when, before it moves the clock.
func (c *FakeClock) Armed() []time.Duration {
	c.mu.Lock()
	at := make([]time.Duration, 0, len(c.timers))
	for t := range c.timers {
		at = append(at, t.at)
	}
	c.mu.Unlock()
	slices.Sort(at)
	return at
}
