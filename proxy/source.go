package proxy

import (
	"math"
	"sort"

	"github.com/kvthrottle/kvthrottle/metrics"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// The Server is the metrics.Source of its metrics: everything is read from
// atomics at scrape time.
var _ metrics.Source = (*Server)(nil)

func rate(l throttle.Limit) float64 {
	if l == throttle.Unlimited {
		return math.Inf(1)
	}
	return float64(l)
}

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
			Reserved:    rate(st.Reserved),
			HardLimit:   rate(st.HardLimit),
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
func (srv *Server) NodeCapacity() float64 { return rate(srv.throttle.Capacity()) }

// FreePool implements metrics.Source.
func (srv *Server) FreePool() float64 { return rate(srv.throttle.FreePool()) }

// AppendUpstreams implements metrics.Source.
func (srv *Server) AppendUpstreams(dst []metrics.UpstreamSnapshot) []metrics.UpstreamSnapshot {
	h := srv.routing.Load().health
	for i, addr := range h.servers {
		dst = append(dst, metrics.UpstreamSnapshot{Server: addr, Up: h.up[i].Load(), Ejected: h.ejected[i].Load()})
	}
	return dst
}

// Ready reports whether at least one upstream server answers, with a
// reason when not; for /readyz.
func (srv *Server) Ready() (bool, string) {
	if srv.routing.Load().health.anyUp() {
		return true, ""
	}
	return false, "no upstream server answers"
}
