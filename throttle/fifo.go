package throttle

import "time"

// The FIFO line of a bucket is two counters: tail, the places handed out,
// and served, the places admitted or given back. A held Blocking caller
// takes place k = ++tail; its position is p = k - served - 1, the number of
// places still ahead of it. It is admitted once the gauges hold room for p
// commands of the bucket's average size and still admit, so the room of the
// places ahead stays theirs: with room for one command only the first place
// runs, with more room the next ones may run in the same instant. The room
// is read from the gauges as they are (another tenant may have taken the
// free pool); the waits handed out assume the bucket's fastest rate, so a
// place may wake early and wait again, but places are woken in order.
// Being counters, positions are exact while places are given up from the
// front; a place given back from further back moves every place up by
// one, so the place just ahead of it may tie with the one before.
//
// If room stays unclaimed for abandonAfter while places wait, one place is
// presumed lost (a Waiter dropped without Cancel) and forgiven, so a lost
// Waiter stalls its bucket only briefly; the forgiven place, if it comes
// back after all, is first in line. No place is told to wait more than
// maxRecheck past the time its bucket has room again (see queue), so a
// live place never looks lost (unless its caller re-tries later than
// abandonAfter - maxRecheck after the time it was given).
const abandonAfter = int64(100 * time.Millisecond)

// Waiter is a Blocking connection's place in its bucket's FIFO line. The
// zero value holds no place. A Waiter belongs to one connection and must
// not be used by two goroutines at once; pass it to every Admit of that
// connection and call Cancel when the connection stops waiting.
type Waiter struct {
	b     *Bucket
	place uint64
}

// Waiting reports whether w holds a place in a line.
func (w *Waiter) Waiting() bool { return w.b != nil }

// Place returns w's place in its bucket's line (places are numbered in the
// order they were taken: a lower place is further ahead), or 0 when it
// holds none.
func (w *Waiter) Place() uint64 { return w.place }

// Cancel gives w's place back, if it holds one, so that the places behind
// it move up at once. Call it when a held connection closes or drops its
// command; calling it again, or on a Waiter without a place, does nothing.
// The order of the line stays exact when the place given back is first in
// line; otherwise the place just ahead of it may tie with the one before
// (both then wake at the same time). It takes no lock and does not allocate.
func (w *Waiter) Cancel() {
	if w.b != nil {
		w.release(w.b.e.now())
	}
}

func (w *Waiter) release(now int64) {
	b, k := w.b, w.place
	w.b, w.place = nil, 0
	if b.forgiven[k%uint64(len(b.forgiven))].CompareAndSwap(k, 0) {
		return // counted as served when it was forgiven
	}
	b.serve(now)
}

// serve counts one place as served, never beyond the places handed out.
func (b *Bucket) serve(now int64) {
	for {
		s := b.served.Load()
		if s >= b.tail.Load() {
			return
		}
		if b.served.CompareAndSwap(s, s+1) {
			b.lastServed.Store(now)
			return
		}
	}
}

// queue applies the FIFO line to a Blocking caller for whom check gave d
// and at. It reports whether the caller is held, and for how long.
func (b *Bucket) queue(w *Waiter, now int64, d Domain, at int64, lim *bucketLimits, node *nodeLimits) (time.Duration, bool) {
	if w.b != nil && w.b != b {
		w.release(now) // a place in another bucket's line
	}
	served := b.served.Load()
	k := w.place
	taken := false // the place was taken by this call
	if k == 0 {
		if d != Held && served >= b.tail.Load() {
			return 0, false // nobody waits and there is room
		}
		k = b.tail.Add(1)
		w.b, w.place = b, k
		taken = true
	}
	if k <= served+1 { // first in line
		if d != Held {
			return 0, false
		}
		return b.hold(taken, until(now, at))
	}
	if at == never {
		return b.hold(taken, InfDuration)
	}
	// Behind others: admitted once the gauges hold, now, the room of the
	// places ahead (at the bucket's average command size) and still admit.
	ahead := k - served - 1
	room := b.room(now, lim, node)
	if room < b.need(ahead) && at <= now-abandonAfter {
		if last := b.lastServed.Load(); last <= now-abandonAfter && b.lastServed.CompareAndSwap(last, now) {
			b.forgive() // room unclaimed for too long: forgive a lost place
			ahead = k - min(b.served.Load(), k-1) - 1
		}
	}
	if ahead == 0 { // first in line now
		if d != Held {
			return 0, false
		}
		return b.hold(taken, until(now, at))
	}
	need := b.need(ahead)
	if d != Held && room >= need {
		return 0, false
	}
	// From when the gauges admit again (at), the room builds up at the
	// bucket's fastest rate at best: the wait handed out is the earliest
	// the place can go, and grows with the position, so places are woken
	// in order. It is an estimate (the places ahead may run smaller
	// commands than the average, or give their places back), so it is
	// capped: a place re-tries at most min(recheckBase + ahead *
	// recheckPerPlace, maxRecheck) after the gauges admit again, within
	// 5 ms when one place is ahead.
	step := unitCost(lim, node)
	wait := maxDebt
	if deficit := need - max(room, 0); step != 0 && deficit < maxDebt/step {
		wait = max(at-now, 0) + deficit*step
	}
	recheck := min(recheckBase+int64(min(ahead, 1<<20))*recheckPerPlace, maxRecheck)
	wait = min(wait, max(at-now, 0)+recheck)
	return b.hold(taken, time.Duration(max(wait, 1)))
}

// The longest wait handed to a place behind others, past the time the
// gauges admit again: recheckBase plus recheckPerPlace for each place
// ahead of it, at most maxRecheck. The places near the front re-check
// often, deep ones rarely: a line of n places costs about
// 2000 * ln(n) re-tries per second up to 100 places, plus 20 per second
// for each place beyond.
const (
	recheckBase     = int64(time.Millisecond)
	recheckPerPlace = int64(500 * time.Microsecond)
	maxRecheck      = abandonAfter / 2
)

// forgive counts the first place in line as served, presumed lost (its
// Waiter dropped without Cancel), and remembers it: should it come back
// after all, it is admitted without being counted a second time. The
// caller has claimed the forgiveness (moved lastServed), so that two
// callers do not forgive two places for the same unclaimed room.
func (b *Bucket) forgive() {
	for {
		s := b.served.Load()
		if s >= b.tail.Load() {
			return
		}
		if b.served.CompareAndSwap(s, s+1) {
			b.forgiven[(s+1)%uint64(len(b.forgiven))].Store(s + 1)
			return
		}
	}
}

// hold counts a command held for the first time (its place taken by this
// Admit) and returns wait, true.
func (b *Bucket) hold(taken bool, wait time.Duration) (time.Duration, bool) {
	if taken {
		b.held.Add(1)
	}
	return wait, true
}

// maxRoom stands for the room of a gauge without a limit.
const maxRoom = int64(1) << 40

// room returns the units the bucket's gauges can take at now and still
// admit: what its reservation and the free pool hold, bounded by its hard
// limit (negative when in debt, at most maxRoom). The bucket's own gauges
// keep one unit for the command that asks (rule 2: a bill must fit in
// the burst whole); the shared pool admits while it has any room.
func (b *Bucket) room(now int64, lim *bucketLimits, node *nodeLimits) int64 {
	burst := b.e.burst
	units := func(tat int64, r *rate) int64 {
		return (now + burst - max(tat, now)) / r.one
	}
	var shared int64
	if lim.res.cost != 0 {
		shared = max(units(b.res.tat.Load(), &lim.res)-1, 0)
	}
	switch {
	case node.pool.limit == Unlimited:
		shared = maxRoom
	case node.pool.cost != 0:
		pool := max(units(b.e.pool.tat.Load(), &node.pool), 0)
		if node.fairLag != 0 {
			pool = min(pool, max(b.fairRoom(node), 0))
		}
		shared += pool
	}
	switch {
	case lim.hrd.limit == Unlimited:
		return shared
	case lim.hrd.cost == 0:
		return 0
	default:
		return min(shared, units(b.hard.tat.Load(), &lim.hrd)-1)
	}
}

// need returns the units n commands of the bucket's average size take
// (at most maxRoom).
func (b *Bucket) need(n uint64) int64 {
	if n == 0 {
		return 0
	}
	avg := int64(1)
	if c := b.commands.Load(); c > 0 {
		avg = int64(min((c+b.extra.Load())/c, uint64(maxRoom)))
	}
	places := int64(min(n, 1<<20))
	if avg > maxRoom/places {
		return maxRoom
	}
	return places * avg
}
