package proxy

import (
	"bytes"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestConnectionsShareTheirBucket (issue 16, within a bucket): the
// connections of a bucket at its hard limit share it about equally,
// however deep they pipeline. Seven connections keep 16 GETs in flight
// each and one sends a GET at a time; a held session keeps one place in
// its bucket's line whatever it has queued behind, so the one-at-a-time
// connection is not starved by the pipelines: it gets its turn as often as
// they do. (Were the line per command, it would get about 1 in 113 of the
// bucket's units.) The spread of the per-connection rates, and Jain's
// index of them, are logged.
func TestConnectionsShareTheirBucket(t *testing.T) {
	const (
		limit  = 1000 // units/s; a 100-byte GET is one unit
		warmup = time.Second
		window = 3 * time.Second
	)
	p := startProxy(t, testConfig{
		throttle: "capacity = \"unlimited\"\nburst_ms = 100",
		tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 1000\n",
	})
	if r, err := dial(t, p.Addr).Set([]byte("small"), bytes.Repeat([]byte("s"), 100)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	depths := []int{16, 16, 16, 16, 16, 16, 16, 1}
	counts := make([]atomic.Int64, len(depths))
	var measuring atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, depth := range depths {
		c, err := mcclient.Dial(p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipelineGets(t, c, "small", depth, stop, func(time.Time) {
				if measuring.Load() {
					counts[i].Add(1)
				}
			})
		}()
	}
	start := time.AfterFunc(warmup, func() { measuring.Store(true) })
	end := time.NewTimer(warmup + window)
	<-end.C
	measuring.Store(false)
	start.Stop()
	close(stop)
	wg.Wait()

	rates := make([]float64, len(depths))
	total := 0.0
	for i := range counts {
		rates[i] = float64(counts[i].Load()) / window.Seconds()
		total += rates[i]
	}
	jain := throttle.JainIndex(rates, nil)
	lo, hi := slices.Min(rates), slices.Max(rates)
	t.Logf("per-connection GETs/s (depths %v): %.0f; total %.0f/s; min/max %.2f; Jain's index %.4f", depths, rates, total, lo/hi, jain)
	// The hard limit is a ceiling: above it is a violation. Below it, the
	// clients (in this race-instrumented process, beside CI's other
	// packages) did not keep the bucket saturated: once 918/s, the
	// one-at-a-time connection then getting the most. The rate at the
	// limit is asserted by TestHardLimitHoldsRealClock, by the throttle
	// package's fake-clock accuracy tests (within 2%), and measured by
	// BenchmarkHardLimitRate; here it only frames the shares.
	if total < limit*0.85 || total > limit*1.05 {
		t.Errorf("the bucket ran at %.0f units/s, want its hard limit %d, at most +5%% (and at least -15%%, or its connections were not saturating it)", total, limit)
	}
	// Not starved: every connection, the one-at-a-time one included,
	// gets at least a third of an equal share (a line per command would
	// give it about a fourteenth). How even the shares are beyond that
	// depends on the machine's load: quiet, min/max was 0.86-0.92 and
	// Jain's index 0.997-0.999; with two busy loops beside it, 0.40-0.73
	// and 0.92-0.99, before leases and after; under make test's other
	// packages the one-at-a-time connection once got 0.45 of an equal
	// share.
	equal := total / float64(len(rates))
	for i, r := range rates {
		if r < equal/3 {
			t.Errorf("connection %d (depth %d) got %.0f GETs/s, less than a third of an equal share (%.0f)", i, depths[i], r, equal)
		}
	}
}
