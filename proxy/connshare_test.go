package proxy

import (
	"bytes"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestConnectionsShareTheirBucket: the connections of a bucket at its hard
// limit share it equally, however deep they pipeline. Seven connections
// keep 16 GETs in flight each and one sends a GET at a time; a held
// session keeps one place in its bucket's line whatever it has queued
// behind, so the one-at-a-time connection gets its turn as often as the
// pipelines do (were the line per command, it would get about 1 in 113 of
// the bucket's units).
//
// The engine's clock is a fake one, stepped a millisecond (one unit of the
// limit) at a time, the proxy settling after each step, and the sessions
// share one event loop (on two, the loops' passes race for each unit: the
// shares are then equal within one GET, not exactly): the bucket runs
// exactly its limit, and the connections take turns in their line's order.
// Were the sessions due in one pass woken by wake-up time rather than by
// place in line (wakeDue), three of them would take every unit.
func TestConnectionsShareTheirBucket(t *testing.T) {
	const (
		limit  = 1000 // units/s; a 100-byte GET is one unit
		step   = time.Millisecond
		warm   = 200  // steps before counting (the burst is spent by then)
		window = 1000 // steps counted: one second
	)
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{
		throttle: "capacity = \"unlimited\"\nburst_ms = 100",
		tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 1000\n",
		loops:    1,
	}, clock)
	if r, err := dial(t, p.Addr).Set([]byte("small"), bytes.Repeat([]byte("s"), 100)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	b := p.Engine().Bucket("default")
	base := b.Stats().Commands

	depths := []int{16, 16, 16, 16, 16, 16, 16, 1}
	counts := make([]atomic.Int64, len(depths))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	for i, depth := range depths {
		c := dial(t, p.Addr) // patient: the fake clock's holds last as long as the test takes
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipelineGets(t, c, "small", depth, stop, func(time.Time) { counts[i].Add(1) })
		}()
	}
	// Settled: every connection held, and every GET the bucket admitted
	// answered and read by its client.
	received := func() (n int64) {
		for i := range counts {
			n += counts[i].Load()
		}
		return n
	}
	ready := func() bool { return uint64(received()) == b.Stats().Commands-base }
	ft := &fakeTime{t: t, p: p, clock: clock}
	ft.settle(len(depths), ready)
	snapshot := func() []int64 {
		s := make([]int64, len(counts))
		for i := range counts {
			s[i] = counts[i].Load()
		}
		return s
	}
	for range warm {
		ft.step(step, len(depths), ready)
	}
	before := snapshot()
	for range window {
		ft.step(step, len(depths), ready)
	}
	after := snapshot()

	got := make([]int64, len(depths))
	var total int64
	for i := range got {
		got[i] = after[i] - before[i]
		total += got[i]
	}
	t.Logf("GETs per connection over one second of the fake clock (depths %v): %v; total %d", depths, got, total)
	if total != limit {
		t.Errorf("the bucket ran %d units in one second, want exactly its hard limit %d", total, limit)
	}
	equal := total / int64(len(depths))
	for i, n := range got {
		if n != equal {
			t.Errorf("connection %d (depth %d) got %d GETs, want an equal share, %d", i, depths[i], n, equal)
		}
	}
}
