package proxy

// Fleet mode on a store that fails over, with real processes: the store's
// primary is killed under load and a replica takes over. On the real clock
// (the failover is Redis's own, in real time): what is asserted is the
// recovery and the admin change; the rates are logged, not asserted.

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// fleetTag is the hash tag of the fleet tests' keys (fleet name "test").
const fleetTag = "{kvthrottle:test}"

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

// The targets of a failover of the fleet's store (on the real clock: a
// real Redis Cluster or Sentinel fails over on its own time): each
// instance reaches the store again within failoverBackTarget of the
// store's being healthy, and an admin change made then is in force on
// every instance within failoverChangeTarget. BenchmarkFleetClusterFailover
// and BenchmarkFleetSentinelFailover report the figures; the tests fail
// only at coarseFactor times them (a breakage: the store's client kept
// failing against the dead primary for a minute, until its slot map was
// reloaded).
const (
	failoverPeriod       = time.Second
	failoverBackTarget   = 2 * failoverPeriod
	failoverChangeTarget = 3 * failoverPeriod
)

// failoverFigures is what a failoverRun measured, per instance.
type failoverFigures struct {
	back   []time.Duration // store up again, after the store was healthy
	change []time.Duration // the admin change in force, after it was made
}

// worst returns the longest of ds.
func worst(ds []time.Duration) time.Duration {
	var w time.Duration
	for _, d := range ds {
		w = max(w, d)
	}
	return w
}

// failoverRun is one failover under load: two instances sharing a bucket
// with hard_limit 3000, 6 and 3 saturating connections, the store's
// primary killed (kill) after 8 s, then healthy (the time the store was
// reported healthy again). It asserts the recovery: no client error, each
// instance's store up, and an admin change made right after applied on
// both instances, each within coarseFactor times its target. It logs the
// timeline and the per-second rates, and returns the figures.
func failoverRun(t testing.TB, url string, kill func(), healthy func() time.Time) failoverFigures {
	const period = failoverPeriod
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
	down, up, back := w.waitUp(time.Until(ok) + coarseFactor*failoverBackTarget)
	since := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return at.Sub(killed).Round(time.Millisecond).String()
	}
	var fig failoverFigures
	line := []string{"killed at 0, store healthy at " + since(ok)}
	for i := range up {
		line = append(line, fmt.Sprintf("instance %d: store down at %s, up at %s", i, since(down[i]), since(up[i])))
		fig.back = append(fig.back, up[i].Sub(ok))
		if !back || up[i].Sub(ok) > coarseFactor*failoverBackTarget {
			t.Errorf("instance %d: store up again at %s (healthy at %s), want within %v (ten times the target)", i, since(up[i]), since(ok), coarseFactor*failoverBackTarget)
		}
	}
	t.Logf("failover timeline: %s", strings.Join(line, "; "))

	changed := time.Now()
	fleetAdmin(t, f.insts[1], mc.OpSetBucketThrottleProperties, "b", `{"reserved": 0, "hard_limit": 2400}`)
	for i, p := range f.insts {
		for statHardLimit(t, p, "b") != "2400" {
			if time.Since(changed) > coarseFactor*failoverChangeTarget {
				t.Fatalf("instance %d does not enforce the admin change made after the failover %v later", i, time.Since(changed).Round(time.Millisecond))
			}
			time.Sleep(10 * time.Millisecond)
		}
		fig.change = append(fig.change, time.Since(changed))
		t.Logf("instance %d enforces the admin change %v after it was made", i, time.Since(changed).Round(time.Millisecond))
	}
	<-measured
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d client errors", n)
	}
	t.Logf("units/s before the kill: %s; from the kill on (the limit 2400 from about second %d): %s",
		perSecond(before), int(time.Since(changed).Seconds()), perSecond(after))
	return fig
}

// reportFailover reports a failoverRun's figures as benchmark metrics,
// the slowest instance's, and logs the targets missed.
func reportFailover(b *testing.B, fig failoverFigures) {
	back, change := worst(fig.back), worst(fig.change)
	b.ReportMetric(float64(back)/1e6, "store_back_ms")
	b.ReportMetric(float64(change)/1e6, "admin_change_ms")
	if back > failoverBackTarget || change > failoverChangeTarget {
		b.Logf("a target missed: store back %v after healthy (target %v), admin change in force %v after it (target %v)", back, failoverBackTarget, change, failoverChangeTarget)
	}
}

// statHardLimit returns bucket's hard_limit as p's STAT throttle shows it
// to the admin user (fleetUsers): the limit in force, not the share.
func statHardLimit(t testing.TB, p *testProxy, bucket string) string {
	t.Helper()
	c := dial(t, p.Addr)
	defer c.Close()
	if err := c.AuthPlain("admin", "admin-pw"); err != nil {
		t.Fatal(err)
	}
	kv, err := c.Stats("throttle")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kv {
		if kv[0] == "bucket:"+bucket+":hard_limit" {
			return kv[1]
		}
	}
	return ""
}

func perSecond(secs [][]float64) string {
	var out []string
	for _, s := range secs {
		out = append(out, fmt.Sprintf("%.0f", sum(s)))
	}
	return strings.Join(out, " ")
}

// TestFleetClusterFailover: the store is a Redis Cluster of 3 primaries and
// 3 replicas (cluster-node-timeout 1 s); the primary holding the fleet's
// hash tag is killed (SIGKILL) under load. Its replica takes over; once
// every surviving node reports cluster_state:ok and names a live primary
// for the tag, each instance reaches the store again (failoverRun's
// targets; it used to keep failing against the dead primary until the
// client's slot map was reloaded a minute later: Store.failed), and an
// admin change is applied on both instances.
func TestFleetClusterFailover(t *testing.T) { clusterFailover(t) }

// BenchmarkFleetClusterFailover reports TestFleetClusterFailover's figures
// (failoverRun) beside their targets. The b.N loop is not used: run it
// with -benchtime 1x.
func BenchmarkFleetClusterFailover(b *testing.B) { reportFailover(b, clusterFailover(b)) }

func clusterFailover(t testing.TB) failoverFigures {
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

// TestFleetSentinelFailover: the store is a primary and its replica
// monitored by three sentinels (quorum 2, down-after-milliseconds 1000),
// reached through them (?master_name=); the primary is killed (SIGKILL)
// under load. Once the sentinels name the promoted replica and it reports
// role:master, each instance reaches the store again, and an admin change
// is applied on both instances (failoverRun's targets).
func TestFleetSentinelFailover(t *testing.T) { sentinelFailover(t) }

// BenchmarkFleetSentinelFailover reports TestFleetSentinelFailover's
// figures (failoverRun) beside their targets. The b.N loop is not used:
// run it with -benchtime 1x.
func BenchmarkFleetSentinelFailover(b *testing.B) { reportFailover(b, sentinelFailover(b)) }

func sentinelFailover(t testing.TB) failoverFigures {
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
