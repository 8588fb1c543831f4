package proxy

import (
	"bytes"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// Fair sharing of the free pool through the proxy (DESIGN.md section 13):
// three buckets without reservation or hard limit saturate the free pool
// with 16, 4 and 1 connections, each connection keeping 64 five-unit GETs
// in flight, as in the issue that asked for it. The tests use a pool of
// 6000 units/s, which one connection saturates also under the race
// detector; the benchmark (BenchmarkFairFreePool) the 9000 and
// 10 s windows.

// fairBucket is one bucket of a fair-sharing scenario.
type fairBucket struct {
	name           string
	weight         int
	conns          int
	start          time.Duration // when its connections start, from the scenario's start
	reserved, hard int           // 0: none (no reservation, no hard limit)

	done     atomic.Int64 // GETs answered inside the window
	received atomic.Int64 // GETs answered in all
	base     uint64       // the bucket's commands before its connections started
	mu       sync.Mutex
	lat      []time.Duration // their latencies (send to answer)
	hits     []time.Duration // when each was answered, from the scenario's start
}

// fairTail is a layout of one bucket and one user (password name+"-pw")
// per fairBucket.
func fairTail(t testing.TB, bs []*fairBucket) string {
	var b strings.Builder
	b.WriteString("[[bucket]]\nname = \"default\"\n")
	for _, fb := range bs {
		fmt.Fprintf(&b, "[[bucket]]\nname = %q\nweight = %d\n", fb.name, max(fb.weight, 1))
		if fb.reserved > 0 {
			fmt.Fprintf(&b, "reserved = %d\n", fb.reserved)
		}
		if fb.hard > 0 {
			fmt.Fprintf(&b, "hard_limit = %d\n", fb.hard)
		}
		fmt.Fprintf(&b, "[[user]]\nname = %q\npassword_hash = %q\nbuckets = [%q]\n", fb.name, testmc.PasswordHash(t, fb.name+"-pw"), fb.name)
	}
	return b.String()
}

// fairGetUnits is what each GET of the fair-sharing tests costs: a value of
// five read units, so that the proxy serves the pool with a fifth of the
// commands.
const fairGetUnits = 5

// fairStep is how far fairLoad moves a fake clock at a time.
const fairStep = time.Millisecond

// poolSlack is how far, in units/s, the rate of a saturated pool counted
// over window may be from the pool's rate: at each end of the window the
// pool's gauge is within one command (a GET, billed when admitted) of
// empty.
func poolSlack(window time.Duration) float64 {
	return 2 * fairGetUnits / window.Seconds()
}

// shareSlack is how far, in units/s, the rate of one bucket of weight
// weight counted over window may be from its share of a pool of rate pool:
// at each end of the window its virtual time is within the lag bound of
// the system's (throttle.FairLag of the pool at weight 1, weight times as
// many of its units) and one command. The run is the same on every run
// (fairLoad); this is the engine's promise, not a margin for noise.
func shareSlack(pool float64, weight int, window time.Duration) float64 {
	lag := pool * throttle.FairLag.Seconds() * float64(max(weight, 1))
	return (lag + fairGetUnits) / window.Seconds()
}

// fairLoad runs bs against a proxy with the given capacity and free_pool
// mode (max_item_bytes fairGetUnits, so that the budget for reads of
// unknown cost does not hold the GETs back: the pool is what they wait
// for): every connection keeps depth GETs of a fairGetUnits value in
// flight, from its bucket's start until warm+window after the scenario's
// start; what is answered inside [warm, warm+window) is counted. Each
// bucket reads its value once first, so that its read estimate is the
// GETs' cost from the start.
//
// With clock nil it runs on the real clock (the benchmarks). With a fake
// clock the proxy runs one event loop and fairLoad steps the clock by
// fairStep, the proxy settling after each step (fakeTime), so that every
// figure is the same on every run, however loaded the machine; the
// buckets' latencies (lat) are then not recorded. What the proxy admits
// while the clock stands still must then not depend on when the clients'
// requests reach it: connections start one at a time, each once the one
// before is held, and a bucket's first GETs are billed its estimate, not
// max_item_bytes until the first is answered (the estimate learned from
// an answer that overtook a request would change how many are admitted).
func fairLoad(t testing.TB, capacity int, mode string, bs []*fairBucket, depth int, warm, window time.Duration, clock *throttle.FakeClock) *testProxy {
	t.Helper()
	tc := testConfig{
		throttle: fmt.Sprintf("capacity = %d\nburst_ms = 20\nmax_item_bytes = %d\nfree_pool = %q", capacity, fairGetUnits*4096, mode),
		tail:     fairTail(t, bs),
	}
	elapsed := func() time.Duration { return 0 }
	if clock != nil {
		tc.clock, tc.loops = clock, 1
	}
	p := startProxy(t, tc)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	starts := make([][]chan struct{}, len(bs))
	for i, fb := range bs {
		c := login(t, p.Addr, fb.name)
		if r, err := c.Set([]byte("k"), bytes.Repeat([]byte("v"), fairGetUnits*4096-1)); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatal(err, r)
		}
		if r, err := c.Get([]byte("k")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatal(err, r)
		}
		fb.base = p.Engine().Bucket(fb.name).Stats().Commands
		for range fb.conns {
			c := login(t, p.Addr, fb.name)
			start := make(chan struct{})
			starts[i] = append(starts[i], start)
			wg.Add(1)
			go func() {
				defer wg.Done()
				select {
				case <-start:
				case <-stop:
					return
				}
				timedGets(t, c, "k", depth, stop, func(sent, got time.Time) {
					fb.received.Add(1)
					at := elapsed()
					if at < warm || at >= warm+window {
						return
					}
					fb.done.Add(1)
					fb.mu.Lock()
					if clock == nil {
						fb.lat = append(fb.lat, got.Sub(sent))
					}
					fb.hits = append(fb.hits, at)
					fb.mu.Unlock()
				})
			}()
		}
	}
	if clock == nil {
		begin := time.Now()
		elapsed = func() time.Duration { return time.Since(begin) }
		for i, fb := range bs {
			time.AfterFunc(fb.start, func() {
				for _, c := range starts[i] {
					close(c)
				}
			})
		}
		time.Sleep(warm + window)
	} else {
		fairSteps(t, p, clock, bs, starts, &elapsed, warm+window)
	}
	close(stop)
	wg.Wait()
	return p
}

// fairSteps drives fairLoad's fake clock from the scenario's start to
// end, starting each bucket's connections at its start, one at a time.
func fairSteps(t testing.TB, p *testProxy, clock *throttle.FakeClock, bs []*fairBucket, starts [][]chan struct{}, elapsed *func() time.Duration, end time.Duration) {
	t.Helper()
	origin := clock.Now()
	*elapsed = func() time.Duration { return clock.Now() - origin }
	ft := &fakeTime{t: t, p: p, clock: clock}
	// Settled: every started connection held, and every GET admitted
	// answered and read by its client.
	ready := func() bool {
		for _, fb := range bs {
			if fb.received.Load() != int64(p.Engine().Bucket(fb.name).Stats().Commands-fb.base) {
				return false
			}
		}
		return true
	}
	held := 0
	for at := time.Duration(0); at < end; at += fairStep {
		for i, fb := range bs {
			if fb.start != at {
				continue
			}
			for _, c := range starts[i] {
				close(c)
				held++
				ft.settle(held, ready)
			}
		}
		ft.settle(held, ready)
		ft.step(fairStep, held, ready)
	}
}

// heldP99 returns the 99th percentile of how long bucket's held commands
// were held (kvthrottle_throttle_wait_seconds, over the whole run), as the
// upper bound of the histogram bucket it falls in; 0 if none was held.
func heldP99(t testing.TB, p *testProxy, bucket string) time.Duration {
	t.Helper()
	h := waitHistogram(t, p, bucket)
	n := h.GetSampleCount()
	for _, b := range h.GetBucket() {
		if n > 0 && float64(b.GetCumulativeCount()) >= 0.99*float64(n) {
			return time.Duration(b.GetUpperBound() * float64(time.Second))
		}
	}
	if n > 0 {
		return time.Duration(math.MaxInt64)
	}
	return 0
}

func fairRates(bs []*fairBucket, window time.Duration) []float64 {
	r := make([]float64, len(bs))
	for i, fb := range bs {
		r[i] = float64(fb.done.Load()*fairGetUnits) / window.Seconds()
	}
	return r
}

// fairReport logs each bucket's rate, p99 latency (send to answer, the
// client's own queue included) and p99 hold (the proxy's
// kvthrottle_throttle_wait_seconds, to its histogram's resolution).
func fairReport(t testing.TB, p *testProxy, mode string, bs []*fairBucket, window time.Duration) []float64 {
	rates := fairRates(bs, window)
	weights := make([]int, len(bs))
	line := mode + ":"
	for i, fb := range bs {
		weights[i] = max(fb.weight, 1)
		line += fmt.Sprintf("  %s (weight %d, %d conns) %.0f units/s, p99 latency %v, p99 held <= %v;", fb.name, weights[i], fb.conns,
			rates[i], p99(fb.lat).Round(10*time.Microsecond), heldP99(t, p, fb.name))
	}
	total := 0.0
	for _, r := range rates {
		total += r
	}
	t.Logf("%s  total %.0f, Jain's index %.4f", line, total, throttle.JainIndex(rates, weights))
	return rates
}

// TestFairFreePool: equal weights give each bucket a third of the pool
// whatever its connections (Jain's index >= 0.99), weights 1:2:3 give
// 1/6, 2/6 and 3/6, within 5%, and the pool is used in full; first come,
// first served is shown beside it, with each bucket's p99 latency (the
// wait of its held commands) in both modes.
func TestFairFreePool(t *testing.T) {
	t.Parallel()
	const (
		pool  = 6000.0
		depth = 64
	)
	// Without -race only (PROXY_NORACE_TESTS): TestFairNewcomer runs the
	// fair pool's paths under it.
	testmc.SkipUnderRace(t)
	const warm, window = time.Second, 3 * time.Second
	scenario := func(w1, w2, w3 int) []*fairBucket {
		return []*fairBucket{
			{name: "many", weight: w1, conns: 16},
			{name: "some", weight: w2, conns: 4},
			{name: "one", weight: w3, conns: 1},
		}
	}
	// Each bucket gets its share of the pool to within the lag bound
	// (shareSlack), and the pool runs at its rate (poolSlack).
	slack := poolSlack(window)
	check := func(t *testing.T, bs []*fairBucket, rates []float64, want []float64) {
		t.Helper()
		total := 0.0
		for i, r := range rates {
			total += r
			if d := shareSlack(pool, bs[i].weight, window); math.Abs(r-want[i]) > d {
				t.Errorf("%s: %.0f units/s, want %.0f (%.1f%%) +-%.1f", bs[i].name, r, want[i], 100*want[i]/pool, d)
			}
		}
		if math.Abs(total-pool) > slack {
			t.Errorf("pool used %.0f units/s of %.0f", total, pool)
		}
	}
	t.Run("fcfs", func(t *testing.T) {
		bs := scenario(1, 1, 1)
		p := fairLoad(t, pool, "fcfs", bs, depth, warm, window, throttle.NewFakeClock(time.Hour))
		rates := fairReport(t, p, "fcfs", bs, window)
		if total := rates[0] + rates[1] + rates[2]; math.Abs(total-pool) > slack {
			t.Errorf("fcfs: the node ran at %.0f units/s, want its capacity %.0f", total, pool)
		}
	})
	t.Run("fair equal weights", func(t *testing.T) {
		bs := scenario(1, 1, 1)
		p := fairLoad(t, pool, "fair", bs, depth, warm, window, throttle.NewFakeClock(time.Hour))
		rates := fairReport(t, p, "fair", bs, window)
		check(t, bs, rates, []float64{pool / 3, pool / 3, pool / 3})
		if j := throttle.JainIndex(rates, nil); j < 0.9999 {
			t.Errorf("Jain's index %.4f, want >= 0.9999", j)
		}
	})
	t.Run("fair weights 1:2:3", func(t *testing.T) {
		bs := scenario(1, 2, 3)
		p := fairLoad(t, pool, "fair", bs, depth, warm, window, throttle.NewFakeClock(time.Hour))
		check(t, bs, fairReport(t, p, "fair", bs, window), []float64{pool / 6, pool * 2 / 6, pool * 3 / 6})
	})
}

// TestFairNewcomer: a bucket that becomes busy while two others saturate
// the pool gets its share (a third) within 100 ms, and banks nothing from
// having been idle.
//
// Under -race the newcomer starts at 300 ms and is measured for 400 ms
// (its 100 ms windows from 400 ms), a third of the fake steps: the race
// detector watches the fair pool's paths on every step, and four windows
// show the share as nine do. make test runs the full scenario without
// -race (PROXY_NORACE_TESTS).
func TestFairNewcomer(t *testing.T) {
	t.Parallel()
	late := testmc.UnderRace(1500*time.Millisecond, 300*time.Millisecond)
	warm := testmc.UnderRace(time.Second, 200*time.Millisecond)
	window := testmc.UnderRace(2*time.Second, 600*time.Millisecond)
	bs := []*fairBucket{
		{name: "many", weight: 1, conns: 16},
		{name: "some", weight: 1, conns: 4},
		{name: "late", weight: 1, conns: 1, start: late},
	}
	p := fairLoad(t, 6000, "fair", bs, 64, warm, window, throttle.NewFakeClock(time.Hour))
	fairReport(t, p, "fair", bs, window)
	// From 100 ms after it started: a third of the pool in each 100 ms,
	// and in all, to within the lag bound and one GET (shareSlack).
	newcomer := bs[2]
	slack := int(shareSlack(6000, 1, time.Second))
	total, windows, got := 0, 0, []int{}
	for from := late + 100*time.Millisecond; from+100*time.Millisecond <= warm+window; from += 100 * time.Millisecond {
		n := 0
		for _, at := range newcomer.hits {
			if at >= from && at < from+100*time.Millisecond {
				n += fairGetUnits
			}
		}
		total += n
		windows++
		got = append(got, n)
		if n < 200-slack || n > 200+slack {
			t.Errorf("%v after it started, the new bucket got %d units in 100 ms, want a third of 600 +-%d", from-late, n, slack)
		}
	}
	t.Logf("the new bucket's units in each 100 ms from 100 ms after it started: %v", got)
	if avg := float64(total) / float64(windows); math.Abs(float64(total-200*windows)) > float64(slack) {
		t.Errorf("from 100 ms after it started, the new bucket got %.0f units per 100 ms, want a third of 600", avg)
	}
}

// TestFairSeedExamples: the seed's examples 2 and 3 hold in fair mode
// through the proxy: reservations are honoured, hard limits hold, the node
// runs at its capacity, and the free pool (what the reservations leave) is
// split evenly among the buckets that want more of it.
func TestFairSeedExamples(t *testing.T) {
	t.Parallel()
	testmc.SkipUnderRace(t) // as TestFairFreePool
	const warm, window = time.Second, 3 * time.Second
	run := func(t *testing.T, bs []*fairBucket, want []float64) {
		p := fairLoad(t, 10000, "fair", bs, 64, warm, window, throttle.NewFakeClock(time.Hour))
		rates := fairReport(t, p, "fair", bs, window)
		// Each bucket gets its reservation and its part of the pool, as
		// want says, to within the lag bound and one GET (shareSlack);
		// the node runs at what the busy buckets may use, each gauge
		// (the pool, each reservation) to within one GET at each end of
		// the window (poolSlack).
		var total, reserved, wantPool, allReserved float64
		gauges := 1
		for i, fb := range bs {
			total += rates[i]
			allReserved += float64(fb.reserved)
			if fb.conns > 0 {
				reserved += float64(fb.reserved)
				wantPool += want[i] - float64(fb.reserved)
				if fb.reserved > 0 {
					gauges++
				}
			}
		}
		if need, slack := reserved+wantPool, float64(gauges)*poolSlack(window); math.Abs(total-need) > slack {
			t.Errorf("the node ran %.0f units/s, want %.0f +-%.1f", total, need, slack)
		}
		slack := shareSlack(10000-allReserved, 1, window)
		for i, fb := range bs {
			expect := 0.0
			if fb.conns > 0 {
				expect = want[i]
			}
			if math.Abs(rates[i]-expect) > slack {
				t.Errorf("%s: %.0f units/s, want %.0f +-%.1f (%.0f ran)", fb.name, rates[i], expect, slack, total)
			}
			if fb.conns > 0 && rates[i] < float64(fb.reserved) {
				t.Errorf("%s: %.0f units/s, below its reservation %d", fb.name, rates[i], fb.reserved)
			}
			if fb.hard > 0 && rates[i] > float64(fb.hard) {
				t.Errorf("%s: %.0f units/s, above its hard limit %d", fb.name, rates[i], fb.hard)
			}
		}
	}
	t.Run("example 2, both saturating", func(t *testing.T) {
		// Capacity 10000; A and B reserve 2000 each, hard limit 8000: the
		// pool of 6000 goes half each, however many connections each has.
		run(t, []*fairBucket{
			{name: "A", reserved: 2000, hard: 8000, conns: 4},
			{name: "B", reserved: 2000, hard: 8000, conns: 8},
		}, []float64{5000, 5000})
	})
	t.Run("example 3, A and B idle", func(t *testing.T) {
		// C gets the free pool (5000) and no more: idle reservations are
		// not lent out.
		run(t, []*fairBucket{
			{name: "A", reserved: 3000, hard: 6000},
			{name: "B", reserved: 2000, hard: 5000},
			{name: "C", conns: 4},
		}, []float64{0, 0, 5000})
	})
	t.Run("example 3, all saturating", func(t *testing.T) {
		// The pool of 5000 split three ways on top of the reservations.
		run(t, []*fairBucket{
			{name: "A", reserved: 3000, hard: 6000, conns: 8},
			{name: "B", reserved: 2000, hard: 5000, conns: 8},
			{name: "C", conns: 2},
		}, []float64{3000 + 5000.0/3, 2000 + 5000.0/3, 5000.0 / 3})
	})
}

// BenchmarkFairFreePool measures the scenarios through the proxy
// with the windows: a free pool of 9000 units/s, three buckets
// saturating it with 16, 4 and 1 connections (16 GETs in flight each), one
// second of warm-up, 10 s measured; first come, first served and fair with
// equal weights, and fair with weights 1:2:3. It reports each bucket's
// units/s (A has 16 connections, B 4, C 1), the pool used, Jain's index of
// the rates divided by the weights, and each bucket's p99 latency (send
// to answer, the hold included). The b.N loop is not used: one run takes
// 11 s; run it with -benchtime 1x.
func BenchmarkFairFreePool(b *testing.B) {
	for _, c := range []struct {
		name, mode string
		weights    [3]int
	}{
		{"fcfs", "fcfs", [3]int{1, 1, 1}},
		{"fair", "fair", [3]int{1, 1, 1}},
		{"fair-weights-1:2:3", "fair", [3]int{1, 2, 3}},
	} {
		b.Run(c.name, func(b *testing.B) {
			bs := []*fairBucket{
				{name: "A", weight: c.weights[0], conns: 16},
				{name: "B", weight: c.weights[1], conns: 4},
				{name: "C", weight: c.weights[2], conns: 1},
			}
			const window = 10 * time.Second
			p := fairLoad(b, 9000, c.mode, bs, 16, time.Second, window, nil)
			rates := fairReport(b, p, c.mode, bs, window)
			total := 0.0
			for i, fb := range bs {
				total += rates[i]
				b.ReportMetric(rates[i], fb.name+"_units/s")
				b.ReportMetric(float64(p99(fb.lat))/1e6, fb.name+"_p99_ms")
				b.ReportMetric(float64(heldP99(b, p, fb.name))/1e6, fb.name+"_held_p99_ms")
			}
			b.ReportMetric(100*total/9000, "pool_used_%")
			b.ReportMetric(throttle.JainIndex(rates, c.weights[:]), "jain")
		})
	}
}
