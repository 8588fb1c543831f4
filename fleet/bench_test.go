package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// countHook counts the commands a client sends.
type countHook struct{ n atomic.Int64 }

func (h *countHook) hook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

// BenchmarkFleetSync measures one instance's sync against a real
// redis-server, with three instances in the fleet and 1, 100 or 1000
// buckets: ns/op is one sync (the instance's whole report and its
// shares), store_calls/sync the Redis commands it took. However many
// buckets and commands, an instance makes one store call per grant
// period: the request path never touches the store.
func BenchmarkFleetSync(b *testing.B) {
	for _, nb := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("buckets=%d", nb), func(b *testing.B) {
			r := testmc.StartRedis(b)
			var fleets []*Fleet
			var hook *countHook
			for i := 0; i < 3; i++ {
				opts, err := redis.ParseURL(r.URL())
				if err != nil {
					b.Fatal(err)
				}
				rdb := redis.NewClient(opts)
				b.Cleanup(func() { rdb.Close() })
				h := &countHook{}
				rdb.AddHook(procHook(h.hook))
				hook = h
				units := uint64(0)
				f, err := New(Config{Store: newStore(rdb, "bench"), Instance: fmt.Sprintf("i%d", i), Period: time.Second}, Hooks{
					Usage: func(dst []Usage) (Node, []Usage) {
						units += 1000
						for k := 0; k < nb; k++ {
							dst = append(dst, Usage{Name: fmt.Sprintf("bucket-%04d", k), Reserved: 10, HardLimit: 3000, Units: units, Waiting: k % 3})
						}
						return Node{Capacity: 100_000, FreePool: throttle.Limit(100_000 - 10*nb)}, dst
					},
					State:   func([]byte, string) error { return nil },
					Seed:    func() []byte { return []byte(`{}`) },
					Granted: func(*Grants) {},
					Synced: func(_ time.Duration, err error) {
						if err != nil {
							b.Error(err)
						}
					},
				})
				if err != nil {
					b.Fatal(err)
				}
				f.sample()
				f.syncOnce()
				fleets = append(fleets, f)
			}
			f := fleets[2]
			before := hook.n.Load()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				f.sample()
				f.syncOnce()
			}
			b.StopTimer()
			b.ReportMetric(float64(hook.n.Load()-before)/float64(b.N), "store_calls/sync")
		})
	}
}
