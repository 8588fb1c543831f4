package proxy

import (
	"sort"

	"github.com/kvthrottle/kvthrottle/metrics"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// The Server is the metrics.Source of its metrics: everything is read from
// atomics at scrape time.
var _ metrics.Source = (*Server)(nil)

// AppendBuckets implements metrics.Source.
func (srv *Server) AppendBuckets(dst []metrics.BucketSnapshot) []metrics.BucketSnapshot {
	ten := srv.ten.Load()
	start := len(dst)
	for name, b := range ten.buckets {
		if b.gone.Load() {
			continue
		}
		st := b.tb.Stats()
		res, hard := ten.limits(name, st)
		dst = append(dst, metrics.BucketSnapshot{
			Name:        name,
			Reserved:    res.Float64(),
			HardLimit:   hard.Float64(),
			Weight:      b.tb.Weight(),
			Commands:    st.Commands,
			ReadUnits:   b.readUnits.Load(),
			WriteUnits:  b.writeUnits.Load(),
			Throttled:   st.Held,
			Rejected:    st.Rejected,
			Connections: b.conns.Load(),
		})
	}
	added := dst[start:]
	sort.Slice(added, func(i, j int) bool { return added[i].Name < added[j].Name })
	return dst
}

// NodeCapacity implements metrics.Source: the capacity in force (in fleet
// mode the fleet's, not this instance's share).
func (srv *Server) NodeCapacity() float64 { return srv.ten.Load().cfg.Throttle.Capacity.Float64() }

// FreePool implements metrics.Source, like NodeCapacity.
func (srv *Server) FreePool() float64 { return freePool(srv.ten.Load().cfg).Float64() }

// limits returns a bucket's limits in force: in fleet mode the fleet's
// (the engine enforces this instance's shares), else the engine's. st is
// the bucket's engine stats.
func (t *tenants) limits(name string, st throttle.Stats) (reserved, hard throttle.Limit) {
	if bc := t.cfg.Bucket(name); bc != nil {
		return bc.Throttle.Reserved, bc.Throttle.HardLimit
	}
	return st.Reserved, st.HardLimit
}

var _ metrics.FleetSource = (*Server)(nil)

// AppendFleet implements metrics.FleetSource.
func (srv *Server) AppendFleet(dst []metrics.FleetBucket) (metrics.FleetSnapshot, []metrics.FleetBucket, bool) {
	if srv.fleet == nil {
		return metrics.FleetSnapshot{}, dst, false
	}
	g := srv.fleet.fl.Grants()
	ten := srv.ten.Load()
	snap := metrics.FleetSnapshot{StoreUp: g.StoreUp(), Instances: g.Instances(), FreePoolGrant: g.FreePool(freePool(ten.cfg)).Float64()}
	start := len(dst)
	for _, bc := range ten.cfg.Buckets {
		res, hard := g.Limits(bc.Name, bc.Throttle.Reserved, bc.Throttle.HardLimit)
		fb := metrics.FleetBucket{Name: bc.Name, HardLimitGrant: hard.Float64(), ReservedGrant: res.Float64(), FleetUnitsPerSecond: -1}
		if bg, ok := g.Bucket(bc.Name); ok {
			fb.FleetUnitsPerSecond = bg.FleetUnitsPerSecond
		}
		dst = append(dst, fb)
	}
	added := dst[start:]
	sort.Slice(added, func(i, j int) bool { return added[i].Name < added[j].Name })
	return snap, dst, true
}

// AppendUpstreams implements metrics.Source.
func (srv *Server) AppendUpstreams(dst []metrics.UpstreamSnapshot) []metrics.UpstreamSnapshot {
	for _, st := range srv.pool.AppendStates(nil) {
		dst = append(dst, metrics.UpstreamSnapshot{Server: st.Addr, Up: st.Up, Ejected: st.Ejected})
	}
	return dst
}

// Ready reports whether at least one upstream server answers, with a
// reason when not; for /readyz.
func (srv *Server) Ready() (bool, string) {
	if srv.pool.AnyUp() {
		return true, ""
	}
	return false, "no upstream server answers"
}
