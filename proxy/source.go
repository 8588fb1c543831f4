package proxy

import (
	"sort"

	"github.com/kvthrottle/kvthrottle/metrics"
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
		dst = append(dst, metrics.BucketSnapshot{
			Name:        name,
			Reserved:    st.Reserved.Float64(),
			HardLimit:   st.HardLimit.Float64(),
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

// NodeCapacity implements metrics.Source.
func (srv *Server) NodeCapacity() float64 { return srv.throttle.Capacity().Float64() }

// FreePool implements metrics.Source.
func (srv *Server) FreePool() float64 { return srv.throttle.FreePool().Float64() }

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
