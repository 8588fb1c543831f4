package throttle

import "time"

// The FIFO line of a bucket is two counters: tail, the places handed out,
// and served, the places admitted or given back. A held Blocking caller
// takes place k = ++tail; its position is p = k - served - 1, the number of
// places still ahead of it. It is admitted once the gauges have room for
// p+1 commands of the bucket's average size, so the room of the places ahead
// stays theirs: with room for one command only the first place runs, with
// more room the next ones may run in the same instant. The waits handed out
// follow the same formula, so places are woken in order. Being counters,
// positions are exact while places are given up from the front; a place
// given back from further back moves every place up by one, so the place
// just ahead of it may tie with the one before.
//
// If room stays unclaimed for abandonAfter while places wait, one place is
// presumed lost (a Waiter dropped without Cancel) and forgiven, so a lost
// Waiter stalls its bucket only briefly; the forgiven place, if it comes
// back after all, is first in line.
const abandonAfter = int64(20 * time.Millisecond)

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
	b := w.b
	w.b, w.place = nil, 0
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
	if k == 0 {
		if d != Held && served >= b.tail.Load() {
			return 0, false // nobody waits and there is room
		}
		k = b.tail.Add(1)
		w.b, w.place = b, k
		b.held.Add(1)
	}
	if k <= served+1 { // first in line
		if d != Held {
			return 0, false
		}
		return until(now, at), true
	}
	if at == never {
		return InfDuration, true
	}
	// Room builds up for at most burst: the gauges have room for the
	// places ahead and this one at max(at, now-burst) + (their cost).
	from := max(at, now-b.e.burst)
	step := unitCost(lim, node)
	t := b.ahead(from, step, k-served-1)
	if t > now && at <= now-abandonAfter && b.lastServed.Load() <= now-abandonAfter {
		b.serve(now) // room unclaimed for too long: forgive a lost place
		t = b.ahead(from, step, k-min(b.served.Load(), k-1)-1)
	}
	if t <= now {
		return 0, false
	}
	return until(now, t), true
}

// ahead returns from plus the time n commands of the bucket's average size
// take at step nanoseconds per unit.
func (b *Bucket) ahead(from, step int64, n uint64) int64 {
	if n == 0 || step == 0 {
		return from
	}
	avg := int64(1)
	if c := b.commands.Load(); c > 0 {
		avg = int64((c + b.extra.Load()) / c)
	}
	u := int64(min(n, 1<<20)) * avg
	if u >= maxDebt/step {
		return from + maxDebt
	}
	return from + u*step
}
