package proxy

// Fleet mode on a store that fails over, with real processes and on the
// real clock: BenchmarkFleetFailover's figures. The tests, whose figures
// are asserted exactly, run on fake clocks (fleet_failover_fake_test.go).

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// storeWatch records, per instance, when its fleet last saw the store go
// down and come back (Grants.StoreUp), polling every 5 ms until stopped.
type storeWatch struct {
	mu         sync.Mutex
	down, up   []time.Time // the last transitions seen
	stop, done chan struct{}
}

func watchStore(f *fleetTest) *storeWatch {
	w := &storeWatch{down: make([]time.Time, len(f.insts)), up: make([]time.Time, len(f.insts)),
		stop: make(chan struct{}), done: make(chan struct{})}
	last := make([]bool, len(f.insts))
	for i := range last {
		last[i] = true
	}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			now := time.Now()
			w.mu.Lock()
			for i, p := range f.insts {
				up := p.fleet.fl.Grants().StoreUp()
				if up != last[i] {
					if up {
						w.up[i] = now
					} else {
						w.down[i] = now
					}
					last[i] = up
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// waitUp waits (up to timeout) until every instance has seen the store come
// back after it went down, and returns when each did.
func (w *storeWatch) waitUp(timeout time.Duration) (down, up []time.Time, ok bool) {
	deadline := time.Now().Add(timeout)
	for {
		w.mu.Lock()
		down, up = append([]time.Time(nil), w.down...), append([]time.Time(nil), w.up...)
		w.mu.Unlock()
		ok = true
		for i := range up {
			ok = ok && !down[i].IsZero() && up[i].After(down[i])
		}
		if ok || time.Now().After(deadline) {
			return down, up, ok
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (w *storeWatch) close() {
	close(w.stop)
	<-w.done
}

// failoverRun is one failover under load: two instances sharing a bucket
// with hard_limit 3000, 6 and 3 saturating connections, the store's
// primary killed (kill) after 8 s, then healthy (the time the store was
// reported healthy again). It asserts the recovery: no client error, each
// instance's store up again, an admin change made right after applied on
// both instances. It logs the timeline and the per-second rates, and
// returns how long after healthy the last instance had the store up again
// and how long the change took to be in force on both.
//
// The targets (store up within 2 grant periods of healthy, the change in
// force within 3) are real-clock figures here, reported by
// BenchmarkFleetFailover, which fails at ten times them (a breakage, such
// as the minute a stale slot map used to cost, not a slow machine);
// TestFleetClusterFailover and TestFleetSentinelFailover assert them
// exactly on fake clocks.
func failoverRun(t testing.TB, url string, kill func(), healthy func() time.Time) (back, applied time.Duration) {
	const period = time.Second
	f := &fleetTest{t: t, mc: testmc.Start(t), url: url, period: period.String(),
		tail: "[[bucket]]\nname = \"b\"\nhard_limit = 3000\n" + fleetUsers(t)}
	l := newLoad()
	defer l.close()
	for i, n := range []int{6, 3} {
		p := f.start(i, `default_bucket = "b"`)
		l.add(t, i, p.Addr, n)
	}
	before := f.window("b", 8)
	w := watchStore(f)
	defer w.close()
	var after [][]float64
	measured := make(chan struct{})
	go func() {
		defer close(measured)
		after = f.window("b", 14)
	}()
	killed := time.Now()
	kill()
	ok := healthy()
	down, up, allUp := w.waitUp(time.Until(ok) + 20*2*period)
	since := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return at.Sub(killed).Round(time.Millisecond).String()
	}
	line := []string{"killed at 0, store healthy at " + since(ok)}
	for i := range up {
		line = append(line, fmt.Sprintf("instance %d: store down at %s, up at %s", i, since(down[i]), since(up[i])))
		back = max(back, up[i].Sub(ok))
		if !allUp || up[i].Sub(ok) > 10*2*period {
			t.Errorf("instance %d: store up again at %s (healthy at %s), want within ten times the target of 2 periods (%v)", i, since(up[i]), since(ok), 2*period)
		}
	}
	t.Logf("failover timeline: %s", strings.Join(line, "; "))

	changed := time.Now()
	fleetAdmin(t, f.insts[1], mc.OpSetBucketThrottleProperties, "b", `{"reserved": 0, "hard_limit": 2400}`)
	for i, p := range f.insts {
		for statHardLimit(t, p, "b") != "2400" {
			if time.Since(changed) > 10*3*period {
				t.Fatalf("instance %d does not enforce the admin change made after the failover %v later (target: 3 periods)", i, time.Since(changed).Round(time.Millisecond))
			}
			time.Sleep(10 * time.Millisecond)
		}
		t.Logf("instance %d enforces the admin change %v after it was made", i, time.Since(changed).Round(time.Millisecond))
	}
	applied = time.Since(changed)
	<-measured
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d client errors", n)
	}
	t.Logf("units/s before the kill: %s; from the kill on (the limit 2400 from about second %d): %s",
		perSecond(before), int(time.Since(changed).Seconds()), perSecond(after))
	return back, applied
}

// BenchmarkFleetFailover reports failoverRun's real-clock figures for a
// Redis Cluster and a Sentinel failover, in grant periods (1 s): the store
// up again on every instance after it was reported healthy (target: 2),
// and an admin change made then in force on both (target: 3). The b.N loop
// is not used: run it with -benchtime 1x.
func BenchmarkFleetFailover(b *testing.B) {
	report := func(b *testing.B, back, applied time.Duration) {
		b.ReportMetric(back.Seconds(), "back_periods")
		b.ReportMetric(applied.Seconds(), "applied_periods")
		if back > 2*time.Second || applied > 3*time.Second {
			b.Logf("a target missed: store up %v after healthy (2 periods), change in force after %v (3 periods)", back, applied)
		}
	}
	b.Run("cluster", func(b *testing.B) {
		back, applied := clusterFailover(b)
		report(b, back, applied)
	})
	b.Run("sentinel", func(b *testing.B) {
		back, applied := sentinelFailover(b)
		report(b, back, applied)
	})
}

func perSecond(secs [][]float64) string {
	var out []string
	for _, s := range secs {
		out = append(out, fmt.Sprintf("%.0f", sum(s)))
	}
	return strings.Join(out, " ")
}

// clusterFailover is failoverRun on a Redis Cluster of 3 primaries and 3
// replicas (cluster-node-timeout 1 s), the primary holding the fleet's
// hash tag killed; healthy once every surviving node reports
// cluster_state:ok and names a live primary for the tag.
func clusterFailover(t testing.TB) (back, applied time.Duration) {
	c := testmc.StartRedisCluster(t, 3, 1, time.Second)
	primary := c.Primary(fleetTag)
	if primary == nil {
		t.Fatalf("no primary serves %s", fleetTag)
	}
	return failoverRun(t, c.URL(), primary.Kill, func() time.Time {
		at, err := c.WaitHealthy(fleetTag, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return at
	})
}

// sentinelFailover is failoverRun on a primary and its replica monitored
// by three sentinels (quorum 2, down-after-milliseconds 1000), reached
// through them; healthy once the sentinels name the promoted replica and
// it reports role:master.
func sentinelFailover(t testing.TB) (back, applied time.Duration) {
	s := testmc.StartRedisSentinel(t, time.Second)
	primary := s.Primary()
	if primary == nil {
		t.Fatal("the sentinels name no primary")
	}
	return failoverRun(t, s.URL(), primary.Kill, func() time.Time {
		at, err := s.WaitHealthy(30 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return at
	})
}

// TestFleetTmpfailNotAppliedLater: an admin change made while the store is
// down (killed) is answered Etmpfail "fleet store unavailable; change not
// applied", and it is in force nowhere after the store comes back (empty:
// seeded again from the instances' state), two periods on; a change made
// then is. Fake clocks.
func TestFleetTmpfailNotAppliedLater(t *testing.T) {
	f := newFakeFleetTest(t, "[[bucket]]\nname = \"b\"\nhard_limit = 3000\n"+fleetUsers(t), "500ms")
	for i := range 2 {
		f.start(i, `default_bucket = "b"`)
	}
	f.pass(time.Second)
	f.redis.Kill()
	f.pass(time.Second)
	c := login(t, f.insts[1].Addr, "admin")
	defer c.Close()
	r := adminDo(t, c, mc.OpSetBucketThrottleProperties, "b", `{"reserved": 0, "hard_limit": 600}`)
	if r.Header.Status() != mc.StatusEtmpfail || string(r.Value) != "fleet store unavailable; change not applied" {
		t.Fatalf("change with the store down: %v %q, want Etmpfail", r.Header.Status(), r.Value)
	}
	f.redis.Restart(t)
	f.pass(time.Second) // 2 periods
	for i, p := range f.insts {
		if got := statHardLimit(t, p, "b"); got != "3000" {
			t.Errorf("instance %d: hard_limit %s after the store came back, want 3000 (the refused change is in force)", i, got)
		}
	}
	fleetAdmin(t, f.insts[1], mc.OpSetBucketThrottleProperties, "b", `{"reserved": 0, "hard_limit": 900}`)
	f.pass(500 * time.Millisecond)
	for i, p := range f.insts {
		if got := statHardLimit(t, p, "b"); got != "900" {
			t.Errorf("instance %d: hard_limit %s a period after a change made with the store back, want 900", i, got)
		}
	}
}
