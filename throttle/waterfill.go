package throttle

import "math"

// Claim is one claimant's part in a [WaterFill] split of a pool: its weight,
// its cap and its demand (inputs, which WaterFill only reads) and the share
// WaterFill gives it (the output). Rates are in units per second; any rate
// may be math.Inf(1), which means no cap or unlimited demand. A caller
// keeps a []Claim per pool and refills it before each split, so splitting
// allocates nothing.
type Claim struct {
	// Weight is the claimant's weight, 1..MaxWeight: where the pool is
	// short, claimants that are not saturated get shares in proportion to
	// their weights. A weight below 1 counts as 1, one above MaxWeight as
	// MaxWeight.
	Weight int
	// Cap is the most the claimant may take from the pool, in units per
	// second (for a bucket, its hard limit minus its reservation), or
	// math.Inf(1) for no cap. A negative or NaN cap counts as 0.
	Cap float64
	// Demand is what the claimant wants from the pool now, in units per
	// second, as the caller estimates it, or math.Inf(1) for as much as it
	// can get. A negative or NaN demand counts as 0.
	Demand float64
	// Share is the output: the units per second of the pool the claimant
	// gets, in [0, min(Cap, Demand)]. WaterFill ignores its value on entry
	// and uses it as scratch space during the call.
	Share float64
}

// WaterFill splits pool units per second among claims by weighted max-min
// fairness (water-filling) and writes each claimant's share to its Share
// field. With m_i = min(Cap_i, Demand_i) what claimant i can use and w_i its
// weight:
//
//   - If the claims can use the whole pool (sum of m_i > pool), each gets
//     min(m_i, level*w_i), with the level chosen so that the shares add up
//     to the pool: a claimant is either saturated (gets all it can use) or
//     gets exactly level*w_i, and no saturated claimant gets more per unit
//     of weight than an unsaturated one. WaterFill returns that level (in
//     units per second per unit of weight, >= 0) and a leftover of 0.
//   - Otherwise (sum of m_i <= pool) every claimant gets m_i: nothing is
//     withheld from a claimant that wants it (the split is
//     work-conserving). WaterFill returns level +Inf and the leftover
//     pool - sum of m_i; +Inf if pool is +Inf.
//
// pool is in units per second: math.Inf(1) for an unlimited pool; a
// negative or NaN pool counts as 0. With no claims, WaterFill returns
// (+Inf, pool). A claimant with m_i +Inf and an unlimited pool gets +Inf.
//
// The shares are exact up to floating-point rounding: they add up to the
// pool within a relative error of about len(claims)*2^-52; each lies in
// [0, m_i], and a saturated claimant's share is exactly m_i. The result
// does not depend on the order of claims beyond rounding, and scaling the
// pool, caps and demands by a power of two scales shares and level exactly
// (short of overflow or underflow). Finite rates above 1e300 may make sums
// overflow, which costs precision but not feasibility.
//
// WaterFill does not allocate and takes expected O(n log n) time for n
// claims: a randomized binary search over the claimants' saturation levels,
// each step a pass over the claims, sped up by the classic step (saturate,
// recompute the level, repeat); a dozen passes for 10000 claimants with
// random demands, one when nobody saturates. It is deterministic: the same
// input gives the same output. It holds no lock and
// writes only claims' Share fields: callers sharing a []Claim between
// goroutines must synchronise.
func WaterFill(pool float64, claims []Claim) (level, leftover float64) {
	pool = nonNegative(pool)
	// The saturation level of claimant i is e_i = m_i/w_i: it is saturated
	// exactly when the water level reaches e_i. Share holds the e_i for now.
	total := 0.0
	for i := range claims {
		c := &claims[i]
		m := c.usable()
		total += m
		c.Share = m / c.weight()
	}
	if pool >= total {
		for i := range claims {
			claims[i].Share = claims[i].usable()
		}
		if math.IsInf(pool, 1) {
			return pool, pool
		}
		return math.Inf(1), pool - total
	}

	// The pool is short: 0 <= pool < total, and len(claims) >= 1. fill(x),
	// the sum of the shares at level x, rises with x from 0 to total; the
	// level is where it crosses pool, between two consecutive saturation
	// levels. Find the greatest saturation level a with fill(a) <= pool
	// (-Inf if there is none) by a randomized binary search: the candidates
	// are the saturation levels in claims[:k].Share, all above a and below
	// every level already known to overshoot. Each step tests one of them,
	// p, and keeps those on the side where the crossing is; the values only
	// need to be kept as a multiset, so the ones dropped are overwritten.
	//
	// The same pass also bounds the level from below: with used and wsum
	// the sums of m_i and w_i of the claimants saturated and unsaturated at
	// p, fill(x) <= used + x*wsum for every x, so the level is at least
	// (pool-used)/wsum. Candidates up to that bound are saturated too. This
	// is the classic step (saturate, recompute, repeat), which mostly ends
	// the search in a few passes; the binary search bounds its worst case.
	a := math.Inf(-1)
	k := len(claims)
	rng := uint64(k)*0x9e3779b97f4a7c15 + 1
	for k > 0 {
		var p float64
		p, rng = pivot(claims[:k], rng)
		used, wsum := split(claims, p)
		f := used + p*wsum
		if f == pool {
			a = p
			break
		}
		lo, hi := math.Inf(-1), p // keep the candidates in (lo, hi)
		if wsum > 0 {
			lo = (pool - used) / wsum
		}
		if f < pool {
			lo, hi = max(lo, p), math.Inf(1)
			a = max(a, p)
		}
		j := 0
		for i := 0; i < k; i++ {
			v := claims[i].Share
			if v <= lo {
				a = max(a, v)
			} else if v < hi {
				claims[j].Share = v
				j++
			}
		}
		k = j
	}

	// The claimants with e_i <= a are saturated; the others share the rest
	// by weight. Some claimant has e_i > a (else fill(a) = total > pool),
	// so wsum >= 1; and used <= fill(a) <= pool, as a sum of a subset of
	// the same non-negative terms in the same order.
	used, wsum := split(claims, a)
	level = max((pool-used)/wsum, a, 0)
	for i := range claims {
		c := &claims[i]
		m, w := c.usable(), c.weight()
		if m/w <= a {
			c.Share = m
		} else {
			c.Share = min(m, level*w)
		}
	}
	return level, 0
}

// split returns the sums of m_i over the claimants saturated at water level
// x (m_i/w_i <= x) and of w_i over the others: the shares at level x add up
// to used + x*wsum.
func split(claims []Claim, x float64) (used, wsum float64) {
	for i := range claims {
		c := &claims[i]
		m, w := c.usable(), c.weight()
		if m/w <= x {
			used += m
		} else {
			wsum += w
		}
	}
	return used, wsum
}

// pivot returns the median of the Share values of three pseudo-randomly
// chosen elements of claims (len(claims) >= 1), and the next state of the
// generator (xorshift64*, state never 0).
func pivot(claims []Claim, rng uint64) (float64, uint64) {
	n := uint64(len(claims))
	var v [3]float64
	for i := range v {
		rng ^= rng >> 12
		rng ^= rng << 25
		rng ^= rng >> 27
		r := (rng * 0x2545f4914f6cdd1d) >> 32
		v[i] = claims[(r*n)>>32].Share
	}
	return max(min(v[0], v[1]), min(max(v[0], v[1]), v[2])), rng
}

// usable returns min(Cap, Demand), counting negative and NaN values as 0.
func (c *Claim) usable() float64 { return min(nonNegative(c.Cap), nonNegative(c.Demand)) }

// weight returns the claimant's weight clamped to 1..MaxWeight.
func (c *Claim) weight() float64 {
	return float64(min(max(c.Weight, 1), MaxWeight))
}

// nonNegative returns x, or 0 for a negative or NaN x (and +0 for -0).
func nonNegative(x float64) float64 {
	if x > 0 {
		return x
	}
	return 0
}

// JainIndex returns Jain's fairness index of the weighted allocations
// y_i = x[i]/weights[i]: (sum y_i)^2 / (n * sum y_i^2) for n = len(x), in
// [1/n, 1]. It is 1 when every claimant got the same amount per unit of
// weight (for weights 1:2:3, allocations in the ratio 1:2:3), and k/n when
// k of them got equal amounts and the others nothing. x[i] is a rate (any
// unit); weights may be nil or shorter than x, a missing weight counting
// as 1, and a weight below 1 counts as 1. A negative or NaN x[i] counts as
// 0. With no allocations, or only zeros, JainIndex returns 1. The sums are
// scaled by the largest y_i, so huge rates do not overflow; if some y_i
// are +Inf, the others count as 0 beside them. It does not allocate.
func JainIndex(x []float64, weights []int) float64 {
	n := len(x)
	top := 0.0
	for i := range x {
		top = max(top, weighted(x, weights, i))
	}
	if top == 0 {
		return 1
	}
	inf := math.IsInf(top, 1)
	sum, sumsq := 0.0, 0.0
	for i := range x {
		y := weighted(x, weights, i)
		if inf {
			y = 0
			if math.IsInf(weighted(x, weights, i), 1) {
				y = 1
			}
		} else {
			y /= top
		}
		sum += y
		sumsq += y * y
	}
	return sum * sum / (float64(n) * sumsq)
}

// weighted returns x[i]/weights[i] for JainIndex.
func weighted(x []float64, weights []int, i int) float64 {
	w := 1
	if i < len(weights) {
		w = max(weights[i], 1)
	}
	return nonNegative(x[i]) / float64(w)
}
