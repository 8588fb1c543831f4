package fleet

import (
	"sync/atomic"

	"github.com/kvthrottle/kvthrottle/throttle"
)

type grantMode uint8

const (
	modeGranted  grantMode = iota // shares from the store (maybe a little old)
	modeFallback                  // the store lost for lossAfter periods
)

// BucketGrant is this instance's share of one bucket's fleet limits, in
// units per second, -1 for unlimited, and the whole fleet's usage of the
// bucket over the last period (-1 until known).
type BucketGrant struct {
	Reserved, HardLimit int64
	// Pool is, when the instance shares the free pool fairly
	// (Node.Fair), the bucket's share here of the fleet's free pool: the
	// store splits the fleet's free pool among the buckets by weighted
	// max-min over their fleet-wide demand, then each bucket's share among
	// the instances by their demand. The instance's free pool grant is the
	// sum over its buckets (clamped, like every share, so that the live
	// instances' free pool grants never add up to more than the fleet's
	// free pool); the instance splits it in proportion to these, which are
	// proportions, not limits: across instances they may add up to more
	// than the free pool. -1 when not sharing fairly, or with an unlimited
	// free pool.
	Pool                int64
	FleetUnitsPerSecond float64
}

// Grants are the limits this instance enforces as its part of the fleet's:
// its shares from the store or, once the store has been lost for three
// periods, the fallback of the loss policy. A Grants is immutable.
type Grants struct {
	mode     grantMode
	policy   LossPolicy
	storeUp  bool // the last store call succeeded
	live     int  // instances alive at the last contact, >= 1
	freePool int64
	buckets  map[string]BucketGrant
	// last, in a fallback's first periods (see capPeriods), is the last
	// grants from the store: each limit is then the lower of the loss
	// policy's part and this grant, so that an instance that falls back
	// before the others cannot take its part while they still hold their
	// shares.
	last *Grants
}

// StoreUp reports whether the last call to the store succeeded.
func (g *Grants) StoreUp() bool { return g.storeUp }

// Instances returns the number of instances alive at the last contact with
// the store (1 before any).
func (g *Grants) Instances() int { return g.live }

// Fallback reports whether the store has been lost long enough for the loss
// policy to apply.
func (g *Grants) Fallback() bool { return g.mode == modeFallback }

// Bucket returns the named bucket's grant; ok is false when the store has
// granted nothing for it (a bucket configured since the last sync, or no
// contact yet).
func (g *Grants) Bucket(name string) (bg BucketGrant, ok bool) {
	bg, ok = g.buckets[name]
	return bg, ok
}

func (g *Grants) reservedGrant(name string) int64 {
	if b, ok := g.buckets[name]; ok && b.Reserved > 0 {
		return b.Reserved
	}
	return 0
}

// Limits returns what this instance enforces for a bucket whose fleet
// limits are reserved and hard: its shares when the store granted them,
// else the loss policy's part (the fleet limit divided among the live
// instances for Share, all of it for Open). reserved <= hard holds for the
// result whenever it holds for the arguments.
func (g *Grants) Limits(name string, reserved, hard throttle.Limit) (throttle.Limit, throttle.Limit) {
	if g.mode == modeGranted {
		if b, ok := g.buckets[name]; ok {
			r, h := g.grantLimit(b.Reserved, reserved), g.grantLimit(b.HardLimit, hard)
			if h != throttle.Unlimited && (r == throttle.Unlimited || r > h) {
				r = h
			}
			return r, h
		}
	}
	r, h := g.part(reserved), g.part(hard)
	if g.last != nil {
		lr, lh := g.last.Limits(name, reserved, hard)
		r, h = minLimit(r, lr), minLimit(h, lh)
	}
	return r, h
}

// FreePool returns the part of the fleet's free pool (the capacity less the
// finite reservations) that this instance may use.
func (g *Grants) FreePool(fleet throttle.Limit) throttle.Limit {
	if g.mode == modeGranted && g.buckets != nil {
		return g.grantLimit(g.freePool, fleet)
	}
	if g.last != nil {
		return minLimit(g.part(fleet), g.last.FreePool(fleet))
	}
	return g.part(fleet)
}

// minLimit is the lower of two limits, Unlimited being above every other.
func minLimit(a, b throttle.Limit) throttle.Limit {
	if a.LessOrEqual(b) {
		return a
	}
	return b
}

// grantLimit is a store grant as a Limit. A grant of -1 for a limit that is
// finite here (the store answered a report made before a local change), or
// a grant above the limit, gives way to the limit's loss-policy part until
// the next sync.
func (g *Grants) grantLimit(n int64, configured throttle.Limit) throttle.Limit {
	c, finite := configured.Finite()
	switch {
	case !finite:
		return throttle.Unlimited
	case n < 0 || n > c:
		return g.part(configured)
	}
	return throttle.Limit(n)
}

// part is this instance's part of a fleet limit without a grant.
func (g *Grants) part(l throttle.Limit) throttle.Limit {
	n, ok := l.Finite()
	if !ok || g.policy == Open || g.live <= 1 {
		return l
	}
	p := n / int64(g.live)
	if p == 0 && n > 0 {
		p = 1
	}
	return throttle.Limit(p)
}

type atomicGrants struct{ p atomic.Pointer[Grants] }

func (a *atomicGrants) Load() *Grants   { return a.p.Load() }
func (a *atomicGrants) Store(g *Grants) { a.p.Store(g) }

// demandSamples keeps the last samplesPerPeriod counts of held callers per
// bucket.
type demandSamples struct {
	n     int // samples taken
	count map[string]*[samplesPerPeriod]int32
}

func (d *demandSamples) add(usage []Usage) {
	if d.count == nil {
		d.count = make(map[string]*[samplesPerPeriod]int32)
	}
	i := d.n % samplesPerPeriod
	d.n++
	for _, u := range usage {
		c := d.count[u.Name]
		if c == nil {
			c = new([samplesPerPeriod]int32)
			d.count[u.Name] = c
		}
		c[i] = int32(min(u.Waiting, 1<<30))
	}
}

// mean is the mean of the latest period's samples.
func (d *demandSamples) mean(name string) float64 {
	c := d.count[name]
	if c == nil || d.n == 0 {
		return 0
	}
	k := min(d.n, samplesPerPeriod)
	sum := 0
	for j := 1; j <= k; j++ {
		sum += int(c[(d.n-j)%samplesPerPeriod])
	}
	return float64(sum) / float64(k)
}
