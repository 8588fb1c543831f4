package proxy

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// What one instance of a fleet changes reaches the others within one
// grant period (DESIGN.md section 10), counted on fake clocks (fleetFake)
// to the step: a SIGHUP reload that changes a limit, and FLUSHes (the
// namespaces are fleet-wide), two of them from two instances in one
// period both taking effect.

// withinPeriod steps f's clocks until reached holds, and fails the test
// if that takes more than a grant period (period) of the fleet's clock; it
// returns how long it took.
func withinPeriod(t *testing.T, f *fleetTest, period time.Duration, what string, reached func() bool) time.Duration {
	t.Helper()
	at := f.fake.clock.Now()
	for !reached() {
		if d := f.fake.clock.Now() - at; d > period {
			t.Fatalf("%v after it was made, %s has not happened: more than a grant period (%v) on", d, what, period)
		}
		f.step(fleetStep)
	}
	return f.fake.clock.Now() - at
}

// TestFleetReloadAndFlushReachEveryInstance: a reload of instance 0 whose
// file changes a hard limit is in force on instance 1 within one period,
// like an admin change; a FLUSH through instance 0 empties the bucket
// through instance 1 within one period; FLUSHes through both in one
// period, the second before its instance has heard of the first, both
// take effect, everywhere within a period.
func TestFleetReloadAndFlushReachEveryInstance(t *testing.T) {
	const period = 500 * time.Millisecond
	bucket := "[[bucket]]\nname = \"b\"\nhard_limit = %d\nflush_enabled = true\n"
	f := newFakeFleetTest(t, fmt.Sprintf(bucket, 3000)+fleetUsers(t), period.String())
	a, b := f.start(0, `default_bucket = "b"`), f.start(1, `default_bucket = "b"`)
	f.pass(123 * time.Millisecond) // the changes come between two syncs

	tc := f.tcs[0]
	tc.tail = strings.Replace(tc.tail, fmt.Sprintf(bucket, 3000), fmt.Sprintf(bucket, 1200), 1)
	cfg, err := bucketcfg.Parse([]byte(tc.render(a.Addr, []string{f.mc.Addr}, tc.statePath)))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	d := withinPeriod(t, f, period, "the reloaded hard limit on instance 1", func() bool {
		_, h := b.Engine().Bucket("b").Limits()
		eff, _ := b.EffectiveConfig()
		return h <= 1200 && eff.Bucket("b").Throttle.HardLimit == 1200
	})
	t.Logf("instance 1 enforces the reloaded limit %v after the reload", d)

	ca, cb := dial(t, a.Addr), dial(t, b.Addr)
	defer ca.Close()
	defer cb.Close()
	clientSet(t, cb, "k1")
	clientFlush(t, ca)
	d = withinPeriod(t, f, period, "instance 0's FLUSH through instance 1", func() bool { return clientGone(t, cb, "k1") })
	t.Logf("instance 0's FLUSH in force through instance 1 %v after it", d)

	clientFlush(t, ca)
	clientSet(t, ca, "k2")
	clientFlush(t, cb) // before b has heard of a's FLUSH
	if !clientGone(t, cb, "k2") {
		t.Errorf("k2, set after a's FLUSH, survived b's FLUSH (read through b)")
	}
	d = withinPeriod(t, f, period, "instance 1's FLUSH through instance 0", func() bool { return clientGone(t, ca, "k2") })
	t.Logf("instance 1's FLUSH, made in the period of instance 0's, in force through instance 0 %v after it", d)
}

// clientFlush sends a FLUSH on c and fails the test unless it succeeds.
func clientFlush(t *testing.T, c *mcclient.Client) {
	t.Helper()
	if r, err := c.Do(mcclient.Request{Opcode: mc.OpFlush}); err != nil || r.Header.Status() != mc.StatusSuccess {
		t.Fatalf("FLUSH: %v %v", r, err)
	}
}

// clientSet sets k on c and fails the test unless it is stored.
func clientSet(t *testing.T, c *mcclient.Client, k string) {
	t.Helper()
	if r, err := c.Set([]byte(k), []byte("v")); err != nil || r.Header.Status() != mc.StatusSuccess {
		t.Fatalf("SET %s: %v %v", k, r, err)
	}
}

// clientGone reports whether a GET of k on c misses.
func clientGone(t *testing.T, c *mcclient.Client, k string) bool {
	t.Helper()
	r, err := c.Get([]byte(k))
	if err != nil {
		t.Fatalf("GET %s: %v", k, err)
	}
	return r.Header.Status() == mc.StatusKeyEnoent
}
