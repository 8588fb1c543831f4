package throttle

import "sync/atomic"

// Bucket is one tenant's throttle state. Get it from Engine.AddBucket or
// Engine.Bucket; all methods are safe for concurrent use.
type Bucket struct {
	e    *Engine
	name string
	lim  atomic.Pointer[bucketLimits]
	slot atomic.Int64 // the last window slot snapshotted
	// weight of the bucket's share of the free pool in fair mode; has no
	// effect in fcfs mode (1..MaxWeight, see SetWeight)
	weight atomic.Uint32
	// shareWeight replaces weight in fair mode when not 0 (SetShareWeight)
	shareWeight atomic.Uint32
	_           [cacheLine]byte

	// written by every admission (and charge of more than one unit)
	res, hard gauge
	commands  atomic.Uint64 // commands admitted: their first units
	extra     atomic.Uint64 // units charged beyond the first of each command
	debt      atomic.Int64  // units owed, billed with the next command (Owe)
	_         [cacheLine]byte

	stocked atomic.Int64 // leases holding a stock of the bucket's units (see lease.go)
	_       [cacheLine]byte

	// the ceiling of its reads (readcost.go): read by every read's
	// admission, written by raises (rare)
	rc ReadCost
	_  [cacheLine]byte

	// fair sharing of the free pool (see fair.go), written by its bills
	vt         atomic.Int64 // virtual time: units drawn on the pool, 1/weight each
	vInc       atomic.Int64 // virtual time per unit: vScale / weight
	wantUntil  atomic.Int64 // wants more of the pool than it gets until then
	poolHeld   atomic.Bool  // its callers were last held by the pool or their turn
	placeUntil atomic.Int64 // its places so held count as wanting until then
	_          [cacheLine]byte

	// snapshots of commands+extra, written once per window slot
	window window
	_      [cacheLine]byte

	// the FIFO line, written only when somebody is held
	tail       atomic.Uint64    // places handed out
	served     atomic.Uint64    // places admitted or given back
	lastServed atomic.Int64     // when served last moved
	forgiven   [8]atomic.Uint64 // places forgiven as lost, by place number mod 8, until they come back
	held       atomic.Uint64
	rejected   atomic.Uint64
	// moved by a hold while leases hold stock: they give it back (lease.go)
	recall atomic.Uint64
	_      [cacheLine]byte

	// bytes dropped unread (discard.go), written only then
	discard gauge
}

type bucketLimits struct {
	reserved, hard Limit
	res, hrd       rate
	removed        bool
}

func newBucketLimits(reserved, hard Limit, removed bool) *bucketLimits {
	return &bucketLimits{reserved: reserved, hard: hard, res: newRate(reserved), hrd: newRate(hard), removed: removed}
}

// Name returns the bucket's name.
func (b *Bucket) Name() string { return b.name }

// Limits returns the bucket's reservation and hard limit.
func (b *Bucket) Limits() (reserved, hard Limit) {
	l := b.lim.Load()
	return l.reserved, l.hard
}

// SetLimits changes the bucket's reservation and hard limit at once; both
// gauges keep their debt and what they have banked, in units (a rate that
// rises does not raise the room at once: it fills to the new burst at the
// new rate; debt is forgiven by a change to or from Unlimited or 0), and
// the free pool is
// recomputed. It fails with ErrInvalidLimit, ErrReservedOverHard, or
// ErrUnknownBucket after RemoveBucket. Callers should re-try held commands
// afterwards: their waits may have become shorter.
func (b *Bucket) SetLimits(reserved, hard Limit) error {
	if err := validate(reserved, hard); err != nil {
		return err
	}
	e := b.e
	e.mu.Lock()
	defer e.mu.Unlock()
	old := b.lim.Load()
	if old.removed {
		return ErrUnknownBucket
	}
	now := e.now()
	n := newBucketLimits(reserved, hard, false)
	b.lim.Store(n)
	b.res.rescale(now, e.burst, &old.res, &n.res)
	b.hard.rescale(now, e.burst, &old.hrd, &n.hrd)
	e.publishNode(now)
	return nil
}
