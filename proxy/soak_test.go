package proxy

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// TestSoak runs mixed load (plain, pipelined quiet, throttled and
// non-blocking clients, reconnecting clients, admin changes, pipelined
// large GETs, a wrong-password loop) and checks
// that goroutines and heap stay flat. It runs 4 s in make test; set
// KVTHROTTLE_SOAK to a duration (e.g. 30m) for the long version.
func TestSoak(t *testing.T) {
	d := 4 * time.Second
	if v := os.Getenv("KVTHROTTLE_SOAK"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			t.Fatalf("KVTHROTTLE_SOAK: %v", err)
		}
	}
	p := startProxy(t, testConfig{throttle: "capacity = 40000", tail: tenantTail(t), loops: 2})
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "bob", `{"reserved":100,"hard_limit":1500}`); r.Status() != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	var stop atomic.Bool
	var ops, errs atomic.Int64
	var wg sync.WaitGroup
	worker := func(name string, fn func(i int) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				if err := fn(i); err != nil {
					errs.Add(1)
					t.Errorf("%s: %v", name, err)
					return
				}
				ops.Add(1)
			}
		}()
	}
	for w := 0; w < 4; w++ {
		w := w
		c := login(t, p.Addr, "alice")
		worker(fmt.Sprintf("mixed-%d", w), func(i int) error {
			key := []byte(fmt.Sprintf("s%d-%d", w, i%100))
			val := make([]byte, 100+(i%50)*100)
			if r, err := c.Set(key, val); err != nil || r.Status() != mc.StatusSuccess {
				return fmt.Errorf("set: %v %v", err, r)
			}
			if r, err := c.Get(key); err != nil || len(r.Value) != len(val) {
				return fmt.Errorf("get: %v %v", err, r)
			}
			return nil
		})
	}
	qc := login(t, p.Addr, "alice")
	worker("quiet-batch", func(i int) error {
		for j := 0; j < 50; j++ {
			qc.Send(mcclient.Request{Opcode: mc.OpGetKQ, Key: []byte(fmt.Sprintf("s0-%d", j))})
		}
		op := qc.Send(mcclient.Request{Opcode: mc.OpNoop})
		if err := qc.Flush(); err != nil {
			return err
		}
		for {
			r, err := qc.Read()
			if err != nil {
				return err
			}
			if r.Opcode == mc.OpNoop {
				if r.Opaque != op {
					return fmt.Errorf("NOOP opaque %d, want %d", r.Opaque, op)
				}
				return nil
			}
		}
	})
	for w := 0; w < 3; w++ {
		c := login(t, p.Addr, "bob")
		worker("throttled", func(i int) error {
			if r, err := c.Set([]byte("b"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
				return fmt.Errorf("set: %v %v", err, r)
			}
			return nil
		})
	}
	nb := login(t, p.Addr, "bob")
	hello(t, nb, mc.FeatureNonBlockingThrottlingMode)
	worker("non-blocking", func(i int) error {
		r, err := nb.Set([]byte("nb"), []byte("v"))
		if err != nil || (r.Status() != mc.StatusSuccess && r.Status() != mc.StatusEWouldThrottle) {
			return fmt.Errorf("set: %v %v", err, r)
		}
		if r.Status() == mc.StatusEWouldThrottle {
			time.Sleep(time.Millisecond)
		}
		return nil
	})
	worker("reconnect", func(i int) error {
		c, err := mcclient.Dial(p.Addr)
		if err != nil {
			return err
		}
		defer c.Close()
		c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte("rc"), Value: []byte("v")})
		c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("rc")})
		return c.Flush() // closed with both in flight
	})
	// Attacks that once broke isolation (issue 11) run beside the others:
	// a pipeline of large GETs (billed at their estimated size), and a
	// wrong-password loop (paced, then closed).
	seed := login(t, p.Addr, "admin")
	if r, err := seed.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("default")}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("select default: %v %v", err, r)
	}
	if r, err := seed.Set([]byte("large"), make([]byte, 200<<10)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set large: %v %v", err, r)
	}
	large := dial(t, p.Addr) // the default bucket
	large.Timeout = 30 * time.Second
	largeStop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		pipelineGets(t, large, "large", 20, largeStop, func(time.Time) { ops.Add(1) })
	}()
	worker("wrong-password", func(i int) error {
		c, err := mcclient.Dial(p.Addr)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.AuthPlain("alice", "not-her-password"); err == nil {
			return fmt.Errorf("a wrong password was accepted")
		}
		return nil
	})
	worker("admin", func(i int) error {
		time.Sleep(100 * time.Millisecond)
		body := fmt.Sprintf(`{"reserved":100,"hard_limit":%d}`, 1000+(i%5)*200)
		if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "bob", body); r.Status() != mc.StatusSuccess {
			return fmt.Errorf("admin: %s", r.Status())
		}
		return nil
	})

	sample := func() (int, uint64) {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return runtime.NumGoroutine(), ms.HeapInuse
	}
	time.Sleep(d / 4)
	g0, h0 := sample()
	time.Sleep(d * 3 / 4)
	g1, h1 := sample()
	stop.Store(true)
	close(largeStop)
	wg.Wait()
	t.Logf("soak %v: %d ops, goroutines %d -> %d, heap in use %.1f -> %.1f MB", d, ops.Load(), g0, g1, float64(h0)/1e6, float64(h1)/1e6)
	if g1 > g0+5 {
		t.Errorf("goroutines grew from %d to %d", g0, g1)
	}
	if h1 > h0*2+8<<20 {
		t.Errorf("heap grew from %d to %d bytes", h0, h1)
	}
	eventually(t, time.Minute, "in-flight commands to drain", func() bool { return p.inflight() == 0 })
}
