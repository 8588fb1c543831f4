package mcclient

import (
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// bucketKV returns the keys every bucket b reports, with units_per_sec ups.
func bucketKV(b, ups string) [][2]string {
	var kv [][2]string
	for _, f := range [][2]string{
		{"reserved", "1000"}, {"hard_limit", "3000"}, {"units_per_sec", ups}, {"units_total", "10"},
		{"read_units_total", "6"}, {"write_units_total", "4"}, {"commands_total", "5"},
		{"throttled_total", "1"}, {"rejected_total", "0"}, {"held_sessions", "0"}, {"connections", "2"},
	} {
		kv = append(kv, [2]string{"bucket:" + b + ":" + f[0], f[1]})
	}
	return kv
}

// fleetKV is a fleet-mode answer: two buckets, web's fleet usage known,
// batch's not yet.
func fleetKV() [][2]string {
	kv := [][2]string{
		{"node:capacity", "12000"}, {"node:free_pool", "8000"},
		{"fleet:instance", "proxy-b:11211"}, {"fleet:store_up", "false"}, {"fleet:fallback", "true"},
		{"fleet:instances", "3"}, {"node:local_capacity", "4000"}, {"node:local_free_pool", "unlimited"},
	}
	kv = append(kv, bucketKV("web", "900")...)
	kv = append(kv, [2]string{"bucket:web:local_reserved", "333"}, [2]string{"bucket:web:local_hard_limit", "1000"},
		[2]string{"bucket:web:fleet_units_per_sec", "2950"})
	kv = append(kv, bucketKV("batch", "0")...)
	kv = append(kv, [2]string{"bucket:batch:local_reserved", "0"}, [2]string{"bucket:batch:local_hard_limit", "unlimited"})
	return kv
}

func TestParseThrottleStatsFleet(t *testing.T) {
	ts, err := ParseThrottleStats(append(fleetKV(), [2]string{"fleet:future", "x"}))
	if err != nil {
		t.Fatal(err)
	}
	want := FleetStats{Instance: "proxy-b:11211", StoreUp: false, Fallback: true, Instances: 3,
		LocalCapacity: 4000, LocalFreePool: throttle.Unlimited}
	if ts.Fleet == nil || *ts.Fleet != want {
		t.Fatalf("fleet %+v, want %+v", ts.Fleet, want)
	}
	if ts.Node.Capacity != 12000 || ts.Node.FreePool != 8000 {
		t.Fatalf("node %+v: want the fleet's limits", ts.Node)
	}
	web, _ := ts.Bucket("web")
	if web.Reserved != 1000 || web.HardLimit != 3000 || web.UnitsPerSec != 900 ||
		web.LocalReserved != 333 || web.LocalHardLimit != 1000 || !web.HasFleetUnits || web.FleetUnitsPerSec != 2950 {
		t.Fatalf("web %+v", web)
	}
	batch, _ := ts.Bucket("batch")
	if batch.LocalReserved != 0 || !batch.LocalHardLimit.IsUnlimited() || batch.HasFleetUnits || batch.FleetUnitsPerSec != 0 {
		t.Fatalf("batch %+v", batch)
	}

	// Single instance: no fleet part.
	single := append([][2]string{{"node:capacity", "1"}, {"node:free_pool", "1"}}, bucketKV("web", "1")...)
	if ts, err := ParseThrottleStats(single); err != nil || ts.Fleet != nil || ts.Buckets[0].HasFleetUnits {
		t.Fatalf("single instance: %+v, %v", ts, err)
	}
}

func TestParseThrottleStatsFleetErrors(t *testing.T) {
	// with returns fleetKV with key set to val; without, with key removed.
	edit := func(key, val string, drop bool) [][2]string {
		var kv [][2]string
		for _, p := range fleetKV() {
			if p[0] == key {
				if drop {
					continue
				}
				p[1] = val
			}
			kv = append(kv, p)
		}
		return kv
	}
	with := func(key, val string) [][2]string { return edit(key, val, false) }
	without := func(key string) [][2]string { return edit(key, "", true) }
	single := append([][2]string{{"node:capacity", "1"}, {"node:free_pool", "1"}}, bucketKV("web", "1")...)
	for name, tc := range map[string]struct {
		kv   [][2]string
		want string
	}{
		"bad store_up":          {with("fleet:store_up", "yes"), "fleet:store_up"},
		"bool not spelled out":  {with("fleet:fallback", "1"), "fleet:fallback"},
		"bad instances":         {with("fleet:instances", "-3"), "fleet:instances"},
		"huge instances":        {with("fleet:instances", "99999999999"), "fleet:instances"},
		"empty instance":        {with("fleet:instance", ""), "fleet:instance is empty"},
		"bad local capacity":    {with("node:local_capacity", "lots"), "node:local_capacity"},
		"bad local free pool":   {with("node:local_free_pool", "-1"), "node:local_free_pool"},
		"bad local reserved":    {with("bucket:web:local_reserved", "x"), "local_reserved"},
		"missing local share":   {without("bucket:web:local_hard_limit"), "lacks local_hard_limit"},
		"unlimited fleet units": {with("bucket:web:fleet_units_per_sec", "unlimited"), "fleet_units_per_sec"},
		"missing fleet key":     {without("fleet:instances"), "missing fleet:instances"},
		"missing local key":     {without("node:local_free_pool"), "missing node:local_free_pool"},
		"duplicate fleet key":   {append(fleetKV(), [2]string{"fleet:store_up", "true"}), "duplicate"},
		"duplicate local share": {append(fleetKV(), [2]string{"bucket:batch:local_reserved", "0"}), "duplicate"},
		"fleet field outside fleet mode": {append(single, [2]string{"bucket:web:fleet_units_per_sec", "5"}),
			"without the fleet:* node keys"},
		"local share outside fleet mode": {append(single, [2]string{"bucket:web:local_reserved", "5"}),
			"without the fleet:* node keys"},
	} {
		_, err := ParseThrottleStats(tc.kv)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
}
