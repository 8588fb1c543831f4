package throttle

import (
	"math"
	"strconv"
	"time"
)

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

// admit applies the rules and the FIFO line at now, and on admission
// bills paid units. With a lease l (a draw, see lease.go) it also bills
// the lease's chunk for the domain admitted against, which becomes the
// lease's stock; the bucket's counters count paid only.
func (b *Bucket) admit(w *Waiter, mode Mode, paid int64, l *Lease) (Domain, time.Duration) {
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
	if node.fairLag != 0 && now >= e.fair.next.Load() {
		e.fairTick(now)
	}
	var bill [2]int64 // rule 2: the whole bill, per domain, with a lease's chunk
	bill[0], bill[1] = paid, paid
	if l != nil {
		bill[0] += l.chunkRes
		bill[1] += l.chunkPool
	}
	d, at, want := b.check(now, lim, node, bill)
	switch mode {
	case Unthrottled:
		if d == Held {
			d = FreePool
		}
	case NonBlocking:
		if d == Held {
			b.rejected.Add(1)
			b.recallLeases()
			return Held, b.wants(node, want, now, at, until(now, at))
		}
	default:
		if w == nil {
			if d == Held {
				b.held.Add(1)
				b.recallLeases()
				return Held, b.wants(node, want, now, at, until(now, at))
			}
		} else if wait, held := b.queue(w, now, d, at, lim, node); held {
			b.recallLeases()
			return Held, b.wants(node, want, now, at, wait)
		}
	}
	stock := int64(0)
	if l != nil {
		if stock = l.chunk(d); stock > 0 {
			l.stock, l.dom = stock, d
		}
	}
	b.precharge(now, d, lim, node, paid+stock, mode == Unthrottled)
	b.commands.Add(1)
	b.extra.Add(uint64(paid - 1))
	if w != nil && w.b != nil {
		w.release(now)
	}
	return d, 0
}

// never is the time at which a closed gauge has room.
const never = math.MaxInt64

// check applies rules 2 to 5 at now to a command whose whole bill is
// bill[0] units against its reservation and bill[1] against the free pool
// (with a lease's chunk). It returns the domain (Held when there is no
// room) and the time at which rules 2 to 5 admit (<= now when not held,
// never when only a change of limits can). In fair mode rule 3 also waits
// for the bucket's turn (see fair.go), and want says what the bucket, if
// held, is held by (see fairHold).
//
// The bucket's own gauges (its reservation and hard limit) admit a bill of
// c ns when max(tat, now) + c <= now + max(burst, c): the whole bill fits
// in the burst, or a bill larger than the burst finds the gauge paid up.
// So any window w holds at most r*w + max(r*burst, the largest bill) of a
// bucket's units. The shared free pool admits while tat - burst <= now, so
// that a large bill cannot starve there.
func (b *Bucket) check(now int64, lim *bucketLimits, node *nodeLimits, bill [2]int64) (d Domain, at int64, want fairHold) {
	burst := b.e.burst
	tRes := int64(never)
	if lim.res.cost != 0 {
		if tRes = b.res.tat.Load() - max(burst-lim.res.ns(bill[0]), 0); tRes <= now {
			return Reserved, tRes, heldOther
		}
	}
	tPool := int64(math.MinInt64)
	switch {
	case node.pool.limit == Unlimited:
	case node.pool.cost == 0:
		tPool = never
	default:
		tPool = b.e.pool.tat.Load() - burst
	}
	tHard := int64(math.MinInt64)
	switch {
	case lim.hrd.limit == Unlimited:
	case lim.hrd.cost == 0:
		tHard = never
	default:
		tHard = b.hard.tat.Load() - max(burst-lim.hrd.ns(bill[1]), 0)
	}
	tFree := max(tPool, tHard)
	if tHard > now {
		want = heldHard
	}
	if node.fairLag != 0 && tHard <= now {
		// Its hard limit does not hold the bucket: it takes the pool in
		// its turn.
		want = heldPool
		ok, turn := b.fairTurn(now, node)
		if !ok {
			tFree = max(tFree, turn)
		} else if tPool > now && tPool != never {
			// Held by the pool: buckets further ahead wake later, so that
			// pool room goes to the one furthest behind first (by at most
			// the burst: room left unclaimed for longer is lost).
			tFree = max(tFree, tPool+min(turn, burst))
		}
	}
	if tFree <= now {
		return FreePool, tFree, want
	}
	return Held, min(tRes, tFree), want
}

// fairHold is what holds a bucket, as fair sharing sees it.
type fairHold uint8

const (
	heldOther fairHold = iota // its reservation's room
	heldPool                  // the free pool, or its turn: it wants more of the pool
	heldHard                  // its hard limit: it takes all it may
)

// wants records, for a held bucket in fair mode, what holds it: the pool
// or its turn (it wants more of the pool than it gets, until at, when the
// gauges and its turn admit it again: a caller without a place in the
// line, told to wait longer, does not keep it wanting) or its hard limit
// (its places no longer count as wanting); it returns wait.
func (b *Bucket) wants(node *nodeLimits, why fairHold, now, at int64, wait time.Duration) time.Duration {
	switch {
	case node.fairLag == 0:
	case why == heldPool:
		b.fairWant(max(at, now))
	case why == heldHard:
		b.fairCapped()
	}
	return wait
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
func (b *Bucket) precharge(now int64, d Domain, lim *bucketLimits, node *nodeLimits, units int64, unthrottled bool) {
	switch d {
	case Reserved:
		b.res.charge(now, lim.res.cost1(units))
	case FreePool:
		if node.pool.cost != 0 {
			b.e.pool.charge(now, node.pool.cost1(units))
		}
		if node.fairLag != 0 {
			b.fairBill(units, unthrottled, node)
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

// until converts the admission time at into a wait from now.
func until(now, at int64) time.Duration {
	if at == never {
		return InfDuration
	}
	return time.Duration(max(at-now, 1))
}
