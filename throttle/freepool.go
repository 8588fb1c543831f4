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
	// FreePoolFair splits the free pool among the buckets that want more
	// of it by weighted max-min (see [Engine.SetFreePoolMode]).
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
//
// In FreePoolFair mode the free pool goes, whenever buckets want more of it
// than it has, to the bucket that has drawn the least of it per unit of
// weight; a bucket may run ahead of that one by 4 ms of the pool's rate (at
// weight 1) and one command. A bucket wants more of the pool while a caller
// of it is held by the pool or its turn: a Blocking caller for as long as
// it holds its place in the line (however late it comes back), another
// until 1 ms past the wait it was given. The buckets that want more thus
// get shares of the pool in proportion to their weights, a bucket that asks
// for less gets what it asks for and one capped by its hard limit its cap,
// and the rest goes to the others at once (weighted max-min, as
// [WaterFill] computes it). A bucket that comes back from idle starts level
// with the one furthest behind: it banks nothing. Units of Unthrottled
// callers count towards their bucket's turn up to the lag bound only (all
// of them still count against the pool, whose debt every bucket waits
// out). The split is recomputed at most every 2 ms; admission stays
// lock-free and allocation-free. Switching to fair mode starts every
// bucket within the lag bound of the one furthest ahead.
func (e *Engine) SetFreePoolMode(m FreePoolMode) error {
	if !m.Valid() {
		return ErrInvalidFreePoolMode
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if FreePoolMode(e.mode.Swap(uint32(m))) == m {
		return nil
	}
	now := e.now()
	if m == FreePoolFair {
		e.fair.mu.Lock()
		e.fairRecompute(now, true)
		e.fair.mu.Unlock()
	}
	e.publishNode(now)
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
	b.publishVInc()
	return nil
}

// ShareWeight returns the weight set with SetShareWeight (0: none; fair
// mode then splits by Weight).
func (b *Bucket) ShareWeight() int { return int(b.shareWeight.Load()) }

// SetShareWeight sets the weight fair mode splits the free pool by in
// place of Weight, which stays what it is (and is what is shown): in fleet
// mode the store decides each bucket's share of this instance's free pool,
// and the instance splits its pool in proportion to those shares. w = 0
// goes back to Weight. It applies at once and fails with
// ErrInvalidWeight for w outside 0..MaxWeight. Safe from any goroutine.
func (b *Bucket) SetShareWeight(w int) error {
	if w < 0 || w > MaxWeight {
		return ErrInvalidWeight
	}
	b.shareWeight.Store(uint32(w))
	b.publishVInc()
	return nil
}

// publishVInc sets the virtual time per unit from the weight in force.
func (b *Bucket) publishVInc() {
	w := b.shareWeight.Load()
	if w == 0 {
		w = b.weight.Load()
	}
	b.vInc.Store(vIncFor(int(w)))
}
