package metrics

import (
	"math"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestUpstreamLoopObserversSum checks that the per-loop shards of a server
// export exactly what one prometheus.Histogram fed
// the same values exports.
func TestUpstreamLoopObserversSum(t *testing.T) {
	m := New(nil)
	ref := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ref", Buckets: upstreamBuckets})
	const server = "127.0.0.1:11211"
	obs := []prometheus.Observer{m.UpstreamLoopObserver(server, 0), m.UpstreamLoopObserver(server, 1), m.UpstreamLoopObserver(server, 2)}
	values := []float64{0, 0.00005, 0.00005000001, 0.0003, 0.001, 0.7, 2, 2.5, 100, math.Inf(1)}
	for i, v := range values {
		obs[i%len(obs)].Observe(v)
		ref.Observe(v)
	}
	// The same server and loop share their counters.
	m.UpstreamLoopObserver(server, 1).Observe(0.01)
	ref.Observe(0.01)

	got := upstreamHistogram(t, m, server)
	want := &dto.Metric{}
	if err := ref.Write(want); err != nil {
		t.Fatal(err)
	}
	w := want.GetHistogram()
	if got.GetSampleCount() != w.GetSampleCount() || got.GetSampleSum() != w.GetSampleSum() {
		t.Errorf("count %d sum %v, want %d %v", got.GetSampleCount(), got.GetSampleSum(), w.GetSampleCount(), w.GetSampleSum())
	}
	if len(got.GetBucket()) != len(w.GetBucket()) {
		t.Fatalf("%d buckets, want %d", len(got.GetBucket()), len(w.GetBucket()))
	}
	for i, b := range w.GetBucket() {
		if g := got.GetBucket()[i]; g.GetUpperBound() != b.GetUpperBound() || g.GetCumulativeCount() != b.GetCumulativeCount() {
			t.Errorf("bucket %d: le %v count %d, want le %v count %d", i, g.GetUpperBound(), g.GetCumulativeCount(), b.GetUpperBound(), b.GetCumulativeCount())
		}
	}

	o := m.UpstreamLoopObserver(server, 0)
	if n := testing.AllocsPerRun(1000, func() { o.Observe(0.0001) }); n != 0 {
		t.Errorf("a loop observer allocates %v times per Observe", n)
	}
	m.ForgetUpstream(server)
	if n := testutil.CollectAndCount(m.upstream); n != 0 {
		t.Errorf("%d upstream series after ForgetUpstream, want 0", n)
	}
	m.UpstreamLoopObserver("\xff", 0).Observe(1) // not exportable: discarded, no panic
	if n := testutil.CollectAndCount(m.upstream); n != 0 {
		t.Errorf("%d upstream series after an invalid label, want 0", n)
	}
}

// TestUpstreamLoopObserversConcurrent has loops observe into their own
// shards while scrapes run (for -race), then checks nothing was lost.
func TestUpstreamLoopObserversConcurrent(t *testing.T) {
	m := New(nil)
	const server, loops, each = "s:1", 4, 20000
	var wg sync.WaitGroup
	for l := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := m.UpstreamLoopObserver(server, l)
			for range each {
				o.Observe(0.0002)
			}
		}()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 50 {
			_, _ = m.Registry().Gather()
		}
	}()
	wg.Wait()
	<-done
	h := upstreamHistogram(t, m, server)
	if h.GetSampleCount() != loops*each {
		t.Errorf("count %d, want %d", h.GetSampleCount(), loops*each)
	}
	if want := 0.0002 * loops * each; math.Abs(h.GetSampleSum()-want) > 1e-6 {
		t.Errorf("sum %v, want %v", h.GetSampleSum(), want)
	}
}

// upstreamHistogram gathers server's series of the upstream histogram.
func upstreamHistogram(t *testing.T, m *Metrics, server string) *dto.Histogram {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != NameUpstreamLatency {
			continue
		}
		for _, s := range mf.GetMetric() {
			if len(s.GetLabel()) == 1 && s.GetLabel()[0].GetValue() == server {
				return s.GetHistogram()
			}
		}
	}
	t.Fatalf("no %s{server=%q}", NameUpstreamLatency, server)
	return nil
}

// BenchmarkUpstreamObserve compares one observation per response from two
// loops at once: into a prometheus.Histogram both loops share (what the
// upstream histogram was), and into each loop's own counters (UpstreamLoopObserver, what the proxy uses).
func BenchmarkUpstreamObserve(b *testing.B) {
	const loops = 2
	run := func(b *testing.B, obs func(loop int) prometheus.Observer) {
		var wg sync.WaitGroup
		per := b.N / loops
		b.ResetTimer()
		for l := range loops {
			wg.Add(1)
			go func() {
				defer wg.Done()
				o := obs(l)
				for i := range per {
					o.Observe(float64(i&1023) * 1e-6)
				}
			}()
		}
		wg.Wait()
	}
	b.Run("prometheus", func(b *testing.B) {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: upstreamBuckets})
		run(b, func(int) prometheus.Observer { return h })
	})
	b.Run("loop", func(b *testing.B) {
		m := New(nil)
		run(b, func(l int) prometheus.Observer { return m.UpstreamLoopObserver("s:1", l) })
	})
}
