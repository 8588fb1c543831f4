package throttle

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBurst is the burst used when Config.Burst is zero: every gauge may
// run this much of its rate ahead (20 ms of rate, i.e. 200 units at 10000
// units/s), which absorbs wake-up latency without losing throughput.
const DefaultBurst = 20 * time.Millisecond

// Errors returned by the configuration methods.
var (
	ErrInvalidLimit     = errors.New("throttle: invalid limit (want >= 0 or Unlimited)")
	ErrReservedOverHard = errors.New("throttle: reserved exceeds hard limit")
	ErrBucketExists     = errors.New("throttle: bucket already exists")
	ErrUnknownBucket    = errors.New("throttle: unknown bucket")
)

// Config configures an Engine.
type Config struct {
	// Capacity is the node capacity in units per second, or Unlimited.
	Capacity Limit
	// Burst is how far ahead of its rate any gauge may run (see the package
	// documentation); zero selects DefaultBurst, a negative value no burst.
	Burst time.Duration
	// Clock is the time source; nil selects NewRealClock().
	Clock Clock
	// MaxReadUnits is the most units one read can cost: the largest item
	// the servers store, in read units (memcached's default item size
	// limit, 1 MiB, is 256 units of 4 KiB, 257 with the longest key). It
	// is the class a bucket's ceiling starts at ([ReadCost]) until told
	// better. Zero selects DefaultMaxReadUnits; it is clamped to [1, 1<<30].
	MaxReadUnits int64
	// ReadUnitSize is the bytes of a read unit, with which a bucket's
	// ceiling converts written values into units; zero selects
	// DefaultUnitSize.
	ReadUnitSize int64
	// FreePool is the free pool mode (the zero value is FreePoolFCFS); see
	// [Engine.SetFreePoolMode].
	FreePool FreePoolMode
}

// DefaultMaxReadUnits is Config.MaxReadUnits when it is zero: memcached's
// default item size limit (1 MiB) in units of DefaultUnitSize.
const DefaultMaxReadUnits = (1 << 20) / DefaultUnitSize

// Engine is one node's throttle state: its capacity, free pool and buckets.
// Create it with New; all methods are safe for concurrent use.
type Engine struct {
	clock    Clock
	burst    int64
	maxRead  int64 // Config.MaxReadUnits
	readUnit int64 // Config.ReadUnitSize
	node     atomic.Pointer[nodeLimits]
	mode     atomic.Uint32 // FreePoolMode
	_        [cacheLine]byte
	pool     gauge
	_        [cacheLine]byte
	fair     fairState
	_        [cacheLine]byte

	mu       sync.Mutex // serialises configuration changes
	capacity Limit
	buckets  map[string]*Bucket
}

type nodeLimits struct {
	capacity Limit
	pool     rate
	// fairLag is the lag bound of fair sharing in virtual time (see
	// fair.go); 0 when the free pool is shared first come, first served,
	// or is Unlimited or 0 (nothing to share).
	fairLag int64
}

// New returns an Engine without buckets. It fails with ErrInvalidLimit when
// cfg.Capacity is not valid, ErrInvalidFreePoolMode when cfg.FreePool is
// not.
func New(cfg Config) (*Engine, error) {
	if !cfg.Capacity.Valid() {
		return nil, ErrInvalidLimit
	}
	if !cfg.FreePool.Valid() {
		return nil, ErrInvalidFreePoolMode
	}
	e := &Engine{clock: cfg.Clock, burst: int64(cfg.Burst), buckets: map[string]*Bucket{}}
	e.maxRead = min(max(cfg.MaxReadUnits, 0), 1<<30)
	if e.maxRead == 0 {
		e.maxRead = DefaultMaxReadUnits
	}
	e.readUnit = cfg.ReadUnitSize
	if e.readUnit <= 0 {
		e.readUnit = DefaultUnitSize
	}
	if e.clock == nil {
		e.clock = NewRealClock()
	}
	switch {
	case cfg.Burst == 0:
		e.burst = int64(DefaultBurst)
	case cfg.Burst < 0:
		e.burst = 0
	}
	e.capacity = cfg.Capacity
	e.mode.Store(uint32(cfg.FreePool))
	e.publishNode(e.now())
	return e, nil
}

// Now returns the engine clock's reading, the time base of every duration
// the engine returns.
func (e *Engine) Now() time.Duration { return e.clock.Now() }

func (e *Engine) now() int64 { return int64(e.clock.Now()) }

// Clock returns the engine's clock, for the caller's other timing (waits,
// delays, timeouts) to share the engine's time base: on a [FakeClock],
// what the caller schedules then happens when the test moves that clock.
func (e *Engine) Clock() Clock { return e.clock }

// AfterFunc calls f in its own goroutine once the engine's clock has moved
// d past now (see [AfterFunc]): how a caller wakes at a time the engine
// computed, on a fake clock as on the real one.
func (e *Engine) AfterFunc(d time.Duration, f func()) Timer { return AfterFunc(e.clock, d, f) }

// AtFunc calls f in its own goroutine once the engine's clock reads at
// (see [AtFunc]): how a caller wakes at a reading the engine computed.
func (e *Engine) AtFunc(at time.Duration, f func()) Timer { return AtFunc(e.clock, at, f) }

// ResetAt re-arms t, a timer of the engine's clock, to fire once the
// clock reads at (see [ResetAt]).
func (e *Engine) ResetAt(t Timer, at time.Duration) bool { return ResetAt(e.clock, t, at) }

// Burst returns the engine's burst duration.
func (e *Engine) Burst() time.Duration { return time.Duration(e.burst) }

// Capacity returns the node capacity.
func (e *Engine) Capacity() Limit { return e.node.Load().capacity }

// FreePool returns the current free pool rate: Unlimited when the capacity
// is, else max(0, capacity - sum of the finite reservations).
func (e *Engine) FreePool() Limit { return e.node.Load().pool.limit }

// SetCapacity changes the node capacity at once; the free pool keeps its
// debt (rescaled to the new rate; forgiven when the free pool's rate
// becomes or was Unlimited or 0). It fails with ErrInvalidLimit.
func (e *Engine) SetCapacity(c Limit) error {
	if !c.Valid() {
		return ErrInvalidLimit
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.capacity = c
	e.publishNode(e.now())
	return nil
}

// publishNode recomputes the free pool; e.mu must be held.
func (e *Engine) publishNode(now int64) {
	pool := Unlimited
	if e.capacity != Unlimited {
		sum := Limit(0)
		for _, b := range e.buckets {
			if r := b.lim.Load().reserved; r != Unlimited {
				sum = addLimits(sum, r)
			}
		}
		pool = max(0, e.capacity-sum)
	}
	n := &nodeLimits{capacity: e.capacity, pool: newRate(pool)}
	if FreePoolMode(e.mode.Load()) == FreePoolFair {
		n.fairLag = fairLimits(pool)
	}
	if old := e.node.Swap(n); old != nil {
		// The pool keeps its debt only (burst 0): its room is shared
		// by every bucket's free-pool admissions, whose own gauges
		// keep their banks.
		e.pool.rescale(now, 0, &old.pool, &n.pool)
	}
}

func validate(reserved, hard Limit) error {
	if !reserved.Valid() || !hard.Valid() {
		return ErrInvalidLimit
	}
	if hard != Unlimited && (reserved == Unlimited || reserved > hard) {
		return ErrReservedOverHard
	}
	return nil
}

// AddBucket creates a bucket with the given reservation and hard limit (and
// weight DefaultWeight) and takes its reservation out of the free pool at once. It fails with
// ErrInvalidLimit, ErrReservedOverHard or ErrBucketExists.
func (e *Engine) AddBucket(name string, reserved, hard Limit) (*Bucket, error) {
	if err := validate(reserved, hard); err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.buckets[name]; ok {
		return nil, ErrBucketExists
	}
	b := &Bucket{e: e, name: name}
	b.rc.init(e.maxRead, e.readUnit)
	b.rc.Restore(0, e.maxRead) // nothing known of its values yet: the largest
	b.weight.Store(DefaultWeight)
	b.vInc.Store(vIncFor(DefaultWeight))
	b.vt.Store(e.fair.v.Load())
	b.lim.Store(newBucketLimits(reserved, hard, false))
	e.buckets[name] = b
	e.publishFairList()
	e.publishNode(e.now())
	return b, nil
}

// Bucket returns the named bucket, or nil.
func (e *Engine) Bucket(name string) *Bucket {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.buckets[name]
}

// Buckets returns the engine's buckets sorted by name (a fresh slice).
func (e *Engine) Buckets() []*Bucket {
	e.mu.Lock()
	bs := make([]*Bucket, 0, len(e.buckets))
	for _, b := range e.buckets {
		bs = append(bs, b)
	}
	e.mu.Unlock()
	sort.Slice(bs, func(i, j int) bool { return bs[i].name < bs[j].name })
	return bs
}

// RemoveBucket removes the named bucket and gives its reservation back to
// the free pool at once. Holders of the *Bucket may go on using it: from then
// on it has no reservation (it draws on the free pool only) and keeps its
// hard limit; SetLimits on it fails. It fails with ErrUnknownBucket.
func (e *Engine) RemoveBucket(name string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	b, ok := e.buckets[name]
	if !ok {
		return ErrUnknownBucket
	}
	delete(e.buckets, name)
	e.publishFairList()
	b.lim.Store(newBucketLimits(0, b.lim.Load().hard, true))
	e.publishNode(e.now())
	return nil
}
