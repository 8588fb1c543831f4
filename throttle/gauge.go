package throttle

import (
	"math/bits"
	"sync/atomic"
	"time"
)

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

// rescale keeps the units owed, and the units banked, when the gauge's
// rate changes from one finite rate to another; burst is the engine's.
// Owed: a bill running d past now becomes d*to/from. Banked: a gauge with
// room for u units at the old rate has room for u at the new one when the
// rate rises (its room then fills to the new burst at the new rate, not
// at once), and for at most the new burst's when it falls. So a rate that
// rises while the gauge is idle (a fleet share moving to the instance a
// load moves to) admits no more at once than it had banked. A change to or
// from a rate without a cost ("unlimited", or 0) forgives the debt
// instead: there is no rate to keep it at, and left as it is it would be
// read at the next finite rate as if it had been billed at that one.
func (g *gauge) rescale(now, burst int64, from, to *rate) {
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
		owed := float64(max(old-now, 0))
		d := owed * f
		if f < 1 && burst > 0 {
			// Room of burst-owed at the old rate is (burst-owed)/from
			// units; at the new rate the same units take (burst-owed)*f.
			d = float64(burst) - (float64(burst)-owed)*f
		}
		if d <= 0 && old <= now {
			return
		}
		n := now + int64(min(d, float64(maxDebt)))
		if g.tat.CompareAndSwap(old, n) {
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
