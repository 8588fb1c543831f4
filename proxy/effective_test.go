package proxy

import (
	"testing"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// TestEffectiveConfig: the configuration the proxy reports as in force
// (what serve logs at start) carries the runtime throttle values over the
// file's, and each call returns the caller's own copy.
func TestEffectiveConfig(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{throttle: "capacity = 9000", tail: tenantTail(t)})
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetNodeThrottleProperties, "", `{"capacity":7000}`); r.Status() != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "alice", `{"reserved":100,"hard_limit":2000}`); r.Status() != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	eff, err := p.EffectiveConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c, ok := eff.Throttle.Capacity.Finite(); !ok || c != 7000 {
		t.Errorf("capacity %s, want the runtime 7000", eff.Throttle.Capacity)
	}
	b := eff.Bucket("alice")
	if b == nil {
		t.Fatal("no bucket alice")
	}
	alice := b.Throttle
	if r, _ := alice.Reserved.Finite(); r != 100 {
		t.Errorf("alice reserved %s, want 100", alice.Reserved)
	}
	if h, ok := alice.HardLimit.Finite(); !ok || h != 2000 {
		t.Errorf("alice hard limit %s, want 2000", alice.HardLimit)
	}
	if len(eff.Buckets) != 3 || len(eff.Users) != 3 {
		t.Errorf("%d buckets and %d users, want 3 and 3", len(eff.Buckets), len(eff.Users))
	}
	// The copy is the caller's: changing it changes nothing in force.
	eff.Buckets[0].Name = "changed"
	again, err := p.EffectiveConfig()
	if err != nil {
		t.Fatal(err)
	}
	if again.Buckets[0].Name == "changed" {
		t.Error("EffectiveConfig shares its buckets with the caller")
	}
}
