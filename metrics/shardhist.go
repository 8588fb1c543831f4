package metrics

import (
	"math"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// shardedHistogram is a histogram vector with one label whose series are
// the sums, at scrape time, of shards: each event loop observes into its own
// shard, so observations from several loops never write the same cache
// line (a prometheus.Histogram is one set of counters that every observer
// updates with atomic read-modify-writes). It serves
// kvthrottle_upstream_request_duration_seconds, observed once per response.
type shardedHistogram struct {
	desc   *prometheus.Desc
	bounds []float64 // upper bounds, ascending; +Inf implied

	mu     sync.Mutex
	series map[string]shardSet // by label value
}

// shardSet is one series' shards, one per owning loop.
type shardSet map[int]*histShard

// histShard holds counts per bucket (len(bounds)+1, the last one +Inf) and
// the sum of the values observed, as float64 bits.
type histShard struct {
	bounds []float64
	counts []atomic.Uint64
	sum    atomic.Uint64
}

func newShardedHistogram(name, help, label string, bounds []float64) *shardedHistogram {
	return &shardedHistogram{
		desc:   prometheus.NewDesc(name, help, []string{label}, nil),
		bounds: bounds,
		series: make(map[string]shardSet),
	}
}

// setLocked returns value's shards, created on first use; nil when value is
// not valid UTF-8 (Prometheus cannot export it). h.mu is held.
func (h *shardedHistogram) setLocked(value string) shardSet {
	if !utf8.ValidString(value) {
		return nil
	}
	s := h.series[value]
	if s == nil {
		s = make(shardSet)
		h.series[value] = s
	}
	return s
}

func (h *shardedHistogram) newShard() *histShard {
	return &histShard{bounds: h.bounds, counts: make([]atomic.Uint64, len(h.bounds)+1)}
}

// owned returns the observer of value's series that only owner uses (one
// goroutine at a time): the same shard for the same owner until forget.
func (h *shardedHistogram) owned(value string, owner int) prometheus.Observer {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.setLocked(value)
	if s == nil {
		return discard{}
	}
	sh := s[owner]
	if sh == nil {
		sh = h.newShard()
		s[owner] = sh
	}
	return ownedObserver{sh}
}

// forget drops value's series; observers of it still work but are no
// longer exported.
func (h *shardedHistogram) forget(value string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.series, value)
}

// bucket returns the index of the bucket v falls in: the first upper bound
// at or above it (the +Inf one past the last bound). NaN counts as +Inf.
func (s *histShard) bucket(v float64) int {
	for i, b := range s.bounds {
		if v <= b {
			return i
		}
	}
	return len(s.bounds)
}

// ownedObserver writes its shard with plain loads and stores: one writer.
type ownedObserver struct{ s *histShard }

func (o ownedObserver) Observe(v float64) {
	c := &o.s.counts[o.s.bucket(v)]
	c.Store(c.Load() + 1)
	o.s.sum.Store(math.Float64bits(math.Float64frombits(o.s.sum.Load()) + v))
}

// Describe implements prometheus.Collector.
func (h *shardedHistogram) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

// Collect implements prometheus.Collector: each series is the sum of its
// shards. The count is the sum of the bucket counts, so a scrape racing
// with observations is still a consistent histogram (its sum may lag or
// lead the counts by the observations in progress).
func (h *shardedHistogram) Collect(ch chan<- prometheus.Metric) {
	h.mu.Lock()
	defer h.mu.Unlock()
	counts := make([]uint64, len(h.bounds)+1)
	for value, s := range h.series {
		clear(counts)
		var sum float64
		for _, sh := range s {
			for i := range sh.counts {
				counts[i] += sh.counts[i].Load()
			}
			sum += math.Float64frombits(sh.sum.Load())
		}
		buckets := make(map[float64]uint64, len(h.bounds))
		var cum uint64
		for i, b := range h.bounds {
			cum += counts[i]
			buckets[b] = cum
		}
		cum += counts[len(h.bounds)]
		m, err := prometheus.NewConstHistogram(h.desc, cum, sum, buckets, value)
		if err != nil {
			continue // (set admits only valid label values)
		}
		ch <- m
	}
}
