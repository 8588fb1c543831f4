package throttle

import (
	"errors"
	"fmt"
)

// Bucket weights (DESIGN.md section 13): integers, so that shares are exact
// ratios an operator can read ("1:2:3") and virtual-time arithmetic stays in
// integers.
const (
	// DefaultWeight is the weight of a bucket that does not set one.
	DefaultWeight = 1
	// MaxWeight is the largest weight: 10000:1 is far beyond any useful
	// ratio of shares, and keeps weight sums and products with rates
	// (MaxUnits) well within int64.
	MaxWeight = 10000
)

// ErrInvalidWeight is returned by [Bucket.SetWeight] for a weight outside
// 1..MaxWeight.
var ErrInvalidWeight = fmt.Errorf("throttle: invalid weight (want 1 to %d)", MaxWeight)

// ErrInvalidFreePoolMode is returned by [Engine.SetFreePoolMode] for a mode
// other than FreePoolFCFS and FreePoolFair.
var ErrInvalidFreePoolMode = errors.New("throttle: invalid free pool mode")

// FreePoolMode is how the free pool is shared among the buckets that want
// more than their reservation (DESIGN.md section 13).
type FreePoolMode uint32

// The free pool modes.
const (
	// FreePoolFCFS shares the free pool first come, first served (the
	// seed's rule; the default, the zero value).
	FreePoolFCFS FreePoolMode = iota
	// FreePoolFair splits the free pool by weighted max-min. The engine
	// records the mode, but admission does not read it yet: until the fair
	// algorithm lands it admits first come, first served in both modes.
	FreePoolFair
)

// String returns the mode's configuration spelling: "fcfs" or "fair"
// ("FreePoolMode(N)" for an invalid value).
func (m FreePoolMode) String() string {
	switch m {
	case FreePoolFCFS:
		return "fcfs"
	case FreePoolFair:
		return "fair"
	}
	return fmt.Sprintf("FreePoolMode(%d)", uint32(m))
}

// Valid reports whether m is one of the defined modes.
func (m FreePoolMode) Valid() bool { return m == FreePoolFCFS || m == FreePoolFair }

// FreePoolMode returns the engine's free pool mode (FreePoolFCFS until
// SetFreePoolMode changes it).
func (e *Engine) FreePoolMode() FreePoolMode { return FreePoolMode(e.mode.Load()) }

// SetFreePoolMode changes the engine's free pool mode at once. It fails with
// ErrInvalidFreePoolMode. Safe from any goroutine.
func (e *Engine) SetFreePoolMode(m FreePoolMode) error {
	if !m.Valid() {
		return ErrInvalidFreePoolMode
	}
	e.mode.Store(uint32(m))
	return nil
}

// Weight returns the bucket's weight, 1..MaxWeight (DefaultWeight until
// SetWeight changes it).
func (b *Bucket) Weight() int { return int(b.weight.Load()) }

// SetWeight changes the weight of the bucket's share of the free pool in
// fair mode; it has no effect in fcfs mode. It applies at once, also to a
// removed bucket, and fails with ErrInvalidWeight for w outside
// 1..MaxWeight. Safe from any goroutine.
func (b *Bucket) SetWeight(w int) error {
	if w < 1 || w > MaxWeight {
		return ErrInvalidWeight
	}
	b.weight.Store(uint32(w))
	return nil
}
