package throttle

import (
	"sync/atomic"
	"time"
)

// Leases (see the package documentation, "Leases"): a Lease is a small
// stock of one bucket's units, billed to the bucket's gauges in advance as
// one admission (a draw) and then handed out to the commands of the one
// goroutine that owns the lease, which then write only the lease's own
// memory. The stock is given back (refunded exactly, as Settle refunds) when
// the owner's caller is held, when another caller of the bucket is held
// (the bucket's recall counter moves), when somebody waits in the bucket's
// FIFO line, when the limits change, and when it has not been used for
// LeaseTTL.

// LeaseTTL is how long a lease keeps a stock nobody uses: [Lease.Expire]
// gives it back once it has gone unused for that long.
const LeaseTTL = 2 * time.Millisecond

// The size of a lease's chunk, drawn at a time: leaseSpan of the rate of
// the domain it is drawn against (the reservation for Reserved; the lesser
// of the free pool and the hard limit for FreePool), at most
// 1/leaseBurstFrac of that rate's burst and leaseMaxChunk units. A chunk
// under leaseMinChunk units is not leased: the lease then admits every
// command through its bucket (a rate so low gains nothing from it).
const (
	leaseSpan      = int64(250 * time.Microsecond)
	leaseBurstFrac = 8
	leaseMaxChunk  = int64(1024)
	leaseMinChunk  = int64(2)
)

// Lease is a stock of one bucket's units, drawn in advance from the
// bucket's gauges, owned by ONE goroutine (in the proxy, one per event
// loop per bucket): while the stock covers its commands, AdmitCost and
// Settle write only the lease's memory. Admissions through a lease follow
// the rules of [Bucket.AdmitCost] at the granularity of a chunk; see the
// package documentation ("Leases") for what that changes.
//
// A Lease must not be used by two goroutines at once: AdmitCost, Settle,
// Expire and Return are for its owner only. Other goroutines keep using
// the Bucket (Bucket.Settle of a lease's Grant is correct too, only
// slower). A Lease holds nothing that needs closing beyond its stock:
// Return gives that back; after it the lease may be used again or dropped.
type Lease struct {
	_ [cacheLine]byte // the owner's memory only: no false sharing

	b    *Bucket
	lim  *bucketLimits // the limits the lease was set up for
	node *nodeLimits
	// set up for lim and node (see setup)
	chunkRes, chunkPool int64 // chunk per domain; 0: none
	bypass              bool  // a removed bucket: everything through the bucket
	unmetered           bool  // reservation Unlimited: counters only

	dom     Domain // what stock was drawn against; Held: no stock
	stock   int64  // units billed to dom and the hard limit, not yet used
	holding bool   // counted in b.stocked (stock may be > 0)
	recall  uint64 // b.recall when it started holding
	used    bool   // used since the last Expire
	idle    int64  // when Expire last found it used (engine clock)

	// not yet added to the bucket's
	commands int64
	extra    int64

	_ [cacheLine]byte
	// the lease's reads in flight by generation of the ceiling (see
	// ReadCost): written by the owner, read by TryDrain
	flight [2]atomic.Int64
	_      [cacheLine]byte
}

// NewLease returns a lease of the bucket's units, holding nothing yet. It
// is safe to call from any goroutine; the lease then belongs to one (see
// [Lease]). It does not allocate beyond the Lease.
func (b *Bucket) NewLease() *Lease {
	l := &Lease{b: b}
	l.setup(b.lim.Load(), b.e.node.Load())
	b.rc.register(l)
	return l
}

// leaseChunk returns the chunk of a domain of rate r for a burst of burst
// ns (0: no lease).
func leaseChunk(r Limit, burst int64) int64 {
	if r == Unlimited {
		return leaseMaxChunk
	}
	if r <= 0 {
		return 0
	}
	span := min(leaseSpan, burst/leaseBurstFrac)
	c := int64(min(float64(r)*float64(span)/float64(time.Second), float64(leaseMaxChunk)))
	if c < leaseMinChunk {
		return 0
	}
	return c
}

// setup gives back what the lease holds (drawn under other limits) and
// sets it up for lim and node.
func (l *Lease) setup(lim *bucketLimits, node *nodeLimits) {
	if l.lim != nil {
		l.refundAcross(l.lim, l.node)
	}
	l.giveBack()
	b := l.b
	l.lim, l.node = lim, node
	l.bypass = lim.removed
	l.unmetered = lim.res.limit == Unlimited
	burst := b.e.burst
	l.chunkRes = leaseChunk(lim.reserved, burst)
	pool := node.pool.limit
	if pool == Unlimited || lim.hard != Unlimited && lim.hard < pool {
		pool = lim.hard
	}
	l.chunkPool = leaseChunk(pool, burst)
}

// chunk returns the units a draw admitted against d adds to the stock.
func (l *Lease) chunk(d Domain) int64 {
	switch d {
	case Reserved:
		return l.chunkRes
	case FreePool:
		return l.chunkPool
	}
	return 0
}

// AdmitCost is [Bucket.AdmitCost] for the lease's owner, with the same
// contract (modes, Waiter, waits, Grant): pass the Grant to [Lease.Settle]
// (or Bucket.Settle). A command is admitted from the stock, writing no
// shared memory, when its caller is Blocking or NonBlocking, its Waiter
// holds no place, nobody waits in the bucket's line, no caller of the
// bucket has been held since the stock was drawn, the limits are those the
// stock was drawn under, and the stock covers its units (for a read, the
// bucket's ceiling). Otherwise the rest of
// the stock is given back and the command is admitted through the bucket,
// with a new chunk billed along with it when nobody waits: held, the
// caller is held exactly as by Bucket.AdmitCost. Unthrottled callers go
// through the bucket. Owner only; it takes no lock and does not allocate.
func (l *Lease) AdmitCost(w *Waiter, mode Mode, c Cost) (Grant, time.Duration) {
	b := l.b
	lim, node := b.lim.Load(), b.e.node.Load()
	if lim != l.lim || node != l.node {
		l.setup(lim, node)
	}
	if l.bypass || mode == Unthrottled {
		return b.AdmitCost(w, mode, c)
	}
	known := max(c.Known, 0)
	debt := b.takeDebt()
	paid := known + debt
	var flight *atomic.Int64
	if c.Read {
		ceil, f := b.rc.admitRead(&l.flight, c.Key)
		paid += ceil
		flight = f
	}
	paid = min(max(paid, 1), maxDebt)
	if w == nil || w.b == nil {
		if l.unmetered {
			l.commands++
			l.extra += paid - 1
			return Grant{Domain: Unmetered, read: c.Read, known: known, debt: debt, paid: paid, flight: flight}, 0
		}
		if paid <= l.stock && b.recall.Load() == l.recall && b.tail.Load() == b.served.Load() {
			l.stock -= paid
			l.commands++
			l.extra += paid - 1
			l.used = true
			return Grant{Domain: l.dom, read: c.Read, known: known, debt: debt, paid: paid, flight: flight}, 0
		}
	}
	g, wait := l.draw(w, mode, c.Read, known, paid)
	if g.Domain == Held {
		if flight != nil {
			flight.Add(-1)
		}
		b.Owe(debt)
	} else {
		g.flight, g.debt = flight, debt
	}
	return g, wait
}

// draw admits a command through the bucket, after giving back the stock,
// and bills a new chunk with it when nobody waits in the line.
func (l *Lease) draw(w *Waiter, mode Mode, read bool, known, paid int64) (Grant, time.Duration) {
	b := l.b
	l.giveBack()
	var chunked *Lease
	if l.chunkRes > 0 || l.chunkPool > 0 {
		t, s := b.tail.Load(), b.served.Load()
		if t == s || w != nil && w.b == b && t == s+1 {
			chunked = l
			l.hold() // before the bill: a caller held meanwhile recalls it
		}
	}
	d, wait := b.admit(w, mode, paid, chunked)
	if d == Held {
		l.giveBack() // a held caller's lease keeps nothing
		return Grant{}, wait
	}
	if l.stock == 0 {
		l.unhold()
	}
	l.used = true
	return Grant{Domain: d, read: read, known: known, paid: paid}, 0
}

// Settle is [Bucket.Settle] for the lease's owner, with the same contract,
// for Grants of the lease's bucket (from the lease or from the bucket).
// What the command cost
// beyond its bill is taken from the stock if it was drawn against the
// Grant's domain, and what it cost less is given back to the stock (beyond
// two chunks, to the bucket); the rest is billed to the bucket as Settle
// does. Grants of Unthrottled callers, and any Grant once the limits have
// changed, are settled by the bucket. Owner only; it takes no lock and
// does not allocate.
func (l *Lease) Settle(g Grant, units int64) {
	if g.Domain == Held || g.Domain > Unmetered {
		return
	}
	b := l.b
	if g.unthrottled || l.bypass || b.lim.Load() != l.lim || b.e.node.Load() != l.node {
		b.Settle(g, units)
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
	l.extra += delta
	if g.Domain == Unmetered {
		return
	}
	if g.Domain == l.dom {
		if delta < 0 {
			l.stock -= delta
			if c := 2 * l.chunk(l.dom); l.stock > c {
				// keep at most two chunks billed ahead
				b.bill(l.dom, c/2-l.stock, false)
				l.stock = c / 2
			}
			return
		}
		take := min(delta, l.stock)
		l.stock -= take
		if delta -= take; delta == 0 {
			return
		}
	}
	b.bill(g.Domain, delta, false)
}

// Expire gives the stock back if it is no longer the lease's to use: the
// limits changed, a caller of the bucket was held since it was drawn,
// somebody waits in the bucket's line, or it has not been used for
// LeaseTTL (counted from the first Expire that finds it used: call Expire
// every millisecond or few, and a stock goes back within LeaseTTL plus
// two such periods of its last use). It also adds the lease's counters to
// the bucket's (Stats). Owner only (e.g. on the event
// loop's tick); it takes no lock and does not allocate.
func (l *Lease) Expire() {
	b := l.b
	if lim, node := b.lim.Load(), b.e.node.Load(); lim != l.lim || node != l.node {
		l.setup(lim, node)
		return
	}
	if !l.holding {
		l.flush()
		return
	}
	if b.recall.Load() != l.recall || b.tail.Load() != b.served.Load() {
		l.giveBack()
		return
	}
	now := b.e.now()
	switch {
	case l.used:
		l.used = false
		l.idle = now
	case now-l.idle >= int64(LeaseTTL):
		l.giveBack()
		return
	}
	l.flush()
}

// Return gives back at once everything the lease holds (its units,
// refunded exactly to the gauges they were billed to) and adds its
// counters to the bucket's: call it when the owner stops (an event loop closing) or the
// bucket is removed. Grants still in flight may be settled after it, with
// Lease.Settle or Bucket.Settle. Owner only; the lease may be used again.
func (l *Lease) Return() { l.giveBack() }

// Holding reports whether the lease holds units of its bucket's that
// [Lease.Expire] may give back.
// Owner only.
func (l *Lease) Holding() bool { return l.holding }

// Stock returns the units the lease holds billed in advance and the
// domain they were billed against (Held when none). Owner only.
func (l *Lease) Stock() (Domain, int64) { return l.dom, l.stock }

// hold counts the lease as holding stock in its bucket, from now.
func (l *Lease) hold() {
	if !l.holding {
		l.holding = true
		l.b.stocked.Add(1)
		l.recall = l.b.recall.Load()
	}
}

// unhold counts the lease as holding nothing.
func (l *Lease) unhold() {
	if l.holding {
		l.holding = false
		l.b.stocked.Add(-1)
	}
}

// refundAcross gives the stock back after a change of limits from old and
// oldNode, under which it was drawn: to each gauge that billed it (its
// rate had a cost then) and still bills (it has one now), at the rate in
// force, as gauge.rescale keeps units owed. A gauge whose rate changed to
// or from one without a cost ("unlimited") was forgiven instead, and
// drawn with no cost the stock owes it nothing: refunding it there would
// move the gauge's bill into the past, where later bills (Settle's add)
// would vanish.
func (l *Lease) refundAcross(old *bucketLimits, oldNode *nodeLimits) {
	if l.stock > 0 {
		b, n := l.b, l.stock
		lim, node := b.lim.Load(), b.e.node.Load()
		switch l.dom {
		case Reserved:
			if old.res.cost != 0 && lim.res.cost != 0 {
				b.res.add(-lim.res.ns(n))
			}
		case FreePool:
			if oldNode.pool.cost != 0 && node.pool.cost != 0 {
				b.e.pool.add(-node.pool.ns(n))
			}
			if oldNode.fairLag != 0 && node.fairLag != 0 {
				b.fairRefund(n)
			}
		}
		if old.hrd.cost != 0 && lim.hrd.cost != 0 {
			b.hard.add(-lim.hrd.ns(n))
		}
	}
	l.stock, l.dom = 0, Held
}

// refundStock gives the units of the stock back to the gauges.
func (l *Lease) refundStock() {
	if l.stock > 0 {
		l.b.bill(l.dom, -l.stock, false)
	}
	l.stock, l.dom = 0, Held
}

// giveBack gives back everything the lease holds and flushes its counters.
func (l *Lease) giveBack() {
	l.refundStock()
	l.unhold()
	l.flush()
}

// flush adds the lease's counters to the bucket's.
func (l *Lease) flush() {
	b := l.b
	if l.commands != 0 || l.extra != 0 {
		b.commands.Add(uint64(l.commands))
		b.extra.Add(uint64(l.extra))
		l.commands, l.extra = 0, 0
	}
}

// recallLeases asks the leases holding a stock of the bucket to give it
// back (at their next use or Expire): a caller of the bucket is held.
func (b *Bucket) recallLeases() {
	if b.stocked.Load() > 0 {
		b.recall.Add(1)
	}
}
