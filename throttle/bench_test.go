package throttle

import (
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	xrate "golang.org/x/time/rate"
)

// runGoroutines runs body on g goroutines sharing b.N iterations, so ns/op
// is wall time per operation (as with b.RunParallel), with exactly g
// goroutines whatever GOMAXPROCS is.
func runGoroutines(b *testing.B, g int, body func(id, n int)) {
	b.ReportAllocs()
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := 0; i < g; i++ {
		n := b.N / g
		if i < b.N%g {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			body(i, n)
		}()
	}
	wg.Wait()
}

// BenchmarkAdmitCharge measures one admission plus its charge, with
// throttling on and limits not reached, on the real clock, beside
// x/time/rate's Limiter.AllowN on one shared limiter (which also reads the
// clock, and takes its mutex). "engine" shares one bucket among the
// goroutines (every gauge shared, as AllowN's limiter) with 1-unit commands
// (values up to 4 KiB); "engine-3-units" charges 3 units per command;
// "engine-bucket-each" gives each goroutine its own bucket (only the free
// pool shared); the "-fair" ones are the same with free_pool = "fair"; "engine-read" bills reads at their estimate and settles
// them (AdmitCost and Settle, as the proxy does for a GET); the
// "engine-lease" ones give each goroutine its own Lease of one shared
// bucket (the proxy's per-event-loop leases), with 1-unit commands, reads
// ("-read") and free_pool = "fair" ("-fair"). goroutines=8 (engine, the
// leases, AllowN) shows how each scales beyond the machine's cores.
func BenchmarkAdmitCharge(b *testing.B) {
	const huge = Limit(1) << 40
	engine := func(buckets int, units int64, mode FreePoolMode) func(b *testing.B, g int) {
		return func(b *testing.B, g int) {
			e, _ := New(Config{Capacity: huge, FreePool: mode})
			var bs []*Bucket
			for i := 0; i < buckets; i++ {
				bk, _ := e.AddBucket(fmt.Sprint(i), 1000, huge)
				bs = append(bs, bk)
			}
			runGoroutines(b, g, func(id, n int) {
				bk := bs[id%buckets]
				var w Waiter
				for i := 0; i < n; i++ {
					d, _ := bk.Admit(&w, Blocking)
					bk.Charge(d, units)
				}
			})
		}
	}
	// lease: each goroutine admits through its own Lease of one shared
	// bucket (as the proxy's event loops do), read: GETs billed at their
	// estimate and settled.
	lease := func(read bool, mode FreePoolMode) func(b *testing.B, g int) {
		return func(b *testing.B, g int) {
			e, _ := New(Config{Capacity: huge, FreePool: mode})
			bk, _ := e.AddBucket("l", 1000, huge)
			runGoroutines(b, g, func(_, n int) {
				l := bk.NewLease()
				defer l.Return()
				var w Waiter
				c := Cost{Known: 1}
				if read {
					c = Cost{Read: true}
				}
				for i := 0; i < n; i++ {
					gr, _ := l.AdmitCost(&w, Blocking, c)
					l.Settle(gr, 1)
				}
			})
		}
	}
	for _, g := range []int{1, 2, 8} {
		for _, c := range []struct {
			name string
			run  func(b *testing.B, g int)
		}{
			{"engine", engine(1, 1, FreePoolFCFS)},
			{"engine-3-units", engine(1, 3, FreePoolFCFS)},
			{"engine-bucket-each", engine(2, 1, FreePoolFCFS)},
			{"engine-fair", engine(1, 1, FreePoolFair)},
			{"engine-fair-bucket-each", engine(2, 1, FreePoolFair)},
			{"engine-read", func(b *testing.B, g int) {
				// A read billed at its estimate and settled at its real
				// size: what the proxy does for every GET.
				e, _ := New(Config{Capacity: huge})
				bk, _ := e.AddBucket("r", 1000, huge)
				runGoroutines(b, g, func(_, n int) {
					var w Waiter
					for i := 0; i < n; i++ {
						gr, _ := bk.AdmitCost(&w, Blocking, Cost{Read: true})
						bk.Settle(gr, 1)
					}
				})
			}},
			{"engine-lease", lease(false, FreePoolFCFS)},
			{"engine-lease-read", lease(true, FreePoolFCFS)},
			{"engine-lease-fair", lease(false, FreePoolFair)},
			{"x-time-rate-AllowN", func(b *testing.B, g int) {
				lim := xrate.NewLimiter(xrate.Limit(1e12), 1<<30)
				runGoroutines(b, g, func(_, n int) {
					for i := 0; i < n; i++ {
						lim.AllowN(time.Now(), 1)
					}
				})
			}},
		} {
			if g > 2 && c.name != "engine" && c.name != "x-time-rate-AllowN" && !strings.HasPrefix(c.name, "engine-lease") {
				continue
			}
			b.Run(fmt.Sprintf("%s/goroutines=%d", c.name, g), func(b *testing.B) { c.run(b, g) })
		}
	}
}

// BenchmarkAccuracy simulates 11 s of FAKE time with saturating demand (one
// second of warm-up, ten measured) and reports how far the measured rates
// are from the contract's: a bucket at its hard limit (rate_err_%), the
// node with every bucket saturating (over_capacity_%), and example 2 with
// both buckets saturating (worst reservation shortfall, res_short_%).
func BenchmarkAccuracy(b *testing.B) {
	b.Run("hard-limit", func(b *testing.B) {
		var got float64
		for i := 0; i < b.N; i++ {
			got = simulate(b, defaultSim(10000), []*simBucket{
				{name: "A", hard: 3000, conns: 8, maxUnits: 4},
				{name: "B", hard: Unlimited, conns: 2},
			})["A"]
		}
		b.ReportMetric(100*math.Abs(got-3000)/3000, "rate_err_%")
	})
	b.Run("node-capacity", func(b *testing.B) {
		var got map[string]float64
		for i := 0; i < b.N; i++ {
			got = simulate(b, defaultSim(10000), []*simBucket{
				{name: "A", hard: Unlimited, conns: 4, maxUnits: 4},
				{name: "B", reserved: 1000, hard: 6000, conns: 4, maxUnits: 2},
				{name: "C", hard: Unlimited, conns: 4, mode: NonBlocking},
			})
		}
		b.ReportMetric(100*(got["A"]+got["B"]+got["C"]-10000)/10000, "over_capacity_%")
	})
	b.Run("example2", func(b *testing.B) {
		var got map[string]float64
		for i := 0; i < b.N; i++ {
			got = simulate(b, defaultSim(10000), []*simBucket{
				{name: "A", reserved: 2000, hard: 8000, conns: 8, maxUnits: 3},
				{name: "B", reserved: 2000, hard: 8000, conns: 8, maxUnits: 3},
			})
		}
		short := max(0, 2000-min(got["A"], got["B"])) / 2000
		b.ReportMetric(100*short, "res_short_%")
		b.ReportMetric(100*(got["A"]+got["B"]-10000)/10000, "total_err_%")
	})
}

// BenchmarkFairRecompute measures one recomputation of the system's virtual
// time in fair mode (a pass over the buckets, at most one per 2 ms), for a
// node with 10, 1000 and 10000 buckets, half of them wanting more of the
// pool.
func BenchmarkFairRecompute(b *testing.B) {
	for _, n := range []int{10, 1000, 10000} {
		b.Run(fmt.Sprint("buckets=", n), func(b *testing.B) {
			clk := NewFakeClock(0)
			e, _ := New(Config{Capacity: 1 << 30, FreePool: FreePoolFair, Clock: clk})
			for i := 0; i < n; i++ {
				bk, _ := e.AddBucket(fmt.Sprint(i), 0, Unlimited)
				bk.fairBill(int64(i), false, e.node.Load())
				if i%2 == 0 {
					bk.fairWant(int64(time.Hour))
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				clk.Advance(time.Duration(fairPeriod))
				e.fairTick(int64(clk.Now()))
			}
		})
	}
}
