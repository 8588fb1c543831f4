package proxy

// Fleet mode on a store that fails over, on fake clocks: the instances'
// engines and fleets read fake clocks (fleetFake), the store is real Redis
// Cluster or Sentinel processes whose primary is killed under load, and
// the figures are asserted exactly. Only one wait is in real
// time, with the fake clock standing: until the cluster or the sentinels
// report the store healthy again (a liveness wait: nothing the instances
// do depends on how long it takes, since they make no call meanwhile).

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// The fake-clock failover's dimensions: a grant period of 1 s (the
// default), the primary killed 8 s in, the store down for the fleet (its
// calls failing) for 3 s of fake time, then 12 s more.
const (
	failoverPeriod = time.Second
	failoverBefore = 8
	failoverDown   = 3
	failoverAfter  = 12
)

// failoverStore is the store a fake-clock failover runs against.
type failoverStore struct {
	url string
	// hold keeps the store from failing over until release is called.
	hold func() (release func())
	// kill kills the primary holding the fleet's keys (or, for
	// TestFleetClusterDown, another one).
	kill func()
	// down, when set, waits (real time) after kill until the store's
	// calls fail.
	down func()
	// failure is what the instances' logs say of the calls that failed
	// while the store was down ("fleet sync failed" and the error).
	failure string
	// healthy waits (real time) until the store reports itself healthy.
	healthy func()
}

// failoverTimeline is what the instances did after the store was healthy
// again, in fake time since then (-1: not seen).
type failoverTimeline struct {
	back    []time.Duration // each instance's first successful sync
	applied []time.Duration // each instance enforcing the admin change
	lost    []bool          // the store down again on an instance once back
}

// fakeFailover runs the failover on fake clocks: two instances,
// bucket b (hard_limit 3000) loaded by 6 and 3 saturating connections, an
// idle bucket c (hard_limit 1000). At 8 s the store's primary is killed
// with the failover held: for 3 s the fleet's calls fail and the
// instances keep their grants, then fall back to half the limit each.
// With the clock standing the failover is let go and waited for; an
// admin change (c's hard_limit to 500) is made through instance 1; then
// 12 s more. Asserted: no client error; every second at most 3300 units
// of b, the last 6 within 5% of 3000; at every step the shares the
// instances enforce add up to at most 3000; every instance's store up
// again within 2 periods of the store being healthy (STAT's
// fleet:store_up "true" then, and it stays so); the change in force on
// both instances within a period.
func fakeFailover(t *testing.T, st failoverStore) failoverTimeline {
	f := &fleetTest{t: t, mc: testmc.Start(t), url: st.url, period: failoverPeriod.String(),
		tail: "[[bucket]]\nname = \"b\"\nhard_limit = 3000\n[[bucket]]\nname = \"c\"\nhard_limit = 1000\n" + fleetUsers(t)}
	log := &testmc.LockedBuffer{}
	f.log = log
	f.fakeTime()
	var l fleetClients
	defer l.close(f)
	for i, n := range []int{6, 3} {
		f.start(i, `default_bucket = "b"`)
		l.add(f, i, n)
	}
	tl := failoverTimeline{back: []time.Duration{-1, -1}, applied: []time.Duration{-1, -1}, lost: make([]bool, 2)}
	var healthyAt time.Duration = -1
	f.fake.onStep = func() {
		now := f.fake.clock.Now()
		if s := f.hardSum("b"); s > 3000 {
			t.Fatalf("at %v the instances enforce hard limits adding up to %d, above the fleet's 3000", now, s)
		}
		if healthyAt < 0 {
			return
		}
		for i, p := range f.insts {
			up := p.fleet.fl.Grants().StoreUp()
			switch {
			case up && tl.back[i] < 0:
				tl.back[i] = now - healthyAt
			case !up && tl.back[i] >= 0:
				tl.lost[i] = true
			}
			if tl.applied[i] < 0 && p.ten.Load().cfg.Bucket("c").Throttle.HardLimit == throttle.Limit(500) {
				tl.applied[i] = now - healthyAt
			}
		}
	}

	secs := f.seconds(failoverBefore, "b")["b"]
	release := st.hold()
	st.kill()
	if st.down != nil {
		st.down()
	}
	logged := len(log.String())
	secs = append(secs, f.seconds(failoverDown, "b")["b"]...)
	for i, p := range f.insts {
		if p.fleet.fl.Grants().StoreUp() {
			t.Fatalf("instance %d has the store up with its primary dead and the failover held", i)
		}
	}
	if got := log.String()[logged:]; !strings.Contains(got, "fleet sync failed") || !strings.Contains(got, st.failure) {
		t.Errorf("the instances' logs while the store was down do not say %q:\n%s", st.failure, got)
	}
	released := time.Now()
	release()
	st.healthy()
	wait := time.Since(released).Round(10 * time.Millisecond)
	healthyAt = f.fake.clock.Now()
	fleetAdmin(t, f.insts[1], mc.OpSetBucketThrottleProperties, "c", `{"reserved": 0, "hard_limit": 500}`)
	secs = append(secs, f.seconds(2, "b")["b"]...) // 2 periods
	for i, p := range f.insts {
		if fs := fleetStats(t, p); fs == nil || !fs.StoreUp {
			t.Errorf("instance %d: STAT fleet:store_up not true 2 periods after the store was healthy again", i)
		}
	}
	secs = append(secs, f.seconds(failoverAfter-2, "b")["b"]...)

	checkFailoverRates(t, secs)
	for i := range f.insts {
		switch {
		case tl.back[i] < 0 || tl.back[i] > 2*failoverPeriod:
			t.Errorf("instance %d: store up again %v after the store was healthy, want within 2 periods (%v)", i, tl.back[i], 2*failoverPeriod)
		case tl.lost[i]:
			t.Errorf("instance %d: store down again after it was back", i)
		}
		if tl.applied[i] < 0 || tl.applied[i] > failoverPeriod {
			t.Errorf("instance %d: the admin change made when the store was healthy in force %v later, want within a period (%v)", i, tl.applied[i], failoverPeriod)
		}
	}
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d client errors", n)
	}
	t.Logf("failover timeline (fake time, period %v): primary killed at %ds, the store down for the fleet %ds, healthy at %ds (the failover, let go then, took %v of real time with the fake clock standing); after healthy: store up on instance 0 at %v, on instance 1 at %v; the admin change (made at healthy) in force on instance 0 at %v, on instance 1 at %v",
		failoverPeriod, failoverBefore, failoverDown, failoverBefore+failoverDown, wait, tl.back[0], tl.back[1], tl.applied[0], tl.applied[1])
	return tl
}

// checkFailoverRates checks b's units per second of a failover run: none
// above 3300 (+10%), the last 6 within 5% of 3000.
func checkFailoverRates(t *testing.T, secs [][]float64) {
	t.Helper()
	var perSec []string
	last := 0.0
	for k, s := range secs {
		n := sum(s)
		perSec = append(perSec, fmt.Sprintf("%.0f", n))
		if n > 3300 {
			t.Errorf("second %d: %.0f units (per instance %.0f), more than 3000 +10%%", k, n, s)
		}
		if k >= len(secs)-6 {
			last += n
		}
	}
	t.Logf("b's units per second (primary killed after second %d): %s", failoverBefore-1, strings.Join(perSec, " "))
	if rate := last / 6; rate < 3000*0.95 || rate > 3000*1.05 {
		t.Errorf("the last 6 s: %.0f units/s, want 3000 +-5%%", rate)
	}
}

// TestFleetClusterFailover: the store is a Redis Cluster of 3 primaries
// and 3 replicas (cluster-node-timeout 1 s); the primary holding the
// fleet's hash tag is killed (SIGKILL) under load (fakeFailover). Once
// every surviving node reports cluster_state:ok and names its replica as
// the primary for the tag, each instance reaches the store at its first
// call: its last call failed, so the call loads the slot map first
// (fleet's slotMapHook; without it, the calls went on failing against the
// dead primary until the client's own reload a minute later).
func TestFleetClusterFailover(t *testing.T) {
	t.Parallel()
	c := testmc.StartRedisCluster(t, 3, 1, time.Second)
	primary := c.Primary(fleetTag)
	if primary == nil {
		t.Fatalf("no primary serves %s", fleetTag)
	}
	fakeFailover(t, failoverStore{
		url:     c.URL(),
		hold:    func() func() { return c.HoldFailover(t, primary) },
		kill:    primary.Kill,
		failure: "connection refused",
		healthy: func() {
			if _, err := c.WaitHealthy(fleetTag, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// TestFleetSentinelFailover: the store is a primary and its replica
// monitored by three sentinels (quorum 2, down-after-milliseconds 1000),
// reached through them (?master_name=); the primary is killed (SIGKILL)
// under load (fakeFailover). Once the sentinels name the promoted replica
// and it reports role:master, each instance reaches the store at its
// first call (a new connection asks the sentinels for the primary).
func TestFleetSentinelFailover(t *testing.T) {
	t.Parallel()
	s := testmc.StartRedisSentinel(t, time.Second)
	primary := s.Primary()
	if primary == nil {
		t.Fatal("the sentinels name no primary")
	}
	fakeFailover(t, failoverStore{
		url:     s.URL(),
		hold:    func() func() { return s.HoldFailover(t) },
		kill:    primary.Kill,
		failure: "connection refused",
		healthy: func() {
			if _, err := s.WaitHealthy(30 * time.Second); err != nil {
				t.Fatal(err)
			}
		},
	})
}
