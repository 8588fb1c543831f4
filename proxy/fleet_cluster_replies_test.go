package proxy

// The replies a store gives while it fails over or moves, from real
// redis-server processes, to instances on fake clocks: CLUSTERDOWN, a
// slot migration of the fleet's hash tag (TRYAGAIN, ASK, MOVED) and
// READONLY from a demoted primary. Each change of the store is made with
// the fake clock standing; the fleet keeps or regains the store without a
// restart.

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// TestFleetClusterDown: a primary that does not hold the fleet's hash tag
// is killed with its failover held (fakeFailover): once the cluster
// reports cluster_state:fail, the live primary of the fleet's keys answers
// CLUSTERDOWN to every call for 3 s of fake time; once its replica has
// taken over and the cluster is healthy, each instance is back within 2
// periods, with the figures of fakeFailover.
func TestFleetClusterDown(t *testing.T) {
	t.Parallel()
	c := testmc.StartRedisCluster(t, 3, 1, time.Second)
	primary := c.Primary(fleetTag)
	var other *testmc.Redis
	for _, n := range c.Nodes {
		if n != primary && len(c.Replicas(n)) > 0 {
			other = n
			break
		}
	}
	if primary == nil || other == nil {
		t.Fatalf("no primary serves %s, or no other primary", fleetTag)
	}
	fakeFailover(t, failoverStore{
		url:  c.URL(),
		hold: func() func() { return c.HoldFailover(t, other) },
		kill: other.Kill,
		down: func() {
			testmc.Eventually(t, 30*time.Second, "the fleet's primary reports cluster_state:fail", func() bool {
				info, err := testmc.Cli(primary.Addr, "cluster", "info")
				return err == nil && strings.Contains(info, "cluster_state:fail")
			})
		},
		failure: "CLUSTERDOWN",
		healthy: func() {
			if _, err := c.WaitHealthy(fleetTag, 30*time.Second); err != nil {
				t.Fatal(err)
			}
		},
	})
}

// upTracker follows each instance's store through the phases of a test:
// whether it was up at a step and down at a later one (lost), and whether
// it is up at the end.
type upTracker struct {
	f        *fleetTest
	wasUp    []bool
	lost, up []bool
}

func trackUp(f *fleetTest) *upTracker {
	n := len(f.insts)
	u := &upTracker{f: f, wasUp: make([]bool, n), lost: make([]bool, n), up: make([]bool, n)}
	f.fake.onStep = func() {
		if s := f.hardSum("b"); s > 3000 {
			f.t.Fatalf("at %v the instances enforce hard limits adding up to %d, above the fleet's 3000", f.fake.clock.Now(), s)
		}
		for i, p := range f.insts {
			up := p.fleet.fl.Grants().StoreUp()
			u.lost[i] = u.lost[i] || (u.wasUp[i] && !up)
			u.wasUp[i] = u.wasUp[i] || up
			u.up[i] = up
		}
	}
	return u
}

// phase moves the fake clock by n periods (1 s) and checks that each
// instance's store is up at the end, or down if wantDown; and, unless
// wantDown, that once up in the phase it stayed so. It returns b's units
// per second.
func (u *upTracker) phase(what string, n int, wantDown bool) [][]float64 {
	u.f.t.Helper()
	clear(u.wasUp)
	clear(u.lost)
	secs := u.f.seconds(n, "b")["b"]
	for i := range u.up {
		switch {
		case wantDown && u.up[i]:
			u.f.t.Errorf("%s: instance %d has its store up after %d periods, want it down", what, i, n)
		case !wantDown && (!u.up[i] || u.lost[i]):
			u.f.t.Errorf("%s: instance %d: store up at the end %v, lost after it was up %v; want up, and kept", what, i, u.up[i], u.lost[i])
		}
	}
	return secs
}

// replyFleet starts two instances on fake clocks (period 1 s) with bucket
// b (hard_limit 3000) loaded by 6 and 3 saturating connections and an
// idle bucket c (hard_limit 1000), against url, and logs into log.
func replyFleet(t *testing.T, url string) (*fleetTest, *fleetClients, *testmc.LockedBuffer) {
	log := &testmc.LockedBuffer{}
	f := &fleetTest{t: t, mc: testmc.Start(t), url: url, period: "1s", log: log,
		tail: "[[bucket]]\nname = \"b\"\nhard_limit = 3000\n[[bucket]]\nname = \"c\"\nhard_limit = 1000\n" + fleetUsers(t)}
	f.fakeTime()
	l := &fleetClients{}
	for i, n := range []int{6, 3} {
		f.start(i, `default_bucket = "b"`)
		l.add(f, i, n)
	}
	return f, l, log
}

// adminThenPhase makes c's hard_limit limit through instance 1, runs a
// phase of one period (upTracker.phase, the store kept up) and fails the
// test unless both instances enforce the change then.
func adminThenPhase(t *testing.T, u *upTracker, what string, limit int) [][]float64 {
	t.Helper()
	fleetAdmin(t, u.f.insts[1], mc.OpSetBucketThrottleProperties, "c", `{"reserved": 0, "hard_limit": `+strconv.Itoa(limit)+`}`)
	secs := u.phase(what, 1, false)
	for i, p := range u.f.insts {
		if got := statHardLimit(t, p, "c"); got != strconv.Itoa(limit) {
			t.Errorf("%s: instance %d: c's hard_limit %s a period after the change, want %d", what, i, got, limit)
		}
	}
	return secs
}

// checkSeconds fails the test if any second of secs is above 3300 units.
func checkSeconds(t *testing.T, what string, secs [][]float64) {
	t.Helper()
	for k, s := range secs {
		if n := sum(s); n > 3300 {
			t.Errorf("%s, second %d: %.0f units, more than 3000 +10%%", what, k, n)
		}
	}
}

// TestFleetSlotMigration: the slot of the fleet's hash tag moves to
// another primary the way a reshard moves it, each change made with the
// fake clock standing, two periods of load after each: MIGRATING on the
// source and IMPORTING on the target (the source serves every call); one
// of the slot's keys moved (MIGRATE), so that the source has only some of
// a call's keys and answers TRYAGAIN: the store is down, the grants kept
// (under 3 periods); every key moved, so that the source answers ASK and
// the target serves the call after ASKING: the store back at the first
// call; the slot given to the target (SETSLOT NODE on every primary),
// so that the source answers MOVED: the store kept. An admin change made
// through one instance in the ASK phase and after the move is in force on
// both a period later; no second above 3300 units, no client error.
func TestFleetSlotMigration(t *testing.T) {
	t.Parallel()
	c := testmc.StartRedisCluster(t, 3, 0, time.Second)
	src := c.Primary(fleetTag)
	if src == nil {
		t.Fatalf("no primary serves %s", fleetTag)
	}
	dst := c.Nodes[0]
	if dst == src {
		dst = c.Nodes[1]
	}
	srcID, err1 := c.NodeID(src)
	dstID, err2 := c.NodeID(dst)
	slot, err3 := testmc.Cli(src.Addr, "cluster", "keyslot", fleetTag)
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	ok := func(n *testmc.Redis, args ...string) {
		t.Helper()
		if out, err := testmc.Cli(n.Addr, args...); err != nil || out != "OK" {
			t.Fatalf("%s %v: %q %v", n.Addr, args, out, err)
		}
	}
	migrate := func(keys []string) {
		t.Helper()
		host, port, _ := strings.Cut(dst.Addr, ":")
		ok(src, append([]string{"migrate", host, port, "", "0", "5000", "keys"}, keys...)...)
	}

	f, l, log := replyFleet(t, c.URL())
	defer l.close(f)
	u := trackUp(f)
	var secs [][]float64
	secs = append(secs, u.phase("before the migration", 2, false)...)
	keys, err := testmc.Cli(src.Addr, "cluster", "getkeysinslot", slot, "100")
	if err != nil || len(strings.Fields(keys)) < 2 {
		t.Fatalf("the keys of slot %s: %q %v, want at least 2", slot, keys, err)
	}
	moving := strings.Fields(keys)

	ok(dst, "cluster", "setslot", slot, "importing", srcID)
	ok(src, "cluster", "setslot", slot, "migrating", dstID)
	secs = append(secs, u.phase("slot migrating, no key moved", 2, false)...)

	migrate(moving[:1])
	mark := len(log.String())
	secs = append(secs, u.phase("one key moved (TRYAGAIN)", 2, true)...)
	if got := log.String()[mark:]; !strings.Contains(got, "TRYAGAIN") {
		t.Errorf("the instances' logs with one key moved do not say TRYAGAIN:\n%s", got)
	}

	migrate(moving[1:])
	secs = append(secs, u.phase("every key moved (ASK)", 2, false)...)
	secs = append(secs, adminThenPhase(t, u, "an admin change with the slot migrating", 500)...)

	for _, n := range append([]*testmc.Redis{dst, src}, c.Nodes[:3]...) {
		ok(n, "cluster", "setslot", slot, "node", dstID)
	}
	secs = append(secs, u.phase("slot moved (MOVED)", 2, false)...)
	secs = append(secs, adminThenPhase(t, u, "an admin change after the move", 400)...)
	if owner := c.Primary(fleetTag); owner != dst {
		t.Errorf("the cluster names %v as the primary of %s, want the target %s", owner, fleetTag, dst.Addr)
	}
	checkSeconds(t, "slot migration", secs)
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d client errors", n)
	}
	t.Logf("b's units per second: %s", perSecond(secs))
}

// TestFleetDemotedPrimary: the store is reached through an address that,
// like a managed store's primary endpoint, moves to the new primary when
// the primary is demoted (testmc.Endpoint); the connections made before
// stay with the old one. With the fake clock standing the replica is
// promoted, the primary made its replica (alive: its clients stay
// connected, and every write they send is answered READONLY) and the
// address moved. An admin change made right then succeeds and is in force
// on both instances a period later, and neither instance's store goes
// down: a READONLY reply closes its connection and the call is sent again
// (fleet's readOnlyHook), on a new connection to the new primary.
func TestFleetDemotedPrimary(t *testing.T) {
	t.Parallel()
	primary := testmc.StartRedis(t)
	replica := testmc.StartRedisReplica(t, primary)
	ep := testmc.StartEndpoint(t, primary.Addr)
	f, l, _ := replyFleet(t, "redis://"+ep.Addr+"/0")
	defer l.close(f)
	u := trackUp(f)
	secs := u.phase("before the demotion", 2, false)

	host, port, _ := strings.Cut(replica.Addr, ":")
	for _, cmd := range [][]string{{replica.Addr, "replicaof", "no", "one"}, {primary.Addr, "replicaof", host, port}} {
		if out, err := testmc.Cli(cmd[0], cmd[1:]...); err != nil || !strings.HasPrefix(out, "OK") {
			t.Fatalf("%v: %q %v", cmd, out, err)
		}
	}
	ep.SetTarget(replica.Addr)
	secs = append(secs, adminThenPhase(t, u, "an admin change right after the demotion", 500)...)
	secs = append(secs, u.phase("after the demotion", 2, false)...)
	checkSeconds(t, "demotion", secs)
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d client errors", n)
	}
}

// TestFleetClusterDemotedPrimary: the replica of the fleet's primary takes
// over by a manual failover (CLUSTER FAILOVER), made with the fake clock
// standing: the old primary is alive and a replica now, and answers the
// instances' connections to it MOVED, which they follow. Neither
// instance's store goes down, and an admin change made right then is in
// force on both a period later. (A cluster replica answers MOVED, not
// READONLY, to a client that has not sent READONLY itself.)
func TestFleetClusterDemotedPrimary(t *testing.T) {
	t.Parallel()
	c := testmc.StartRedisCluster(t, 3, 1, time.Second)
	primary := c.Primary(fleetTag)
	if primary == nil {
		t.Fatalf("no primary serves %s", fleetTag)
	}
	replicas := c.Replicas(primary)
	if len(replicas) != 1 {
		t.Fatalf("%s has replicas %v, want one", primary.Addr, replicas)
	}
	f, l, _ := replyFleet(t, c.URL())
	defer l.close(f)
	u := trackUp(f)
	secs := u.phase("before the failover", 2, false)
	if out, err := testmc.Cli(replicas[0].Addr, "cluster", "failover"); err != nil || out != "OK" {
		t.Fatalf("cluster failover: %q %v", out, err)
	}
	testmc.Eventually(t, 30*time.Second, "the replica serves the fleet's keys and the cluster is healthy", func() bool {
		return c.Primary(fleetTag) == replicas[0] && c.Healthy(fleetTag)
	})
	secs = append(secs, adminThenPhase(t, u, "an admin change right after the failover", 500)...)
	secs = append(secs, u.phase("after the failover", 2, false)...)
	checkSeconds(t, "manual failover", secs)
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d client errors", n)
	}
}
