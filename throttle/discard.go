package throttle

import (
	"math/bits"
	"time"
)

// maxDiscardUnit caps the unit size Discard counts in, which keeps its
// fixed-point products within 128 bits.
const maxDiscardUnit = int64(1) << 40

// Discard paces bytes a caller reads from a client only to drop them: the
// value of a write refused before it was read (too large for memcached).
// They are not the contract's units and count in no statistic: they are
// billed on a gauge of their own, at the bucket's fastest rate (its hard
// limit, or its reservation plus the free pool when that is lower) in
// units of unitSize bytes, with one burst of room, so a client can push
// refused bytes no faster than the bucket could write them. A bucket whose
// fastest rate is unlimited (or whose reservation is) drops at any speed.
//
// Discard grants up to want bytes: it returns how many may be dropped now
// (billed), and, when that is fewer than want, how long until at least a
// unit's worth more may be (InfDuration when the bucket's fastest rate is
// 0). Over any window w it grants at most rate*w plus one burst of
// bytes, and one byte, in all; with no burst (burst_ms = 0), one unit's
// bytes whenever its gauge is paid up, so rate*w plus one unit. It takes no lock and does not allocate.
func (b *Bucket) Discard(want, unitSize int64) (n int64, wait time.Duration) {
	if want <= 0 {
		return 0, 0
	}
	lim := b.lim.Load()
	if lim.res.limit == Unlimited {
		return want, 0
	}
	r := fastest(lim, b.e.node.Load())
	if r == Unlimited {
		return want, 0
	}
	if r <= 0 {
		return 0, InfDuration
	}
	unitSize = min(max(unitSize, 1), maxDiscardUnit)
	rt := newRate(r)
	now := b.e.now()
	start := max(b.discard.tat.Load(), now)
	room := now + b.e.burst - start
	if b.e.burst <= 0 && start == now {
		// No burst: a gauge paid up grants one unit's bytes (as rule 2
		// admits a bill larger than the burst on a gauge paid up).
		room = discardNs(min(want, unitSize), unitSize, &rt)
	}
	if room > 0 {
		n = min(want, max(discardBytes(room, unitSize, &rt), 1))
		b.discard.charge(now, discardNs(n, unitSize, &rt))
	}
	if n == want {
		return n, 0
	}
	next := max(b.discard.tat.Load(), now) - b.e.burst + discardNs(min(want-n, unitSize), unitSize, &rt)
	if b.e.burst <= 0 {
		next = max(b.discard.tat.Load(), now) // paid up again
	}
	return n, until(now, next)
}

// discardNs returns the nanoseconds n bytes take at rate r in units of
// unitSize bytes, capped at maxDebt.
func discardNs(n, unitSize int64, r *rate) int64 {
	hi, lo := bits.Mul64(uint64(n), r.cost)
	d := uint64(unitSize) << fracBits
	if hi >= d {
		return maxDebt
	}
	q, _ := bits.Div64(hi, lo, d)
	return int64(min(q+1, uint64(maxDebt)))
}

// discardBytes returns the bytes that ns nanoseconds pay for at rate r in
// units of unitSize bytes.
func discardBytes(ns, unitSize int64, r *rate) int64 {
	hi, lo := bits.Mul64(uint64(ns), uint64(unitSize)<<fracBits)
	if hi >= r.cost {
		return maxDebt
	}
	q, _ := bits.Div64(hi, lo, r.cost)
	return int64(min(q, uint64(maxDebt)))
}
