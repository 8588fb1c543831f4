package proxy

// APPEND and PREPEND through the proxy (docs/throttling.md, "APPEND and
// PREPEND"): the bound each raises its key to, its bytes counted once
// however often it is tried, and nothing left when memcached stores
// nothing.

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// An APPEND that lists its key leaves the other keys' bound alone: after
// an APPEND of 100,000 bytes lists "big" (class 32), a 1-byte APPEND to
// "small" (1,000 bytes) leaves small billed 1 per read. (Before, the
// first APPEND's size stayed in the bucket's largest value, so small was
// listed at class 32, and after 64 such keys every read of the bucket was
// billed 32.)
func TestAppendListingItsKeyLeavesOtherKeysSmall(t *testing.T) {
	t.Parallel()
	_, w, rc := largeKeyProxy(t, "")
	setValue(t, w, "small", 1000)
	setValue(t, w, "big", 10)
	appendThroughProxy(t, w, "big", bytes.Repeat([]byte("v"), 100_000))
	if b := rc.KeyBound([]byte("big")); b != 32 {
		t.Fatalf("big after an APPEND of 100,000 bytes is billed %d per read, want 32", b)
	}
	appendThroughProxy(t, w, "small", []byte("x"))
	if b := rc.KeyBound([]byte("small")); b != 1 {
		t.Fatalf("small (1,001 bytes, written through the proxy only) is billed %d per read, want 1 (largest value %d bytes, %d keys listed)",
			b, rc.LargestValue(), rc.Listed())
	}
}

// An APPEND held by its bucket's hard limit reads its key's size again at
// its re-try (before, it kept the bound it reserved when first held); an
// unthrottled connection's SET of the same key goes meanwhile, and
// memcached appends to the SET's value. The key's bill must
// cover what it then holds ("with every write through one proxy no read
// finds a value above its bill"). bob: hard limit 100/s (burst 10 units).
func TestHeldAppendAfterASetOfItsKeyIsBilledBoth(t *testing.T) {
	t.Parallel()
	clk, p, admin, tb := limitedTenant(t, "bob")
	rc := tb.ReadCost()
	setValue(t, admin, "k", 1000) // 1 unit on bob's hard limit
	bob := login(t, p.Addr, "bob")
	setValue(t, bob, "x", 30_000) // 8 units: 90 ms of bob's 100 ms burst
	held := tb.Stats().Held
	done := make(chan error, 1)
	go func() {
		r, err := bob.Do(mcclient.Request{Opcode: mc.OpAppend, Key: []byte("k"), Value: bytes.Repeat([]byte("a"), 20_000)})
		if err == nil && r.Status() != mc.StatusSuccess {
			err = fmt.Errorf("status %v", r.Status())
		}
		done <- err
	}()
	eventually(t, time.Minute, "bob's APPEND held", func() bool { return tb.Stats().Held > held })
	select {
	case err := <-done:
		t.Fatalf("bob's APPEND answered while the clock stood still (%v): the test needs it held", err)
	default:
	}
	setValue(t, admin, "k", 130_000) // unthrottled: goes at once (class 32)
	var err error
	for step := 0; ; step++ {
		if step == 100 {
			t.Fatal("bob's APPEND not answered after 10 s of engine time")
		}
		clk.Advance(100 * time.Millisecond)
		select {
		case err = <-done:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		break
	}
	if err != nil {
		t.Fatalf("bob's APPEND: %v", err)
	}
	bill := rc.KeyBound([]byte("k")) // before the read: a surprise raises it
	r, err := admin.Get([]byte("k"))
	if err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("get: %v %v", r, err)
	}
	t.Logf("k holds %d bytes; billed %d before the read, ceiling %d after it (a surprise)", len(r.Value), bill, rc.Ceiling())
	if units := throttle.ReadUnits(int64(len("bob:k")+len(r.Value)), 4096); units > bill {
		t.Fatalf("k, written through the proxy only, holds %d bytes (%d units); its read is billed %d", len(r.Value), units, bill)
	}
}

// A write raises the ceiling before it is admitted (forward: raiseCeiling,
// then admission); an APPEND refused by the throttle releases its bytes
// in flight (session.app). A non-blocking client's APPEND refused with
// EWouldThrottle is answered and sent again: 20 refusals and one success
// of an APPEND of 20,000 bytes to a key of 1,000 leave the key billed for
// what it holds, 21,000 bytes (6 units, class 8). (Before, each refusal
// reserved its bytes again: billed as if it held 421,000.)
func TestNonBlockingAppendRefusedCountsItsBytesOnce(t *testing.T) {
	t.Parallel()
	clk := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, loops: 1,
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 100\n"}, clk)
	rc := p.Engine().Bucket("default").ReadCost()
	c := dial(t, p.Addr)
	hello(t, c, mc.FeatureNonBlockingThrottlingMode)
	setValue(t, c, "k", 1000)   // 1 unit of the 10-unit burst
	setValue(t, c, "x", 30_000) // 8 more
	v := bytes.Repeat([]byte("a"), 20_000)
	appendK := func() mc.Status {
		r, err := c.Do(mcclient.Request{Opcode: mc.OpAppend, Key: []byte("k"), Value: v})
		if err != nil {
			t.Fatal(err)
		}
		return r.Status()
	}
	for i := 0; i < 20; i++ {
		if st := appendK(); st != mc.StatusEWouldThrottle {
			t.Fatalf("APPEND %d with the clock standing still: %v, want EWouldThrottle", i, st)
		}
	}
	clk.Advance(time.Second)
	if st := appendK(); st != mc.StatusSuccess {
		t.Fatalf("APPEND after 1 s: %v", st)
	}
	clk.Advance(time.Second)
	r, err := c.Get([]byte("k"))
	if err != nil || r.Status() != mc.StatusSuccess || len(r.Value) != 21_000 {
		t.Fatalf("get: %v %v", r, err)
	}
	if b := rc.KeyBound([]byte("k")); b > 8 {
		t.Fatalf("k holds 21,000 bytes (class 8) and is billed %d per read (largest value %d bytes)", b, rc.LargestValue())
	}
	if f := rc.InFlight(); f != 0 {
		t.Fatalf("%d bytes of APPENDs in flight after every APPEND was answered", f)
	}
}

// An APPEND that memcached answers NOT_STORED (its key is missing: the
// "append, else add" idiom of lists) leaves nothing of its bytes
// (finishAppend), by every protocol's spelling of it: 300 binary APPENDs,
// 100 text appends and 100 meta ms MA of 4,000 bytes to missing keys leave
// the bucket's largest value at the 10 bytes it holds. The class their
// bound needed (2: 4,250 bytes) stays until a FLUSH, as documented.
// (Before, the bytes added up to the item size, 1 MiB, and every read of
// the bucket was billed 257 units until a FLUSH.)
func TestAppendNotStoredGivesBackItsBytes(t *testing.T) {
	t.Parallel()
	p, w, rc := largeKeyProxy(t, "")
	v := bytes.Repeat([]byte("v"), 4000)
	for i := 0; i < 300; i++ {
		r, err := w.Do(mcclient.Request{Opcode: mc.OpAppend, Key: []byte(fmt.Sprintf("list%d", i)), Value: v})
		if err != nil || r.Status() != mc.StatusNotStored {
			t.Fatalf("binary APPEND to missing key list%d: %v %v, want NOT_STORED", i, r, err)
		}
	}
	tc := dialText(t, p.Addr)
	for i := 0; i < 100; i++ {
		if got := textDo(t, tc, fmt.Sprintf("append tlist%d 0 0 4000\r\n%s\r\n", i, v), "NOT_STORED\r\n"); got != "NOT_STORED\r\n" {
			t.Fatalf("text append to a missing key: %q", got)
		}
		if got := textDo(t, tc, fmt.Sprintf("ms mlist%d 4000 MA\r\n%s\r\n", i, v), "NS\r\n"); got != "NS\r\n" {
			t.Fatalf("meta ms MA to a missing key: %q", got)
		}
	}
	setValue(t, w, "s", 10)
	if lv := rc.LargestValue(); lv != 10 {
		t.Fatalf("500 APPENDs stored nothing and a SET stored 10 bytes, yet the largest value is %d bytes (ceiling %d, %d keys listed)", lv, rc.Ceiling(), rc.Listed())
	}
	if f := rc.InFlight(); f != 0 {
		t.Fatalf("%d bytes of APPENDs in flight after every APPEND was answered", f)
	}
	if c := rc.Ceiling(); c != 2 {
		t.Fatalf("ceiling %d, want 2: the class the APPENDs' bound needed stays (docs/throttling.md)", c)
	}
}

// limitedTenant starts a proxy on a fake clock with the tenants of
// tenantTail, sets tenant's bucket to hard limit 100 units/s (a burst of 10
// units), and returns the clock, the proxy, an admin connection that
// selected the bucket (not throttled), and the bucket.
func limitedTenant(t *testing.T, tenant string) (*throttle.FakeClock, *testProxy, *mcclient.Client, *throttle.Bucket) {
	t.Helper()
	clk := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, tail: tenantTail(t) + "\n"}, clk)
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, tenant, `{"reserved":0,"hard_limit":100}`); r.Status() != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	if r, err := admin.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte(tenant)}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	return clk, p, admin, p.Engine().Bucket(tenant)
}
