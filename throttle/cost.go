package throttle

import (
	"math"
	"time"
)

// Cost is what a command is expected to cost, given to [Bucket.AdmitCost].
type Cost struct {
	// Known is the units known before the command runs: a write's key
	// and value sent. Values below 0 count as 0.
	Known int64
	// Read says the command also returns data whose units are known only
	// once its response is in (GET, GAT, TOUCH): the bucket's read
	// estimate is billed in advance, and the read holds part of the
	// bucket's budget for reads of unknown cost until it is settled.
	Read bool
}

// Grant is the bill of an admitted command, from [Bucket.AdmitCost]: pass it
// to [Bucket.Settle] once the command has run. The zero Grant (Domain
// Held) stands for a command that was not admitted.
type Grant struct {
	// Domain is what the command was admitted against.
	Domain      Domain
	read        bool
	unthrottled bool  // admitted in Unthrottled mode
	gated       bool  // held by the budget for reads of unknown cost
	known       int64 // Cost.Known
	paid        int64 // units billed at admission
	open        int64 // units of the budget for reads of unknown cost it holds
}

// Paid returns the units billed when the command was admitted.
func (g Grant) Paid() int64 { return g.paid }

// WaitsForReads reports, for a Grant that holds (Domain Held), whether
// the command waits for reads of its bucket in flight (the budget for
// reads of unknown cost is full) rather than for time: a caller may then
// re-try as soon as one of its own reads is in, besides after the wait.
func (g Grant) WaitsForReads() bool { return g.gated }

// The budget for reads of unknown cost. A read in flight may cost up to
// MaxReadUnits while only the bucket's estimate was billed for it: it holds
// MaxReadUnits - estimate units of the budget until it is settled. A
// bucket's budget is one burst of its highest rate (its hard limit, or its
// reservation plus the free pool), at least MaxReadUnits, so one read can
// always run; a read that would overrun it is held and re-tries after
// unknownPoll (the reads it waits for typically take a round trip to
// memcached; a caller may also re-try when one of its own reads is in).
const unknownPoll = int64(time.Millisecond)

// unknownForgiveAfter is how long a full budget for reads of unknown cost
// may go without any read settling before it is forgiven (see
// unknownFull): far longer than a read takes, even one that times out.
const unknownForgiveAfter = int64(30 * time.Second)

// The read estimate is a moving average of the units of a bucket's reads,
// kept with estShift fractional bits; each settled read moves it by
// 1/estWeight of the difference.
const (
	estShift  = 8
	estWeight = 8
	estMax    = int64(1<<30) << estShift
)

// AdmitCost decides whether the bucket may run its next metered command
// now, and bills it in advance: c.Known units, plus, for a read, the
// bucket's read estimate (at least one unit in all). The rules are those of
// the package documentation; reads also need room in the bucket's budget
// for reads of unknown cost (one read always has room).
//
// When admitted it returns the Grant to pass to Settle once the command has
// run, and a zero duration. Otherwise it returns the zero Grant and how long
// to wait (> 0, or InfDuration); nothing is billed.
//
// mode selects the caller's treatment. Unthrottled callers are always
// admitted (their reads hold no part of the budget, but are billed).
// NonBlocking callers are refused while the gauges have no room and should
// retry after the returned duration; they ignore the FIFO line. Blocking
// callers pass the Waiter of their connection (one Waiter per connection,
// used by one goroutine at a time):
//
//   - when held, w keeps a place in the bucket's FIFO line; the caller must
//     call AdmitCost again with the same w after the returned duration
//     (waking late is fine, early only costs a wasted call);
//   - while places are taken, a caller without one queues behind them even
//     if the gauges have room; a place is admitted only once the gauges have
//     room for it and for the places ahead of it (at the bucket's average
//     command size), so places are admitted, and their waits end, in the
//     order they were taken;
//   - when admitted, the place is given up;
//   - a connection that stops waiting (closed, or its command dropped) must
//     call w.Cancel, or its place delays the places behind it (room left
//     unclaimed for 100 ms forgives one lost place).
//
// A Blocking caller with a nil w is held without a place.
//
// AdmitCost takes no lock and does not allocate.
func (b *Bucket) AdmitCost(w *Waiter, mode Mode, c Cost) (Grant, time.Duration) {
	known := max(c.Known, 0)
	paid, open := known, int64(0)
	if c.Read {
		est := b.ReadEstimate()
		paid += est
		if mode != Unthrottled {
			open = max(b.e.maxRead-est, 0)
		}
	}
	paid = min(max(paid, 1), maxDebt)
	d, wait := b.admit(w, mode, paid, open, nil)
	switch d {
	case Held:
		return Grant{gated: open > 0 && wait == time.Duration(unknownPoll) && b.unknown.Load() > 0}, wait
	case Unmetered:
		open = 0
	}
	return Grant{Domain: d, read: c.Read, unthrottled: mode == Unthrottled, known: known, paid: paid, open: open}, 0
}

// Refuse gives up a held command: w's place in the line, if it holds one,
// is given back (as Cancel does) and the refusal counts as rejected, as a
// NonBlocking refusal does. For callers that hold a command only so long
// (throttle.max_hold) and then answer it with an error. It takes no lock
// and does not allocate; w may be nil.
func (b *Bucket) Refuse(w *Waiter) {
	if w != nil {
		w.Cancel()
	}
	b.rejected.Add(1)
}

// ReadEstimate returns the units the bucket's next read is expected to
// cost: MaxReadUnits until one of its reads has been settled (a read of
// unknown size is expected to be the largest), then the first read's
// units, moved by each later read by 1/8 of the difference (a moving
// average), rounded. It is at least 1.
func (b *Bucket) ReadEstimate() int64 {
	est := b.est.Load()
	if est < 0 {
		return b.e.maxRead
	}
	return max((est+1<<(estShift-1))>>estShift, 1)
}

// learn moves the read estimate towards a read's units. Concurrent updates
// may overwrite each other; each is an average of real samples.
func (b *Bucket) learn(units int64) {
	x := min(max(units, 1)<<estShift, estMax)
	est := b.est.Load()
	switch {
	case est < 0:
		b.est.Store(x)
	case x != est:
		b.est.Store(est + (x-est)/estWeight)
	}
}

// unknownFull reports whether a read holding open more units of the
// budget for reads of unknown cost would overrun it.
func (b *Bucket) unknownFull(now, open int64, lim *bucketLimits, node *nodeLimits) bool {
	u := b.unknown.Load()
	if u <= 0 {
		return false // one read always has room
	}
	if budget := b.unknownBudget(lim, node); budget == math.MaxInt64 || u+open <= budget {
		return false
	}
	// Full. If no read has settled for unknownForgiveAfter since the
	// budget filled, the reads holding it are presumed lost (a Grant never
	// settled): the budget is forgiven rather than holding the bucket's
	// reads for good.
	switch since := b.fullSince.Load(); {
	case since == 0:
		b.fullSince.CompareAndSwap(0, now)
	case now-since >= unknownForgiveAfter:
		if b.fullSince.CompareAndSwap(since, 0) {
			b.unknown.Store(0)
			return false
		}
	}
	return true
}

// unknownBudget returns the bucket's budget for reads of unknown cost: one
// burst of its fastest rate, at least MaxReadUnits; math.MaxInt64 when that
// rate is unlimited (no finite rate to protect).
func (b *Bucket) unknownBudget(lim *bucketLimits, node *nodeLimits) int64 {
	r := fastest(lim, node)
	if r == Unlimited {
		return math.MaxInt64
	}
	w := max(b.e.burst, 1)
	return max(b.e.maxRead, min(int64(r), math.MaxInt64/w)*w/int64(time.Second))
}

// Settle bills what an admitted command really cost, units in all (at
// least 1), against the bill g paid at admission: more is charged to the
// same domain and to the hard limit, less is given back to them, at the
// rates in force at the call. A read also gives back its part of the
// budget for reads of unknown cost and updates the read estimate.
//
// What reads cost beyond their bills is bounded by the bucket's budget for
// reads of unknown cost (one burst of its highest rate): billed to the free
// pool, it delays the other buckets drawing on the pool by at most that
// (a burst, when the bucket has no reservation), and never a bucket within
// its reservation.
//
// A Grant must be settled at most once, from any goroutine. A read's must
// be settled, also when the command failed or never ran (with units 1, the
// least a metered command costs): an unsettled read keeps its part of the
// budget for reads of unknown cost (until the budget, full with no read
// settling for 30 s, is forgiven). A Grant without Read whose command
// cost exactly its Known units needs no settling. Settle of the zero Grant
// does nothing. Settle takes no lock and does not allocate.
func (b *Bucket) Settle(g Grant, units int64) {
	if g.Domain == Held || g.Domain > Unmetered {
		return
	}
	units = max(units, 1)
	if g.open > 0 {
		b.unknown.Add(-g.open)
		if b.fullSince.Load() != 0 {
			b.fullSince.Store(0) // a read settled: the budget is alive
		}
	}
	if g.read {
		b.learn(units - g.known)
	}
	delta := min(units, maxDebt) - g.paid
	if delta == 0 {
		return
	}
	b.extra.Add(uint64(delta))
	if g.Domain == Unmetered {
		return
	}
	b.bill(g.Domain, delta, g.unthrottled)
}

// bill charges delta units more (delta > 0) or fewer (delta < 0) than
// were billed at admission to domain d (Reserved or FreePool) and the hard
// limit, at the rates in force.
func (b *Bucket) bill(d Domain, delta int64, unthrottled bool) {
	lim := b.lim.Load()
	if delta < 0 {
		b.refund(d, -delta, lim, unthrottled)
		return
	}
	switch d {
	case Reserved:
		if lim.res.cost != 0 {
			b.res.add(lim.res.ns(delta))
		}
	case FreePool:
		node := b.e.node.Load()
		if node.pool.cost != 0 {
			b.e.pool.add(node.pool.ns(delta))
		}
		if node.fairLag != 0 {
			b.fairBill(delta, unthrottled, node)
		}
	}
	if lim.hrd.cost != 0 {
		b.hard.add(lim.hrd.ns(delta))
	}
}

// refund gives back units billed in advance and not used.
func (b *Bucket) refund(d Domain, units int64, lim *bucketLimits, unthrottled bool) {
	switch d {
	case Reserved:
		if lim.res.cost != 0 {
			b.res.add(-lim.res.ns(units))
		}
	case FreePool:
		node := b.e.node.Load()
		if node.pool.cost != 0 {
			b.e.pool.add(-node.pool.ns(units))
		}
		if node.fairLag != 0 && !unthrottled {
			// (an unthrottled bill moved vt at most to the lag bound:
			// taking back all of it would undo more than it did)
			b.fairRefund(units)
		}
	}
	if lim.hrd.cost != 0 {
		b.hard.add(-lim.hrd.ns(units))
	}
}
