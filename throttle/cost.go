package throttle

import (
	"sync/atomic"
	"time"
)

// Cost is what a command is expected to cost, given to [Bucket.AdmitCost].
type Cost struct {
	// Known is the units known before the command runs: a write's key
	// and value sent. Values below 0 count as 0.
	Known int64
	// Read says the command also returns data whose units are known only
	// once its response is in (GET, GAT, TOUCH): the bucket's ceiling
	// ([ReadCost]) is billed in advance, and what the read costs less is
	// given back when it is settled.
	Read bool
	// Key is a read's key as the client sent it, or nil: a read of a key
	// on its bucket's list of large keys is billed that key's class when
	// it is above the ceiling. Not kept beyond the call.
	Key []byte
}

// Grant is the bill of an admitted command, from [Bucket.AdmitCost]: pass it
// to [Bucket.Settle] once the command has run. The zero Grant (Domain
// Held) stands for a command that was not admitted.
type Grant struct {
	// Domain is what the command was admitted against.
	Domain      Domain
	read        bool
	unthrottled bool  // admitted in Unthrottled mode
	known       int64 // Cost.Known
	debt        int64 // the bucket's debt billed with it (Bucket.Owe)
	paid        int64 // units billed at admission
	// flight counts the read among its bucket's reads in flight (by the
	// generation of the ceiling it was billed under) until it is settled
	flight *atomic.Int64
}

// Paid returns the units billed when the command was admitted.
func (g Grant) Paid() int64 { return g.paid }

// Debt returns the units of the bucket's debt (Bucket.Owe) billed with
// the command: paid off by it, and no part of its own cost.
func (g Grant) Debt() int64 { return g.debt }

// ReadBill returns the units billed at admission for what the command
// reads (its ceiling; 0 for a command that does not read).
func (g Grant) ReadBill() int64 {
	if !g.read {
		return 0
	}
	return g.paid - g.known - g.debt
}

// AdmitCost decides whether the bucket may run its next metered command
// now, and bills it in advance: c.Known units, plus, for a read, the
// bucket's ceiling ([Bucket.ReadCost]), at least one unit in all. The rules
// are those of the package documentation.
//
// When admitted it returns the Grant to pass to Settle once the command has
// run, and a zero duration. Otherwise it returns the zero Grant and how long
// to wait (> 0, or InfDuration); nothing is billed.
//
// mode selects the caller's treatment. Unthrottled callers are always
// admitted (and billed). NonBlocking callers are refused while the gauges
// have no room and should retry after the returned duration; they ignore
// the FIFO line. Blocking callers pass the Waiter of their connection (one
// Waiter per connection, used by one goroutine at a time):
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
	debt := b.takeDebt()
	paid := known + debt
	var flight *atomic.Int64
	if c.Read {
		ceil, f := b.rc.admitRead(&b.rc.flight, c.Key)
		paid += ceil
		flight = f
	}
	paid = min(max(paid, 1), maxDebt)
	d, wait := b.admit(w, mode, paid, nil)
	if d == Held {
		if flight != nil {
			flight.Add(-1)
		}
		b.Owe(debt)
		return Grant{}, wait
	}
	return Grant{Domain: d, read: c.Read, unthrottled: mode == Unthrottled, known: known, debt: debt, paid: paid, flight: flight}, 0
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

// Owe records units a command of the bucket cost beyond its bill that it
// can no longer pay before its answer is delivered (its connection closed
// while the excess waited to be paid): the bucket's debt, added to the
// bills of its next admitted commands, at most one largest read
// (Config.MaxReadUnits) on each, so that it is paid through admission
// (held while the bucket's limits, or the free pool, have no room) and a
// gauge others share takes no more of it at once than of one large read.
// It takes no lock.
func (b *Bucket) Owe(units int64) {
	if units > 0 {
		b.debt.Add(units)
	}
}

// takeDebt takes the next part of the bucket's debt, at most one largest
// read (one atomic load when there is none).
func (b *Bucket) takeDebt() int64 {
	for {
		d := b.debt.Load()
		if d == 0 {
			return 0
		}
		part := min(d, b.e.maxRead)
		if b.debt.CompareAndSwap(d, d-part) {
			return part
		}
	}
}

// ReadCost returns the bucket's ceiling: what its reads are billed.
func (b *Bucket) ReadCost() *ReadCost { return &b.rc }

// Settle bills what an admitted command really cost, units in all (at
// least 1), against the bill g paid at admission: less is given back to
// the domain it was billed to and to the hard limit, more is charged to
// them, at the rates in force at the call. A read that cost more than its
// bill (a surprise: a value written around the proxy) also raises the
// bucket's ceiling; callers that can should pay such a surprise through
// admission before they deliver the read (the proxy does: docs, rule 3),
// and then settle g with at most its bill.
//
// A Grant must be settled at most once, from any goroutine. A read's must
// be settled, also when the command failed or never ran (with units 1,
// the least a metered command costs): an unsettled read holds up the next
// raise of its bucket's ceiling. A Grant without Read whose command cost
// exactly its Known units needs no settling. Settle of the zero Grant
// does nothing. Settle takes no lock and does not allocate.
func (b *Bucket) Settle(g Grant, units int64) {
	if g.Domain == Held || g.Domain > Unmetered {
		return
	}
	units = max(units, 1) + g.debt
	if g.flight != nil {
		g.flight.Add(-1)
	}
	if g.read && units > g.paid {
		b.rc.Surprise(units-g.known-g.debt, 0)
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
