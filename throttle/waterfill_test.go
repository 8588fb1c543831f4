package throttle

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
)

var inf = math.Inf(1)

// relTol is the relative tolerance for sums and ratios of shares: the
// algorithm is exact up to a few roundings per claimant.
const relTol = 1e-9

// near reports whether x and y agree within relTol of scale (and exactly
// if both are infinite).
func near(x, y, scale float64) bool {
	if math.IsInf(x, 0) || math.IsInf(y, 0) {
		return x == y
	}
	return math.Abs(x-y) <= relTol*scale
}

// claimsOf builds claims from weights, caps and demands.
func claimsOf(w []int, c, d []float64) []Claim {
	cl := make([]Claim, len(w))
	for i := range w {
		cl[i] = Claim{Weight: w[i], Cap: c[i], Demand: d[i], Share: -42}
	}
	return cl
}

func shares(cl []Claim) []float64 {
	s := make([]float64, len(cl))
	for i := range cl {
		s[i] = cl[i].Share
	}
	return s
}

// checkWaterFill asserts the contract of WaterFill on the claims it has
// just filled, independently of any reference: feasibility, work
// conservation, max-min fairness, weight proportionality, and the level
// and leftover reported.
func checkWaterFill(t *testing.T, name string, pool float64, cl []Claim, level, leftover float64) {
	t.Helper()
	p := nonNegative(pool)
	want, sum := 0.0, 0.0
	for i := range cl {
		c := &cl[i]
		m := c.usable()
		want += m
		s := c.Share
		// (1) feasibility: 0 <= s_i <= min(c_i, d_i).
		if !(s >= 0 && s <= m) {
			t.Fatalf("%s: claim %d %+v: share %v outside [0, %v]", name, i, *c, s, m)
		}
		sum += s
	}
	if p >= want {
		// Enough for everybody: each gets all it can use.
		for i := range cl {
			if cl[i].Share != cl[i].usable() {
				t.Fatalf("%s: pool %v >= demand %v but claim %d %+v is cut", name, p, want, i, cl[i])
			}
		}
		wantLeft := p - want
		if math.IsInf(p, 1) {
			wantLeft = inf
		}
		if !math.IsInf(level, 1) || leftover != wantLeft {
			t.Fatalf("%s: level %v leftover %v, want +Inf and %v", name, level, leftover, wantLeft)
		}
		return
	}
	// (1, 2) the pool is used exactly, and not exceeded.
	if !near(sum, p, p) || leftover != 0 {
		t.Fatalf("%s: shares sum to %v (leftover %v), want pool %v", name, sum, leftover, p)
	}
	if !(level >= 0) || math.IsInf(level, 1) {
		t.Fatalf("%s: level %v", name, level)
	}
	// (3) max-min: nobody gets more per unit of weight than an unsaturated
	// claimant (s_i/w_i < s_j/w_j implies i saturated); (4) the unsaturated
	// get level*w_i, in proportion to their weights.
	top := 0.0
	for i := range cl {
		top = max(top, cl[i].Share/cl[i].weight())
	}
	for i := range cl {
		c := &cl[i]
		if c.Share == c.usable() {
			continue
		}
		r := c.Share / c.weight()
		if r < top*(1-relTol) {
			t.Fatalf("%s: claim %d %+v unsaturated with %v per weight, another gets %v", name, i, *c, r, top)
		}
		if !near(c.Share, level*c.weight(), c.Share) {
			t.Fatalf("%s: claim %d %+v unsaturated, share != level %v * weight", name, i, *c, level)
		}
	}
}

// refWaterFill is a slow reference: it finds the level by bisection on
// fill(x) = sum of min(m_i, x*w_i), down to adjacent floats.
func refWaterFill(pool float64, cl []Claim) []float64 {
	p := nonNegative(pool)
	out := make([]float64, len(cl))
	total := 0.0
	for i := range cl {
		total += cl[i].usable()
	}
	if p >= total {
		for i := range cl {
			out[i] = cl[i].usable()
		}
		return out
	}
	f := func(x float64) float64 {
		s := 0.0
		for i := range cl {
			s += min(cl[i].usable(), x*cl[i].weight())
		}
		return s
	}
	lo, hi := 0.0, p // fill(p) >= p: some claimant would get p*w_i >= p or be saturated
	for range 5000 {
		mid := lo + (hi-lo)/2
		if mid <= lo || mid >= hi {
			break
		}
		if f(mid) <= p {
			lo = mid
		} else {
			hi = mid
		}
	}
	for i := range cl {
		out[i] = min(cl[i].usable(), lo*cl[i].weight())
	}
	return out
}

// TestWaterFillExamples checks hand-computed splits, among them the
// examples of issue 16 (DESIGN.md section 13).
func TestWaterFillExamples(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name     string
		pool     float64
		w        []int
		c, d     []float64
		want     []float64
		level    float64
		leftover float64
	}{
		{"no claims", 9000, nil, nil, nil, nil, inf, 9000},
		{"no claims, no pool", 0, nil, nil, nil, nil, inf, 0},
		{"equal weights saturating", 9000, []int{1, 1, 1}, []float64{inf, inf, inf}, []float64{inf, inf, inf},
			[]float64{3000, 3000, 3000}, 3000, 0},
		{"weights 1:2:3", 6000, []int{1, 2, 3}, []float64{inf, inf, inf}, []float64{inf, inf, inf},
			[]float64{1000, 2000, 3000}, 1000, 0},
		{"capped claimant's rest goes to the others", 9000, []int{1, 1, 1}, []float64{1000, inf, inf}, []float64{inf, inf, inf},
			[]float64{1000, 4000, 4000}, 4000, 0},
		{"low demand's rest goes to the others", 9000, []int{1, 1, 1}, []float64{inf, inf, inf}, []float64{inf, 500, inf},
			[]float64{4250, 500, 4250}, 4250, 0},
		{"cap and weights", 100, []int{1, 1, 2}, []float64{10, inf, inf}, []float64{inf, inf, inf},
			[]float64{10, 30, 60}, 30, 0},
		{"saturation cascades", 100, []int{1, 1, 1, 1}, []float64{10, inf, inf, inf}, []float64{inf, 20, inf, inf},
			[]float64{10, 20, 35, 35}, 35, 0},
		{"heavy claimant saturates first", 1000, []int{10, 1, 1}, []float64{inf, inf, inf}, []float64{100, inf, inf},
			[]float64{100, 450, 450}, 450, 0},
		{"the larger weight saturates, not the larger demand", 120, []int{1, 4}, []float64{inf, inf}, []float64{100, 40},
			[]float64{80, 40}, 80, 0},
		{"pool left over", 100, []int{1, 5}, []float64{10, inf}, []float64{inf, 20},
			[]float64{10, 20}, inf, 70},
		{"exactly subscribed", 30, []int{1, 5}, []float64{10, inf}, []float64{inf, 20},
			[]float64{10, 20}, inf, 0},
		{"zero pool", 0, []int{1, 2}, []float64{inf, 5}, []float64{inf, inf},
			[]float64{0, 0}, 0, 0},
		{"all demands zero", 100, []int{1, 2, 3}, []float64{inf, inf, inf}, []float64{0, 0, 0},
			[]float64{0, 0, 0}, inf, 100},
		{"zero cap", 100, []int{1, 1}, []float64{0, inf}, []float64{inf, inf},
			[]float64{0, 100}, 100, 0},
		{"unlimited pool", inf, []int{1, 1}, []float64{5, inf}, []float64{inf, inf},
			[]float64{5, inf}, inf, inf},
		{"unlimited pool, no claims", inf, nil, nil, nil, nil, inf, inf},
		{"bad pool counts as 0", -5, []int{1}, []float64{inf}, []float64{inf}, []float64{0}, 0, 0},
		{"NaN pool counts as 0", nan, []int{1}, []float64{inf}, []float64{inf}, []float64{0}, 0, 0},
		{"bad caps and demands count as 0", 100, []int{1, 1, 1, 1}, []float64{-1, nan, inf, inf}, []float64{inf, inf, nan, math.Inf(-1)},
			[]float64{0, 0, 0, 0}, inf, 100},
		{"weights clamped", 10002, []int{0, -3, 20000}, []float64{inf, inf, inf}, []float64{inf, inf, inf},
			[]float64{1, 1, 10000}, 1, 0},
		{"weights 10000:1", 10001, []int{MaxWeight, 1}, []float64{inf, inf}, []float64{inf, inf},
			[]float64{10000, 1}, 1, 0},
		{"huge rates", 1e300, []int{1, 1}, []float64{inf, 1e300}, []float64{math.MaxFloat64, inf},
			[]float64{5e299, 5e299}, 5e299, 0},
		{"huge demands overflow their sum", 3e307, []int{1, 1, 1}, []float64{math.MaxFloat64, math.MaxFloat64, 1e307}, []float64{inf, inf, inf},
			[]float64{1e307, 1e307, 1e307}, 1e307, 0},
		{"tiny rates", 3e-300, []int{1, 1, 1}, []float64{inf, inf, 5e-301}, []float64{inf, inf, inf},
			[]float64{1.25e-300, 1.25e-300, 5e-301}, 1.25e-300, 0},
	} {
		cl := claimsOf(tc.w, tc.c, tc.d)
		level, leftover := WaterFill(tc.pool, cl)
		checkWaterFill(t, tc.name, tc.pool, cl, level, leftover)
		got := shares(cl)
		for i := range tc.want {
			if !near(got[i], tc.want[i], tc.want[i]) {
				t.Errorf("%s: shares %v, want %v", tc.name, got, tc.want)
				break
			}
		}
		if !near(level, tc.level, tc.level) || leftover != tc.leftover {
			t.Errorf("%s: level %v leftover %v, want %v and %v", tc.name, level, leftover, tc.level, tc.leftover)
		}
	}
}

// randClaims returns n random claims drawn from a mix of regimes: zero,
// unlimited, small integers (many ties), and log-uniform rates over many
// decades; weights small or log-uniform up to MaxWeight.
func randClaims(r *rand.Rand, n int) []Claim {
	rate := func() float64 {
		switch r.Intn(8) {
		case 0:
			return 0
		case 1, 2:
			return inf
		case 3:
			return float64(r.Intn(10) * 100)
		default:
			return math.Pow(10, r.Float64()*12-3)
		}
	}
	wideWeights := r.Intn(2) == 0
	cl := make([]Claim, n)
	for i := range cl {
		w := 1 + r.Intn(4)
		if wideWeights {
			w = int(math.Pow(MaxWeight, r.Float64()))
		}
		cl[i] = Claim{Weight: w, Cap: rate(), Demand: rate(), Share: r.Float64()}
	}
	return cl
}

// randPool returns a pool for cl: mostly a random fraction of what they
// can use (finite part), sometimes more than they can use, 0 or +Inf.
func randPool(r *rand.Rand, cl []Claim) float64 {
	total, top := 0.0, 0.0
	for i := range cl {
		if m := cl[i].usable(); !math.IsInf(m, 1) {
			total += m
			top = max(top, m)
		}
	}
	switch r.Intn(10) {
	case 0:
		return 0
	case 1:
		return inf
	case 2:
		return total * (1 + r.Float64())
	case 3:
		return top * r.Float64()
	}
	if total == 0 {
		total = 1000
	}
	return total * math.Pow(10, -3*r.Float64())
}

// TestWaterFillSaturatedExact checks that a claimant saturated exactly at
// the level gets exactly what it can use, though level*weight rounds
// below it.
func TestWaterFillSaturatedExact(t *testing.T) {
	m, w := 0.9, 3
	e := m / float64(w)
	if e*float64(w) == m {
		t.Fatal("test needs a level*weight that rounds below m")
	}
	for _, other := range []int{1, 2, 5} {
		cl := claimsOf([]int{w, other}, []float64{m, inf}, []float64{inf, inf})
		pool := m + e*float64(other)
		level, leftover := WaterFill(pool, cl)
		checkWaterFill(t, "tie", pool, cl, level, leftover)
		if cl[0].Share != m {
			t.Fatalf("other weight %d: saturated share %v, want exactly %v (level %v)", other, cl[0].Share, m, level)
		}
	}
}

// TestWaterFillMatchesReference checks the contract and compares with the
// bisection reference on thousands of random cases (fixed seeds).
func TestWaterFillMatchesReference(t *testing.T) {
	for seed := int64(1); seed <= 4000; seed++ {
		r := rand.New(rand.NewSource(seed))
		n := r.Intn(12)
		if seed%10 == 0 {
			n = r.Intn(500)
		}
		cl := randClaims(r, n)
		pool := randPool(r, cl)
		name := fmt.Sprintf("seed %d (n %d, pool %v)", seed, n, pool)
		ref := refWaterFill(pool, cl)
		level, leftover := WaterFill(pool, cl)
		checkWaterFill(t, name, pool, cl, level, leftover)
		for i := range cl {
			if !near(cl[i].Share, ref[i], max(nonNegative(pool), 1e-300)) {
				t.Fatalf("%s: claim %d %+v: share %v, reference %v", name, i, cl[i], cl[i].Share, ref[i])
			}
		}
	}
}

// TestWaterFillInvariance checks that scaling rates by a power of two
// scales shares and level exactly, that scaling by 3 and scaling all
// weights scale them within rounding, and that permuting the claims
// permutes the shares.
func TestWaterFillInvariance(t *testing.T) {
	for seed := int64(1); seed <= 1000; seed++ {
		r := rand.New(rand.NewSource(seed))
		n := 1 + r.Intn(40)
		cl := randClaims(r, n)
		for i := range cl {
			cl[i].Weight = min(cl[i].Weight, 1000) // room for scaling
		}
		pool := randPool(r, cl)
		base := append([]Claim(nil), cl...)
		level, leftover := WaterFill(pool, base)
		name := fmt.Sprintf("seed %d", seed)

		for _, k := range []float64{1024, 1.0 / 64, 3} {
			sc := append([]Claim(nil), cl...)
			for i := range sc {
				sc[i].Cap *= k
				sc[i].Demand *= k
			}
			l2, left2 := WaterFill(pool*k, sc)
			checkWaterFill(t, name, pool*k, sc, l2, left2)
			exact := k != 3
			for i := range sc {
				want := base[i].Share * k
				if exact && sc[i].Share != want || !near(sc[i].Share, want, pool*k) {
					t.Fatalf("%s: scale %v: claim %d share %v, want %v", name, k, i, sc[i].Share, want)
				}
			}
			if exact && (l2 != level*k || left2 != leftover*k) {
				t.Fatalf("%s: scale %v: level %v leftover %v, want %v and %v", name, k, l2, left2, level*k, leftover*k)
			}
		}

		ws := append([]Claim(nil), cl...)
		for i := range ws {
			ws[i].Weight *= 7
		}
		WaterFill(pool, ws)
		for i := range ws {
			if !near(ws[i].Share, base[i].Share, pool) {
				t.Fatalf("%s: weights x7: claim %d share %v, want %v", name, i, ws[i].Share, base[i].Share)
			}
		}

		perm := r.Perm(n)
		pc := make([]Claim, n)
		for i, j := range perm {
			pc[j] = cl[i]
		}
		WaterFill(pool, pc)
		for i, j := range perm {
			if !near(pc[j].Share, base[i].Share, pool) {
				t.Fatalf("%s: permuted: claim %d share %v, want %v", name, i, pc[j].Share, base[i].Share)
			}
		}
	}
}

// TestWaterFillMonotone checks that a larger pool takes from nobody, and
// that a claimant raising its demand and cap to unlimited gives no other
// claimant more.
func TestWaterFillMonotone(t *testing.T) {
	for seed := int64(1); seed <= 1000; seed++ {
		r := rand.New(rand.NewSource(seed))
		cl := randClaims(r, 1+r.Intn(30))
		pool := randPool(r, cl)
		if math.IsInf(pool, 1) {
			continue
		}
		base := append([]Claim(nil), cl...)
		WaterFill(pool, base)
		more := append([]Claim(nil), cl...)
		WaterFill(pool*1.5+1, more)
		for i := range more {
			if more[i].Share < base[i].Share*(1-relTol) {
				t.Fatalf("seed %d: larger pool: claim %d share %v < %v", seed, i, more[i].Share, base[i].Share)
			}
		}
		greedy := append([]Claim(nil), cl...)
		j := r.Intn(len(greedy))
		greedy[j].Demand, greedy[j].Cap = inf, inf
		WaterFill(pool, greedy)
		for i := range greedy {
			if i != j && greedy[i].Share > base[i].Share+relTol*pool {
				t.Fatalf("seed %d: claim %d grew greedy: claim %d share %v > %v", seed, j, i, greedy[i].Share, base[i].Share)
			}
		}
	}
}

// TestWaterFillLarge checks 10000 claimants, random and adversarial:
// saturation levels in a geometric series, where the classic algorithm
// (saturate, recompute, repeat) needs a pass per claimant.
func TestWaterFillLarge(t *testing.T) {
	r := rand.New(rand.NewSource(16))
	cl := randClaims(r, 10000)
	pool := 0.0
	for i := range cl {
		if m := cl[i].usable(); !math.IsInf(m, 1) {
			pool += m / 3
		}
	}
	level, leftover := WaterFill(pool, cl)
	checkWaterFill(t, "random", pool, cl, level, leftover)

	geo := make([]Claim, 10000)
	pool = 0
	for i := range geo {
		geo[i] = Claim{Weight: 1 + i%7, Cap: inf, Demand: math.Pow(1.002, float64(i)) * float64(1+i%7)}
		if i < 9990 {
			pool += geo[i].Demand
		}
	}
	level, leftover = WaterFill(pool, geo)
	checkWaterFill(t, "geometric", pool, geo, level, leftover)
	for i := range geo[:9000] {
		if geo[i].Share != geo[i].Demand {
			t.Fatalf("geometric: claim %d not saturated: %v < %v", i, geo[i].Share, geo[i].Demand)
		}
	}
}

// TestWaterFillAllocs checks that WaterFill and JainIndex allocate nothing.
func TestWaterFillAllocs(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	cl := randClaims(r, 1000)
	x := make([]float64, len(cl))
	w := make([]int, len(cl))
	if a := testing.AllocsPerRun(50, func() {
		WaterFill(12345, cl)
		for i := range cl {
			x[i], w[i] = cl[i].Share, cl[i].Weight
		}
		JainIndex(x, w)
	}); a != 0 {
		t.Fatalf("%v allocations per run", a)
	}
}

// TestJainIndex checks Jain's index of weighted allocations on
// hand-computed cases, among them issue 16's measurement (0.96).
func TestJainIndex(t *testing.T) {
	for _, tc := range []struct {
		name string
		x    []float64
		w    []int
		want float64
	}{
		{"empty", nil, nil, 1},
		{"all zero", []float64{0, 0}, nil, 1},
		{"equal", []float64{5, 5, 5, 5}, nil, 1},
		{"one gets all", []float64{0, 9, 0}, nil, 1.0 / 3},
		{"two of four", []float64{3, 0, 3, 0}, nil, 0.5},
		{"weights 1:2:3, shares 1:2:3", []float64{1000, 2000, 3000}, []int{1, 2, 3}, 1},
		{"weights 1:2:3, equal shares", []float64{2000, 2000, 2000}, []int{1, 2, 3}, 121.0 / 147},
		{"issue 16: 16/4/1 connections", []float64{2706, 3821, 2473}, nil, 81e6 / (3 * 28038206)},
		{"missing weights count as 1", []float64{2, 2, 2}, []int{1}, 1},
		{"bad values count as 0, bad weights as 1", []float64{4, -1, math.NaN(), 4}, []int{0, 1, 1, -2}, 0.5},
		{"huge", []float64{1e300, 1e300}, nil, 1},
		{"unlimited", []float64{inf, 5, inf, 7}, nil, 0.5},
	} {
		if got := JainIndex(tc.x, tc.w); !(math.Abs(got-tc.want) <= 1e-12) {
			t.Errorf("%s: JainIndex %v, want %v", tc.name, got, tc.want)
		}
	}
	// The index of WaterFill's shares of a short pool among unsaturated
	// claimants is 1, whatever their weights.
	cl := claimsOf([]int{1, 2, 3, 10000}, []float64{inf, inf, inf, inf}, []float64{inf, inf, inf, inf})
	WaterFill(1e6, cl)
	if got := JainIndex(shares(cl), []int{1, 2, 3, 10000}); !(math.Abs(got-1) <= 1e-12) {
		t.Errorf("weighted fair shares: JainIndex %v", got)
	}
}

// BenchmarkWaterFill measures one split of a short pool among n claimants
// with random weights, caps and demands (about a third saturated).
func BenchmarkWaterFill(b *testing.B) {
	for _, n := range []int{3, 100, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			r := rand.New(rand.NewSource(int64(n)))
			cl := make([]Claim, n)
			total := 0.0
			for i := range cl {
				d := math.Pow(10, 2+3*r.Float64())
				cl[i] = Claim{Weight: 1 + r.Intn(10), Cap: inf, Demand: d}
				total += d
			}
			pool := total / 2
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				WaterFill(pool, cl)
			}
		})
	}
}
