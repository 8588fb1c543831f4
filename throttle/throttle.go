// Package throttle is kvthrottle's throttle engine: it decides whether a
// bucket (tenant) may run its next command now, charges the units a command
// used once it has run, and computes how long a held command must wait.
// It does no I/O and reads time only from an injectable [Clock].
//
// # Model
//
// A node ([Engine]) has a capacity; each [Bucket] has a reservation and a
// hard limit, all [Limit] values in units per second. The free pool is what
// the reservations leave of the capacity: max(0, capacity - sum of the
// finite reservations of the node's buckets), shared first come, first
// served. Each finite rate is enforced by a gauge: a token bucket with
// continuous refill, kept as a "theoretical arrival time" (GCRA) in
// nanoseconds of the engine clock and updated with atomic operations. A
// gauge has room while what it has billed ends at most one burst after now:
// a gauge of rate r may run r*burst units ahead of its rate, plus one
// command, and idle time does not build up more room than that. Costs are
// kept to 1/65536 ns per unit and rounded up to the nanosecond per charge.
//
// [Bucket.Admit] applies the rules of DESIGN.md section 4 in order:
//
//  1. an unthrottled caller, or a bucket whose reservation is Unlimited:
//     admit;
//  2. the bucket's reservation gauge has room: admit, charge the reservation;
//  3. the free pool has no room: hold;
//  4. the bucket's hard-limit gauge has no room: hold;
//  5. admit, charge the free pool.
//
// Every charge also counts against the bucket's hard limit. Unthrottled
// callers are never held, but their units are charged like any other (to
// the reservation if it has room, else to the free pool, even into debt), so
// they slow down their bucket's other connections and the node. A bucket
// whose reservation is Unlimited charges no gauge at all.
//
// With capacity Unlimited the free pool never holds anybody, but hard limits
// (and reservations, which then merely count) still apply. A capacity below
// the sum of the reservations leaves a free pool of zero; reservations are
// still honoured, so the node then runs above its capacity.
//
// # Charging
//
// A command is billed when it is admitted and settled once it has run.
// [Bucket.AdmitCost] bills what is known in advance: a write's units (its
// key and value are in the request), and for a read the bucket's read
// estimate, a moving average of its reads (MaxReadUnits, the largest read
// there can be, until one read is known). [Bucket.Settle] bills the
// difference to the same domain and the hard limit, or gives it back. So
// commands pipelined before any response already use up room at about
// their real size, and a pipeline of large reads is paced by its limit
// instead of running up a debt that would silence the bucket afterwards.
// ([Bucket.Admit] and [Bucket.Charge] are the same with one unit billed in
// advance, for callers that know nothing of the cost.)
//
// What no estimate can foresee is bounded. A read in flight holds
// MaxReadUnits minus its estimate of the bucket's budget for reads of
// unknown cost, one burst of the bucket's highest rate (at least one read);
// a read that would overrun the budget waits for reads in flight to settle
// ([Grant.WaitsForReads]). So what a bucket's reads can cost beyond their
// bills at any time, billed to its gauges when they settle, is at most one
// burst of its rate: a neighbour within its reservation never waits for
// it, one drawing on the free pool at most about a burst.
//
// Gauges may go into debt (a big command); the debt delays the next
// admission, which is how a limit holds exactly over time. Over any window
// of length w in which the limits do not change, units billed against a
// gauge of rate r (counted when billed) are at most r*w + r*burst + the
// largest single command; for a bucket's hard limit h with reservation v,
// at most h*w + (h+v)*burst + twice the largest command, since rule 2 does
// not look at the hard limit. Reads add at most their budget for unknown
// cost (a burst of the bucket's highest rate, or one largest read) and one
// read per caller admitting at the same instant: the budget is checked,
// then taken, without a lock.
//
// # Waiting
//
// A held caller gets the exact duration until the gauges that hold it have
// room: the later of the free pool and the hard limit, or the time the
// reservation has room if that is sooner. Blocking callers keep a place in
// a per-bucket FIFO line with a [Waiter], and a place behind others waits
// for room for those ahead of it too (see [Bucket.Admit]). [InfDuration]
// means only a change of limits can admit the bucket (no reservation, and a
// free pool or hard limit of zero). After changing limits, callers should
// re-try their held commands at once: waits may have become shorter.
//
// The burst must exceed the callers' wake-up latency, or throughput is lost
// while a gauge has room and nobody is awake to use it: [DefaultBurst] is
// 20 ms for a proxy that wakes held sessions within 5 ms.
//
// # Concurrency
//
// All methods are safe for concurrent use (a Waiter, by one goroutine at a
// time). Admit and Charge take no lock and do not allocate. Configuration
// changes (SetCapacity, AddBucket, SetLimits, RemoveBucket) take an
// engine-wide mutex, apply at once, and keep every gauge's debt (rescaled to
// the new rate; a change to or from Unlimited or 0 forgives it). Nothing in this package panics on bad input: invalid limits
// are errors, out-of-range units are clamped.
package throttle

import (
	"errors"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Limit is a rate in units per second. A Limit >= 0 is a finite rate (0
// admits nothing); [Unlimited] means no limit. Other negative values are
// invalid and rejected with [ErrInvalidLimit].
type Limit int64

// Unlimited is the Limit without a limit: as a capacity it disables the free
// pool's throttling, as a hard limit it never holds, as a reservation it
// admits every command of the bucket without charging any gauge.
const Unlimited Limit = -1

// Valid reports whether l is Unlimited or a rate >= 0.
func (l Limit) Valid() bool { return l >= 0 || l == Unlimited }

// String returns "unlimited" or the decimal rate.
func (l Limit) String() string {
	if l == Unlimited {
		return "unlimited"
	}
	return strconv.FormatInt(int64(l), 10)
}

// DefaultUnitSize is the default read and write unit size in bytes.
const DefaultUnitSize = 4096

// Units returns ceil(bytes/unitSize), at least 1: every metered command costs
// at least one unit, also on a miss or a failure. A negative bytes counts as
// 0; a unitSize <= 0 selects DefaultUnitSize.
func Units(bytes, unitSize int64) int64 {
	if unitSize <= 0 {
		unitSize = DefaultUnitSize
	}
	if bytes <= 0 {
		return 1
	}
	u := bytes / unitSize
	if bytes%unitSize != 0 {
		u++
	}
	return u
}

// ReadUnits returns the units of a read: bytes is the key plus the value
// returned (GET, GETQ, GETK, GETKQ, TOUCH, GAT, GATQ). See [Units].
func ReadUnits(bytes, readUnitSize int64) int64 { return Units(bytes, readUnitSize) }

// WriteUnits returns the units of a write: bytes is the key plus the value
// sent (SET, ADD, REPLACE, APPEND, PREPEND, INCR, DECR, DELETE and their
// quiet variants). GAT is charged both. See [Units].
func WriteUnits(bytes, writeUnitSize int64) int64 { return Units(bytes, writeUnitSize) }

// Domain says what an admission was granted against; pass it back to
// [Bucket.Charge]. The zero value, Held, means not admitted.
type Domain uint8

const (
	// Held: not admitted; the caller must wait.
	Held Domain = iota
	// Reserved: admitted against the bucket's reservation (rule 2).
	Reserved
	// FreePool: admitted against the node's free pool (rule 5, or an
	// unthrottled caller past its reservation).
	FreePool
	// Unmetered: admitted because the bucket's reservation is Unlimited
	// (rule 1); no gauge is charged, only the bucket's counters.
	Unmetered
)

// String returns the domain's name.
func (d Domain) String() string {
	switch d {
	case Held:
		return "held"
	case Reserved:
		return "reserved"
	case FreePool:
		return "free_pool"
	case Unmetered:
		return "unmetered"
	}
	return "domain(" + strconv.Itoa(int(d)) + ")"
}

// Mode is how a caller wants to be treated when its bucket has no room.
type Mode uint8

const (
	// Blocking callers are held and keep their place in the bucket's FIFO
	// line through a [Waiter].
	Blocking Mode = iota
	// NonBlocking callers (HELLO feature 0x1b) are told how long to wait but
	// take no place in the line and do not queue behind it; each refusal
	// counts as rejected.
	NonBlocking
	// Unthrottled callers (the Unthrottled privilege) are never held; their
	// units are charged all the same.
	Unthrottled
)

// InfDuration is the wait returned when no passage of time alone can admit
// the bucket (no reservation and a free pool or hard limit of zero).
const InfDuration = time.Duration(math.MaxInt64)

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
	// limit, 1 MiB, is 256 units of 4 KiB). It is where a bucket's read
	// estimate starts, and what the budget for reads of unknown cost counts
	// each read at (see [Bucket.AdmitCost]). Zero selects
	// DefaultMaxReadUnits; it is clamped to [1, 1<<30].
	MaxReadUnits int64
}

// DefaultMaxReadUnits is Config.MaxReadUnits when it is zero: memcached's
// default item size limit (1 MiB) in units of DefaultUnitSize.
const DefaultMaxReadUnits = (1 << 20) / DefaultUnitSize

// Engine is one node's throttle state: its capacity, free pool and buckets.
// Create it with New; all methods are safe for concurrent use.
type Engine struct {
	clock   Clock
	burst   int64
	maxRead int64 // Config.MaxReadUnits
	node    atomic.Pointer[nodeLimits]
	_       [cacheLine]byte
	pool    gauge
	_       [cacheLine]byte

	mu       sync.Mutex // serialises configuration changes
	capacity Limit
	buckets  map[string]*Bucket
}

type nodeLimits struct {
	capacity Limit
	pool     rate
}

// New returns an Engine without buckets. It fails with ErrInvalidLimit when
// cfg.Capacity is not valid.
func New(cfg Config) (*Engine, error) {
	if !cfg.Capacity.Valid() {
		return nil, ErrInvalidLimit
	}
	e := &Engine{clock: cfg.Clock, burst: int64(cfg.Burst), buckets: map[string]*Bucket{}}
	e.maxRead = min(max(cfg.MaxReadUnits, 0), 1<<30)
	if e.maxRead == 0 {
		e.maxRead = DefaultMaxReadUnits
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
	e.publishNode(e.now())
	return e, nil
}

// Now returns the engine clock's reading, the time base of every duration
// the engine returns.
func (e *Engine) Now() time.Duration { return e.clock.Now() }

func (e *Engine) now() int64 { return int64(e.clock.Now()) }

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
	if old := e.node.Swap(n); old != nil {
		e.pool.rescale(now, &old.pool, &n.pool)
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

// AddBucket creates a bucket with the given reservation and hard limit and
// takes its reservation out of the free pool at once. It fails with
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
	b.est.Store(-1) // no read settled yet
	b.lim.Store(newBucketLimits(reserved, hard, false))
	e.buckets[name] = b
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
	b.lim.Store(newBucketLimits(0, b.lim.Load().hard, true))
	e.publishNode(e.now())
	return nil
}

// addLimits adds two finite limits, saturating.
func addLimits(a, b Limit) Limit {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// Bucket is one tenant's throttle state. Get it from Engine.AddBucket or
// Engine.Bucket; all methods are safe for concurrent use.
type Bucket struct {
	e    *Engine
	name string
	lim  atomic.Pointer[bucketLimits]
	slot atomic.Int64 // the last window slot snapshotted
	_    [cacheLine]byte

	// written by every admission (and charge of more than one unit)
	res, hard gauge
	commands  atomic.Uint64 // commands admitted: their first units
	extra     atomic.Uint64 // units charged beyond the first of each command
	_         [cacheLine]byte

	// written by reads (see cost.go)
	est       atomic.Int64 // read estimate, units << estShift; < 0: none yet
	unknown   atomic.Int64 // units of unknown cost in flight
	fullSince atomic.Int64 // when the budget for them was found full, no read settling since; 0: not
	_         [cacheLine]byte

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
// gauges keep their debt (rescaled to the new rates; forgiven by a change
// to or from Unlimited or 0) and the free pool is
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
	b.res.rescale(now, &old.res, &n.res)
	b.hard.rescale(now, &old.hrd, &n.hrd)
	e.publishNode(now)
	return nil
}

// Admit decides whether the bucket may run its next metered command now,
// charging at once the one unit every metered command costs at least; the
// rest of its units are charged with Charge once it has run. It is
// AdmitCost with Cost{Known: 1}: see AdmitCost for mode, w and the wait.
// Commands whose cost is known before they run (writes), or that may cost
// many units (reads), should use AdmitCost, which bills them in advance.
//
// Admit takes no lock and does not allocate.
func (b *Bucket) Admit(w *Waiter, mode Mode) (Domain, time.Duration) {
	g, wait := b.AdmitCost(w, mode, Cost{Known: 1})
	return g.Domain, wait
}

// admit applies the rules, the FIFO line and the budget for reads of
// unknown cost (open > 0) at now, and on admission bills paid units and
// holds open units of the budget.
func (b *Bucket) admit(w *Waiter, mode Mode, paid, open int64) (Domain, time.Duration) {
	e := b.e
	now := e.now()
	if now>>slotShift != b.slot.Load() {
		b.snapshot(now)
	}
	lim := b.lim.Load()
	if lim.res.limit == Unlimited {
		b.commands.Add(1)
		b.extra.Add(uint64(paid - 1))
		if w != nil && w.b != nil {
			w.release(now)
		}
		return Unmetered, 0
	}
	node := e.node.Load()
	if mode == Unthrottled {
		open = 0 // never held: nothing to gate
	}
	d, at := b.check(now, lim, node, open)
	switch mode {
	case Unthrottled:
		if d == Held {
			d = FreePool
		}
	case NonBlocking:
		if d == Held {
			b.rejected.Add(1)
			return Held, until(now, at)
		}
	default:
		if w == nil {
			if d == Held {
				b.held.Add(1)
				return Held, until(now, at)
			}
		} else if wait, held := b.queue(w, now, d, at, lim, node); held {
			return Held, wait
		}
	}
	b.precharge(now, d, lim, node, paid)
	if open > 0 {
		b.unknown.Add(open)
	}
	b.commands.Add(1)
	b.extra.Add(uint64(paid - 1))
	if w != nil && w.b != nil {
		w.release(now)
	}
	return d, 0
}

// never is the time at which a closed gauge has room.
const never = math.MaxInt64

// check applies rules 2 to 5 at now, for a command that would hold open
// units of the budget for reads of unknown cost. It returns the domain
// (Held when there is no room) and the time at which rules 2 to 5 admit
// (<= now when not held, never when only a change of limits can).
func (b *Bucket) check(now int64, lim *bucketLimits, node *nodeLimits, open int64) (d Domain, at int64) {
	burst := b.e.burst
	gate := int64(math.MinInt64) // the budget for reads of unknown cost
	if open > 0 && b.unknownFull(now, open, lim, node) {
		gate = now + unknownPoll
	}
	tRes := int64(never)
	if lim.res.cost != 0 {
		if tRes = max(b.res.tat.Load()-burst, gate); tRes <= now {
			return Reserved, tRes
		}
	}
	tFree := gate
	switch {
	case node.pool.limit == Unlimited:
	case node.pool.cost == 0:
		tFree = never
	default:
		tFree = max(tFree, b.e.pool.tat.Load()-burst)
	}
	switch {
	case lim.hrd.limit == Unlimited:
	case lim.hrd.cost == 0:
		tFree = never
	default:
		tFree = max(tFree, b.hard.tat.Load()-burst)
	}
	if tFree <= now {
		return FreePool, tFree
	}
	return Held, min(tRes, tFree)
}

// fastest returns the highest rate the bucket can run at: its hard limit,
// or its reservation plus the free pool if that is lower.
func fastest(lim *bucketLimits, node *nodeLimits) Limit {
	r := lim.hard
	if node.pool.limit != Unlimited {
		if most := addLimits(lim.reserved, node.pool.limit); r == Unlimited || most < r {
			r = most
		}
	}
	return r
}

// unitCost returns the nanoseconds per unit at the bucket's fastest rate;
// 0 when that rate is unlimited.
func unitCost(lim *bucketLimits, node *nodeLimits) int64 {
	r := fastest(lim, node)
	if r == Unlimited {
		return 0
	}
	if r <= 0 {
		return maxDebt
	}
	return max(int64(time.Second)/int64(r), 1)
}

// precharge bills the units an admitted command pays in advance.
func (b *Bucket) precharge(now int64, d Domain, lim *bucketLimits, node *nodeLimits, units int64) {
	switch d {
	case Reserved:
		b.res.charge(now, lim.res.cost1(units))
	case FreePool:
		if node.pool.cost != 0 {
			b.e.pool.charge(now, node.pool.cost1(units))
		}
	default:
		return
	}
	if lim.hrd.cost != 0 {
		b.hard.charge(now, lim.hrd.cost1(units))
	}
}

// Charge charges the units a command admitted with Admit (domain d) used,
// once it has run: it is Settle of a Grant that paid one unit. Charge with
// units <= 1 costs nothing; Charge with Held does nothing. Every admitted
// command should be charged at most once, from any goroutine; a command
// that never ran need not be charged. Charge takes no lock and does not
// allocate.
func (b *Bucket) Charge(d Domain, units int64) {
	if units <= 1 {
		return
	}
	b.Settle(Grant{Domain: d, paid: 1}, units)
}

// Stats is a snapshot of a bucket's counters.
type Stats struct {
	Reserved, HardLimit Limit
	Commands            uint64  // commands admitted
	Units               uint64  // units charged (the first of each command when admitted)
	Held                uint64  // commands held at least once (Blocking mode)
	Rejected            uint64  // NonBlocking refusals
	Waiting             int     // places currently in the FIFO line
	UnitsPerSecond      float64 // units charged per second over the last 1.0 to 1.07 s
}

// Stats returns the bucket's counters. It is cheap and safe to call from
// any goroutine; the fields are read one by one, not as one atomic snapshot.
func (b *Bucket) Stats() Stats {
	l := b.lim.Load()
	waiting := int64(b.tail.Load() - b.served.Load())
	commands := b.commands.Load()
	return Stats{
		Reserved:       l.reserved,
		HardLimit:      l.hard,
		Commands:       commands,
		Units:          commands + b.extra.Load(),
		Held:           b.held.Load(),
		Rejected:       b.rejected.Load(),
		Waiting:        int(max(waiting, 0)),
		UnitsPerSecond: b.perSecond(b.e.now()),
	}
}

// until converts the admission time at into a wait from now.
func until(now, at int64) time.Duration {
	if at == never {
		return InfDuration
	}
	return time.Duration(max(at-now, 1))
}

// cacheLine pads hot atomics apart to avoid false sharing between cores.
const cacheLine = 64

// maxDebt caps a single charge (about 2.3 years of its rate), and tatCap a
// gauge's bill (about 73 years of clock), which keeps every time computation
// far from overflow.
const (
	maxDebt = int64(1) << 56
	tatCap  = int64(1) << 61
)

// fracBits is the number of fractional bits in rate.cost.
const fracBits = 16

// rate holds the constants of one finite limit.
type rate struct {
	limit Limit
	cost  uint64 // nanoseconds per unit in 48.16 fixed point; 0 unless limit > 0
	one   int64  // nanoseconds for one unit, rounded up
}

func newRate(l Limit) rate {
	r := rate{limit: l}
	if l > 0 {
		r.cost = max(uint64(time.Second<<fracBits)/uint64(l), 1)
		r.one = r.ns(1)
	}
	return r
}

// cost1 is ns(n), with the common n = 1 precomputed.
func (r *rate) cost1(n int64) int64 {
	if n == 1 {
		return r.one
	}
	return r.ns(n)
}

// ns returns the nanoseconds n units take at this rate, rounded up, capped
// at maxDebt.
func (r *rate) ns(n int64) int64 {
	hi, lo := bits.Mul64(uint64(n), r.cost)
	if hi>>fracBits != 0 {
		return maxDebt
	}
	v := hi<<(64-fracBits) | lo>>fracBits
	if lo&(1<<fracBits-1) != 0 {
		v++
	}
	return int64(min(v, uint64(maxDebt)))
}

// gauge is a token bucket in GCRA form: tat is the clock reading at which
// everything charged so far is paid for. It has room at now when
// tat - now <= burst.
type gauge struct{ tat atomic.Int64 }

// charge bills cost from now, or from where the gauge's bill ends if that
// is later.
func (g *gauge) charge(now, cost int64) {
	old := g.tat.Load()
	if old >= now { // tat only grows (but for rescale): no need to compare
		g.add(cost)
		return
	}
	for {
		n := min(max(old, now)+cost, tatCap)
		if g.tat.CompareAndSwap(old, n) {
			return
		}
		old = g.tat.Load()
	}
}

// add bills cost after what the gauge has billed. With cost <= maxDebt and
// tat kept under tatCap, tat cannot overflow.
func (g *gauge) add(cost int64) {
	if n := g.tat.Add(cost); n > tatCap {
		g.tat.CompareAndSwap(n, tatCap)
	}
}

// rescale keeps the units owed when the gauge's rate changes from one
// finite rate to another. A change to or from a rate without a cost
// ("unlimited", or 0) forgives the debt instead: there is no rate to keep
// it at, and left as it is it would be read at the next finite rate as if
// it had been billed at that one.
func (g *gauge) rescale(now int64, from, to *rate) {
	if from.cost == to.cost {
		return
	}
	if from.cost == 0 || to.cost == 0 {
		g.forgive(now)
		return
	}
	f := float64(to.cost) / float64(from.cost)
	for {
		old := g.tat.Load()
		if old <= now {
			return
		}
		d := min(float64(old-now)*f, float64(maxDebt))
		if g.tat.CompareAndSwap(old, now+int64(d)) {
			return
		}
	}
}

// forgive drops what the gauge owes beyond now: the gauge is as if it had
// been idle, its whole burst available at once.
func (g *gauge) forgive(now int64) {
	for {
		old := g.tat.Load()
		if old <= now || g.tat.CompareAndSwap(old, now) {
			return
		}
	}
}

// The window holds, for each of the last numSlots slots of 2^26 ns
// (67.1 ms), the bucket's units total (commands+extra) when the slot began:
// the first admission of a slot stores it, so admissions pay one atomic
// load, not a write. Each entry packs the slot number (low 24 bits, in the
// top bits) and the total (low 40 bits, compared modulo 2^40).
const (
	slotShift = 26
	numSlots  = 16
	unitBits  = 40
	unitMask  = 1<<unitBits - 1
	tagMask   = 1<<(64-unitBits) - 1
)

type window [numSlots]atomic.Uint64

// snapshot records the units total at the start of now's slot, once.
func (b *Bucket) snapshot(now int64) {
	s := now >> slotShift
	old := b.slot.Load()
	if s <= old || !b.slot.CompareAndSwap(old, s) {
		return
	}
	total := b.commands.Load() + b.extra.Load()
	b.window[s%numSlots].Store(uint64(s)&tagMask<<unitBits | total&unitMask)
}

// perSecond returns the units charged per second from the start of the
// slot numSlots-1 slots before now's, to now.
func (b *Bucket) perSecond(now int64) float64 {
	cur := now >> slotShift
	from := max(cur-(numSlots-1), 0)
	total := b.commands.Load() + b.extra.Load()
	// The oldest snapshot in range: slots without one saw no admission.
	for s := from; s <= cur; s++ {
		if v := b.window[s%numSlots].Load(); v>>unitBits == uint64(s)&tagMask {
			units := (total - v) & unitMask
			return float64(units) * float64(time.Second) / float64(max(now-from<<slotShift, 1))
		}
	}
	return 0
}
