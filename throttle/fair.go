package throttle

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Fair sharing of the free pool (DESIGN.md section 13), in the manner of
// start-time fair queuing with a lag bound (Goyal's SFQ; Linux's EEVDF
// eligibility).
//
// Each bucket has a virtual time, vt: the units it has drawn on the free
// pool, each counted as 1/weight of a unit, so that buckets served in
// proportion to their weights advance alike. A bucket wants more of the
// pool while one of its callers is held by the free pool or by its turn
// (not by its hard limit): while a Blocking caller so held keeps its place
// in the bucket's line, however late it comes back, and for a caller
// without a place until it is served or fairGrace past the time it was
// told to come back.
// The engine keeps the system's virtual time, V: the least vt among the
// buckets that want more, and while none does, the greatest vt less the
// lag bound; V never goes back. A bucket may draw on the pool while its vt
// is at most V plus the lag bound (fairLag of the pool's rate, at weight
// 1), or while no other bucket wants more:
//
//   - The bucket furthest behind among those that want more may always go,
//     and a bucket held by the pool wakes later the further ahead of V it
//     is (by its lead at the pool's rate, at most fairLag), so pool room
//     goes to the ones behind first: held commands of different buckets
//     are released in order of their buckets' virtual times, the virtual
//     finish times of what each has drawn.
//   - Whenever the pool has room, somebody that wants it may take it: the
//     split is work-conserving. A bucket that asks for less than its share
//     is served when it asks and does not hold V back once served; one
//     capped by its hard limit takes its cap; what they leave goes to the
//     others. The result is the weighted max-min split of WaterFill, which
//     the simulations check it against.
//   - A bucket's vt is raised to V when it draws on the pool: an idle
//     bucket banks nothing, and one that used spare capacity while nobody
//     else wanted it is not held back for it afterwards (V follows the
//     bucket furthest ahead while nobody wants more).
//   - Unthrottled callers are not held for their turn, and their units
//     already count in the pool's debt, which every bucket waits out: their
//     bills take their bucket's vt at most to the lag bound past V.
//   - Over any interval, the buckets that want more advance within the lag
//     bound of each other: their shares of the pool are in proportion to
//     their weights within the lag bound and one command each.
//
// V is recomputed at most every fairPeriod, by whichever admission comes
// first after that (one pass over the buckets, no allocation; about 3 µs
// for 1000 buckets); admission reads V and the bucket's vt and bills vt
// with atomic operations, without a lock. The lag bound (4 ms of the pool)
// exceeds what the bucket furthest behind can advance between two
// recomputations at the pool's full rate (2 ms), so a stale V does not hold
// it.
//
// Virtual times are kept in 1/vScale of a unit at weight 1 (a unit at
// weight w adds vScale/w, rounded down: the shares of weights that do not
// divide vScale are exact within 0.06%) and compared as differences, so
// they may wrap around; a bucket's vt is kept within fairClamp of V.
const (
	fairPeriod = int64(2 * time.Millisecond)
	fairLag    = int64(FairLag)
	fairClamp  = int64(1) << 61
	// fairGrace is how long past the time it was told to come back a held
	// bucket still counts as wanting more: a caller wakes a little late.
	fairGrace = int64(time.Millisecond)
	vScale    = int64(1) << 24
	// fairMaxUnits bounds the units one bill counts, which keeps
	// units*vScale within int64.
	fairMaxUnits = int64(1) << 30
)

// FairLag is the lag bound of fair sharing: over any interval, the
// buckets that want more of the free pool get it in proportion to their
// weights to within FairLag of the pool's rate (at weight 1) and one
// command each.
const FairLag = 4 * time.Millisecond

// fairState is the engine's part of fair sharing.
type fairState struct {
	v     atomic.Int64           // V, the system's virtual time
	next  atomic.Int64           // when V is next recomputed (engine clock, ns)
	wantN atomic.Int64           // buckets that wanted more of the pool then
	first atomic.Pointer[Bucket] // the one furthest behind among them
	// speed is how fast V moves while buckets want more: the pool's rate
	// over the sum of their weights, in virtual time per ns (float64
	// bits; 0 when unknown)
	speed atomic.Uint64
	_     [cacheLine]byte
	mu    sync.Mutex                // held by the recomputation
	list  atomic.Pointer[[]*Bucket] // the engine's buckets, for it
}

// fairLimits returns the lag bound, in virtual time, for a free pool of
// rate pool (0 when the pool is Unlimited or 0: nothing to share).
func fairLimits(pool Limit) int64 {
	if pool <= 0 {
		return 0
	}
	// The engine takes any Limit: counting a larger pool as MaxUnits keeps
	// pool*fairLag*vScale within int64.
	units := max(int64(min(pool, Limit(MaxUnits)))*fairLag/int64(time.Second), 1)
	return units * vScale
}

// vIncFor returns the virtual time one unit adds at weight w.
func vIncFor(w int) int64 { return vScale / int64(min(max(w, 1), MaxWeight)) }

// publishFairList records the buckets for the recomputation; e.mu must be
// held.
func (e *Engine) publishFairList() {
	l := make([]*Bucket, 0, len(e.buckets))
	for _, b := range e.buckets {
		l = append(l, b)
	}
	e.fair.list.Store(&l)
}

// fairTick recomputes V if fairPeriod has passed since the last time, unless
// another caller is at it.
func (e *Engine) fairTick(now int64) {
	f := &e.fair
	if now < f.next.Load() || !f.mu.TryLock() {
		return
	}
	defer f.mu.Unlock()
	if now < f.next.Load() {
		return
	}
	f.next.Store(now + fairPeriod)
	e.fairRecompute(now, false)
}

// fairRecompute sets V at now: the least vt among the buckets that want
// more of the pool; while none does (or all is set), the greatest vt less
// the lag bound, so that nobody is held back for having used what nobody
// else wanted, and the buckets behind keep their place. V never goes back.
// It keeps every bucket's vt within fairClamp of V. f.mu must be held.
func (e *Engine) fairRecompute(now int64, all bool) {
	f := &e.fair
	list := f.list.Load()
	if list == nil {
		return
	}
	v := f.v.Load()
	var lo, hi int64
	var first *Bucket
	var wantN int64
	seen := false
	for _, b := range *list {
		vt := b.vt.Load()
		if !all && b.wanting(now) {
			if wantN == 0 || vt-lo < 0 {
				lo, first = vt, b
			}
			wantN++
		}
		if !seen || vt-hi > 0 {
			hi, seen = vt, true
		}
	}
	node := e.node.Load()
	if wantN == 0 {
		if seen {
			lo = hi - node.fairLag
		} else {
			lo = v
		}
	}

	if lo-v > 0 {
		v = lo
	}
	// V moves as the buckets that want more and may go (not ahead of V by
	// more than the lag bound) are served: at the pool's rate over their
	// weights.
	var weights float64
	for _, b := range *list {
		b.clampVT(v)
		if wantN > 0 && b.vt.Load()-v <= b.lag(node) && b.wanting(now) {
			weights += float64(vScale) / float64(b.vInc.Load())
		}
	}
	speed := 0.0
	if weights > 0 && node.pool.limit > 0 {
		speed = float64(node.pool.limit) * float64(vScale) / weights / float64(time.Second)
	}
	f.v.Store(v)
	f.first.Store(first)
	f.wantN.Store(wantN)
	f.speed.Store(math.Float64bits(speed))
}

// wanting reports whether the bucket wants more of the pool than it gets
// at now: a caller of it holds a place in its line, last held by the pool
// or its turn, and told to come back at most abandonAfter ago (a place
// keeps it wanting however late its caller wakes, but not a place whose
// caller never comes back: it would hold V, and every other bucket, for
// good), or a caller without a place was held so until recently.
func (b *Bucket) wanting(now int64) bool {
	return b.wantUntil.Load() > now ||
		b.poolHeld.Load() && b.placeUntil.Load() > now && b.tail.Load() > b.served.Load()
}

// lag returns the bucket's lag bound in virtual time: fairLag of the pool's
// rate in its own units, whatever its weight (at weight w, 1/w of the lag
// bound at weight 1), so that the bound does not grow with the scale of
// the weights.
func (b *Bucket) lag(node *nodeLimits) int64 {
	return max(node.fairLag/vScale*b.vInc.Load(), 1)
}

// clampVT keeps vt within fairClamp of v: a bucket idle for so long that it
// lags that far would be raised to V at its next bill anyway, and one that
// far ahead (unthrottled callers billing without limit) waits as long as
// the clamp does.
func (b *Bucket) clampVT(v int64) {
	for {
		vt := b.vt.Load()
		d := vt - v
		if d >= -fairClamp && d <= fairClamp {
			return
		}
		n := v - fairClamp
		if d > 0 {
			n = v + fairClamp
		}
		if b.vt.CompareAndSwap(vt, n) {
			return
		}
	}
}

// fairTurn reports whether the bucket may draw on the pool now: its vt is at
// most the lag bound past V, or no other bucket wants more of the pool. If
// not, at is when it may: when V, moving at the pool's rate over the
// weights of the buckets that want more, will have caught up, but not
// before the next recomputation of V. If so, at is how long after the pool
// has room again the bucket should try if the pool holds it: its lead over
// V at the pool's rate (0 to fairLag), so that the buckets further behind
// go first.
func (b *Bucket) fairTurn(now int64, node *nodeLimits) (ok bool, at int64) {
	f := &b.e.fair
	lead := vtLead(b.vt.Load(), f.v.Load())
	lag := b.lag(node)
	if lead > lag {
		if n := f.wantN.Load(); n == 0 || n == 1 && f.first.Load() == b {
			return true, fairLag
		}
		at = max(f.next.Load(), now+1)
		if speed := math.Float64frombits(f.speed.Load()); speed > 0 {
			at = max(at, now+int64(min(float64(lead-lag)/speed, float64(fairClamp))))
		}
		return false, at
	}
	if lead <= 0 {
		return true, 0
	}
	return true, int64(float64(lead) / float64(lag) * float64(fairLag))
}

// fairRoom returns the units the bucket may still draw on the pool before
// its turn ends (negative past it).
func (b *Bucket) fairRoom(node *nodeLimits) int64 {
	lead := vtLead(b.vt.Load(), b.e.fair.v.Load())
	return (b.lag(node) - lead) / b.vInc.Load()
}

// vtLead returns how far vt is ahead of v (negative: behind). vt is kept
// within fairClamp of V, so a lead past that means vt wrapped around while
// its bucket stayed idle for very long (a removed bucket, which
// fairRecompute no longer clamps): it counts as level with V.
func vtLead(vt, v int64) int64 {
	if d := vt - v; d <= fairClamp {
		return d
	}
	return 0
}

// fairBill adds units drawn on the pool to the bucket's virtual time,
// raising it first to V if it is behind: an idle bucket banks nothing. A
// bill of unthrottled callers (who were not held for their turn, and whose
// units the pool's debt already makes every bucket wait out) takes the
// bucket at most to the lag bound past V. The bucket then no longer counts
// as wanting through a recent hold without a place: it was served.
func (b *Bucket) fairBill(units int64, unthrottled bool, node *nodeLimits) {
	add := min(units, fairMaxUnits) * b.vInc.Load()
	v := b.e.fair.v.Load()
	for {
		vt := b.vt.Load()
		lead := max(vtLead(vt, v), 0) // raised to V if behind
		n := min(lead+add, fairClamp)
		if lag := b.lag(node); unthrottled && n > lag {
			n = max(lead, lag)
		}
		if b.vt.CompareAndSwap(vt, v+n) {
			break
		}
	}
	if b.wantUntil.Load() != 0 {
		b.wantUntil.Store(0)
	}
}

// fairRefund takes back units billed to the pool in advance and not used.
func (b *Bucket) fairRefund(units int64) {
	b.vt.Add(-min(units, fairMaxUnits) * b.vInc.Load())
}

// fairWant records that the bucket wants more of the pool than it gets: a
// caller of it is held by the pool or its turn until at least until (a
// caller with a place in the line keeps it wanting for as long as it holds
// the place; one without, until a little after until).
func (b *Bucket) fairWant(until int64) {
	if !b.poolHeld.Load() {
		b.poolHeld.Store(true)
	}
	if until == never {
		return
	}
	if p := min(until, math.MaxInt64-abandonAfter) + abandonAfter; b.placeUntil.Load() < p {
		b.placeUntil.Store(p)
	}
	until = min(until, math.MaxInt64-fairGrace) + fairGrace
	if b.wantUntil.Load() < until {
		b.wantUntil.Store(until)
	}
}

// fairCapped records that a caller of the bucket is held by its hard limit:
// its places in line no longer count as wanting more of the pool. (One
// held by its own reads in flight changes nothing: it wanted more of the
// pool before, or not.)
func (b *Bucket) fairCapped() {
	if b.poolHeld.Load() {
		b.poolHeld.Store(false)
	}
}
