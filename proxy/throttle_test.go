package proxy

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// drive runs the connections, each doing SETs of 1 unit for d, and
// returns the commands completed, the failures and the longest latency.
func drive(conns []*mcclient.Client, d time.Duration) (done, failed int64, maxLatency time.Duration) {
	var wg sync.WaitGroup
	var n, bad atomic.Int64
	var maxLat atomic.Int64
	stop := time.Now().Add(d)
	for i, c := range conns {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := []byte(fmt.Sprintf("k%d", i))
			for time.Now().Before(stop) {
				t0 := time.Now()
				r, err := c.Set(key, []byte("v"))
				if err != nil || r.Status() != mc.StatusSuccess {
					bad.Add(1)
					return
				}
				lat := int64(time.Since(t0))
				for old := maxLat.Load(); lat > old && !maxLat.CompareAndSwap(old, lat); old = maxLat.Load() {
				}
				n.Add(1)
			}
		}(i)
	}
	wg.Wait()
	return n.Load(), bad.Load(), time.Duration(maxLat.Load())
}

// TestHardLimitHoldsRealClock: on the real clock and the real timers, a
// bucket with hard limit 200 u/s driven by 8 saturating connections is
// held (commands wait, none fail), is woken again (it runs past its
// burst), and never runs above its limit, while a bucket without a limit
// is not held. The limit is a tenth of what a loaded machine runs over TLS
// with the race detector, so the bucket is held on every run; the rate at
// the limit is asserted exactly on the fake clock
// (TestConnectionsShareTheirBucket), and the rate and the wake-up delays
// on the real clock are BenchmarkHardLimitRate's figures. Above: the
// engine cannot admit more than its burst and the limit's worth of the
// time that passed around the run, a bound load cannot break (load only
// slows the clients).
func TestHardLimitHoldsRealClock(t *testing.T) {
	const limit, burst = 200, 20 // units/s; units in burst_ms = 100
	tail := strings.Replace(limitedTail(t), "hard_limit = 2000", fmt.Sprintf("hard_limit = %d", limit), 1)
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`, tail: tail, loops: 2})
	const d = 1500 * time.Millisecond
	var lc, fc []*mcclient.Client
	for i := 0; i < 8; i++ {
		lc = append(lc, login(t, p.Addr, "limited"))
		fc = append(fc, login(t, p.Addr, "free"))
	}
	var limitedBad, freeBad int64
	var wg sync.WaitGroup
	lb := p.Engine().Bucket("limited")
	admitted0, t0 := lb.Stats().Commands, time.Now()
	wg.Add(2)
	go func() { defer wg.Done(); _, limitedBad, _ = drive(lc, d) }()
	go func() { defer wg.Done(); _, freeBad, _ = drive(fc, d) }()
	wg.Wait()
	admitted, took := lb.Stats().Commands-admitted0, time.Since(t0)
	if limitedBad != 0 || freeBad != 0 {
		t.Fatalf("failed commands: limited %d, free %d (held commands must not fail)", limitedBad, freeBad)
	}
	t.Logf("limited bucket: %d SETs admitted in %v (limit %d/s)", admitted, took, limit)
	// 1-unit SETs: the limit's worth of the time around the run, the
	// burst and one command of overdraft.
	if most := uint64(limit*took.Seconds()) + burst + 1; admitted > most {
		t.Errorf("limited bucket admitted %d SETs of one unit in %v, over its hard limit %d/s and burst (%d)", admitted, took, limit, most)
	}
	// Past the burst, every admission came from a held session woken by
	// the real timers.
	if admitted <= burst+1 {
		t.Errorf("limited bucket admitted %d SETs in %v: held sessions were not woken", admitted, took)
	}
	admin := p.Engine()
	if h := admin.Bucket("limited").Stats().Held; h == 0 { // the engine's count, not a latency
		t.Error("limited bucket: no command was held")
	}
	if h := admin.Bucket("free").Stats().Held; h != 0 {
		t.Errorf("free bucket: %d commands held, want 0", h)
	}
}

// TestHeldInputBound: a held connection that keeps sending past
// max_held_input_bytes is no longer read (back-pressure, readgate.go), not
// closed: once its bucket may run again, every quiet SET it sent is
// stored and the connection answers in step. (It was closed at the bound
// before, losing what it had sent.)
func TestHeldInputBound(t *testing.T) {
	p := startProxy(t, testConfig{proxy: "max_held_input_bytes = 65536\nmax_frame_bytes = 65536", throttle: `capacity = "unlimited"`,
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 1\n"})
	c := dial(t, p.Addr)
	// The first SET is admitted (and acknowledged); then the bucket is out
	// of budget for about a second and the session is held.
	if r, err := c.Set([]byte("acked"), []byte("yes")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("first set: %v %+v", err, r)
	}
	val := bytes.Repeat([]byte("x"), 1000)
	for i := 0; i < 300; i++ {
		c.Send(mcclient.Request{Opcode: mc.OpSetQ, Extras: mcclient.SetExtras(0, 0), Key: []byte("k" + strconv.Itoa(i)), Value: val})
	}
	_ = c.Flush()
	eventually(t, time.Minute, "the held connection to stop being read", func() bool { return p.readStops.Load() > 0 })
	if n := p.Connections(); n != 1 {
		t.Fatalf("%d connections open, want the held one", n)
	}
	p.Engine().Bucket("default").SetLimits(0, -1)
	if r, err := c.Do(mcclient.Request{Opcode: mc.OpNoop}); err != nil || r.Opcode != mc.OpNoop || r.Status() != mc.StatusSuccess {
		t.Fatalf("NOOP after the held SETs: %v %+v", err, r)
	}
	d := dial(t, p.Addr)
	for _, k := range []string{"acked", "k0", "k299"} {
		if r, err := d.Get([]byte(k)); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("%s: %v %+v", k, err, r)
		}
	}
}

// TestUnthrottledNeverHeld: an admin with the unthrottled privilege runs
// past the bucket's hard limit, and its units are charged. On the fake
// clock, standing still: 100 units at 50 units/s (a burst of 5), were
// any held, would not all be answered before the clock moves.
func TestUnthrottledNeverHeld(t *testing.T) {
	t.Parallel()
	tail := tenantTail(t) + "\n" // buckets default, alice, bob
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, tail: tail}, throttle.NewFakeClock(time.Hour))
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "bob", `{"reserved":0,"hard_limit":50}`); r.Status() != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	if r, err := admin.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("bob")}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	for i := 0; i < 100; i++ {
		if r, err := admin.Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("unthrottled SET %d, the clock standing still: %v %+v (held?)", i, err, r)
		}
	}
	st := p.Engine().Bucket("bob").Stats()
	if st.Units < 100 || st.Held != 0 {
		t.Fatalf("bob: units %d (want >= 100 charged), held %d (want 0)", st.Units, st.Held)
	}
	// Bob, throttled, now waits for the debt the admin ran up.
	hb := login(t, p.Addr, "bob")
	hello(t, hb, mc.FeatureNonBlockingThrottlingMode)
	if r, err := hb.Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusEWouldThrottle {
		t.Fatalf("bob after the admin's burst: %v %+v, want EWouldThrottle", err, r)
	}
}

// TestLargeWritesChargedAtAdmission: a write's units are known when it is
// sent, so a large SET uses up the budget at once: the next command of the
// bucket waits for it (it could not pass on the one unit admission alone
// charges).
func TestLargeWritesChargedAtAdmission(t *testing.T) {
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"\nburst_ms = 100",
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 100\n"}, throttle.NewFakeClock(time.Hour))
	c := dial(t, p.Addr)
	hello(t, c, mc.FeatureNonBlockingThrottlingMode)
	big := bytes.Repeat([]byte("x"), 100*4096) // 101 units with the key
	if r, err := c.Set([]byte("big"), big); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("first SET: %v %+v", err, r)
	}
	r, err := c.Set([]byte("small"), []byte("v"))
	if err != nil || r.Status() != mc.StatusEWouldThrottle {
		t.Fatalf("SET right after a 101-unit SET at 100 units/s: %v %+v, want EWouldThrottle", err, r)
	}
	if !strings.Contains(string(r.Value), "next_tick_us") {
		t.Fatalf("body %q", r.Value)
	}
	var us int64
	fmt.Sscanf(strings.TrimPrefix(string(r.Value), `{"next_tick_us":`), "%d", &us)
	// The next 1-unit bill must fit in the burst whole (rule 2): it runs
	// once the 101 units are paid down to 90 ms.
	if us != 920_000 {
		t.Fatalf("next_tick_us = %d, want 920000: 101 units at 100/s, less the 100 ms burst, plus the 10 ms of its own unit (the engine's clock stands still)", us)
	}
}

// TestReportUnitUsage: after HELLO with ReportUnitUsage (0x1a), metered
// responses use flexible framing (magic 0x18) carrying the read and write
// units charged; clients that did not ask keep classic responses.
func TestReportUnitUsage(t *testing.T) {
	p := startProxy(t, testConfig{})
	c := dial(t, p.Addr)
	hello(t, c, mc.FeatureReportUnitUsage)
	units := func(r *mcclient.Response) (ru, wu int) {
		t.Helper()
		if r.Magic != mc.MagicAltResponse {
			t.Fatalf("magic 0x%02x, want 0x18", uint8(r.Magic))
		}
		ru, wu = -1, -1
		if err := mc.ParseFramingExtras(r.FramingExtras, func(fi mc.FrameInfo) {
			v := int(fi.Data[0])<<8 | int(fi.Data[1])
			switch fi.ID {
			case mc.FrameInfoReadUnits:
				ru = v
			case mc.FrameInfoWriteUnits:
				wu = v
			}
		}); err != nil {
			t.Fatal(err)
		}
		return ru, wu
	}
	val := bytes.Repeat([]byte("x"), 10000) // key+value 10003 bytes: 3 units
	r, err := c.Set([]byte("abc"), val)
	if err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	if ru, wu := units(r); ru != -1 || wu != 3 {
		t.Fatalf("SET: read units %d, write units %d; want none and 3", ru, wu)
	}
	r, err = c.Do(mcclient.Request{Opcode: mc.OpGetK, Key: []byte("abc")})
	if err != nil || r.Status() != mc.StatusSuccess || string(r.Key) != "abc" || len(r.Value) != len(val) {
		t.Fatal(err, r)
	}
	if ru, wu := units(r); ru != 3 || wu != -1 {
		t.Fatalf("GETK: read units %d, write units %d; want 3 and none", ru, wu)
	}
	// A client without the feature gets the classic magic.
	plain := dial(t, p.Addr)
	if r, err := plain.Get([]byte("abc")); err != nil || r.Magic != mc.MagicResponse {
		t.Fatalf("classic client: %v magic 0x%02x", err, uint8(r.Magic))
	}
}

// throttle.burst_ms = 0 means no banking, not the engine's default burst.
func TestBurstZeroMeansNoBanking(t *testing.T) {
	for _, c := range []struct {
		setting string
		want    time.Duration
	}{{"burst_ms = 0", 0}, {"burst_ms = 35", 35 * time.Millisecond}, {"", 100 * time.Millisecond}} {
		p := startProxy(t, testConfig{throttle: c.setting})
		if got := p.Engine().Burst(); got != c.want {
			t.Errorf("%q: engine burst %v, want %v", c.setting, got, c.want)
		}
	}
}
