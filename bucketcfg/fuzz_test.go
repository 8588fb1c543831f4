package bucketcfg

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// checkLimit fails when l is outside the values a throttle.Limit may hold.
func checkLimit(t *testing.T, what string, l throttle.Limit) {
	t.Helper()
	if n, ok := l.Finite(); ok && (n < 0 || n > throttle.MaxUnits) {
		t.Fatalf("%s = %d, outside [0, %d]", what, n, throttle.MaxUnits)
	}
}

// checkReason fails when err is not a short, printable reason fit for a
// memcached error body.
func checkReason(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if msg == "" || len(msg) > 200 || !utf8.ValidString(msg) {
		t.Fatalf("unfit reason (%d bytes): %q", len(msg), msg)
	}
}

func FuzzParseBucketThrottle(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		bt, err := ParseBucketThrottle(body)
		if err != nil {
			checkReason(t, err)
			return
		}
		if len(body) > MaxAdminBodyBytes {
			t.Fatalf("accepted a %d-byte body", len(body))
		}
		checkLimit(t, "reserved", bt.Reserved)
		checkLimit(t, "hard_limit", bt.HardLimit)
		if err := bt.Validate(); err != nil {
			t.Fatalf("accepted an invalid value %v: %v", bt, err)
		}
		enc, err := json.Marshal(bt)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseBucketThrottle(enc)
		if err != nil || back != bt {
			t.Fatalf("re-parse of %s = %v, %v; want %v", enc, back, err, bt)
		}
	})
}

func FuzzParseNodeThrottle(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		nt, err := ParseNodeThrottle(body)
		if err != nil {
			checkReason(t, err)
			return
		}
		if len(body) > MaxAdminBodyBytes {
			t.Fatalf("accepted a %d-byte body", len(body))
		}
		if nt.Capacity != nil {
			checkLimit(t, "capacity", *nt.Capacity)
		}
		if nt.Defaults != nil {
			checkLimit(t, "default reserved", nt.Defaults.Reserved)
			checkLimit(t, "default hard limit", nt.Defaults.HardLimit)
			if err := nt.Defaults.Validate(); err != nil {
				t.Fatalf("accepted invalid defaults %v: %v", *nt.Defaults, err)
			}
		}
		enc, err := json.Marshal(nt)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseNodeThrottle(enc)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", enc, err)
		}
		enc2, _ := json.Marshal(back)
		if string(enc2) != string(enc) {
			t.Fatalf("round trip %s -> %s", enc, enc2)
		}
		// Applying it to a state keeps the state valid.
		s := NewState()
		if err := s.SetNode(nt, nil); err != nil {
			t.Fatalf("SetNode(%s): %v", enc, err)
		}
		if err := s.Validate(); err != nil {
			t.Fatal(err)
		}
	})
}

func FuzzParseConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			if _, ok := err.(*ConfigError); !ok {
				t.Fatalf("error of type %T, want *ConfigError", err)
			}
			return
		}
		checkConfigInvariants(t, cfg)
		eff, err := Effective(cfg, nil)
		if err != nil {
			t.Fatalf("Effective(cfg, nil): %v", err)
		}
		checkConfigInvariants(t, eff)
	})
}

func checkConfigInvariants(t *testing.T, cfg *Config) {
	t.Helper()
	p, u, th := cfg.Proxy, cfg.Upstream, cfg.Throttle
	if p.MaxConnections < 1 || p.MaxConnections > MaxConnectionsLimit ||
		p.MaxFrameBytes < MinFrameBytes || p.MaxFrameBytes > MaxFrameBytesLimit ||
		p.MaxHeldInputBytes < MinFrameBytes || p.MaxHeldInputBytes > MaxFrameBytesLimit {
		t.Fatalf("proxy bounds violated: %+v", p)
	}
	if err := checkHostPort(p.Listen, true, true); err != nil {
		t.Fatalf("proxy.listen %q: %v", p.Listen, err)
	}
	if len(u.Servers) == 0 || u.Timeout <= 0 || u.Timeout > MaxUpstreamTimeout || u.MaxInflight < 1 || u.MaxInflight > MaxInflightLimit {
		t.Fatalf("upstream bounds violated: %+v", u)
	}
	for _, s := range u.Servers {
		if err := checkHostPort(s, false, false); err != nil {
			t.Fatalf("server %q: %v", s, err)
		}
	}
	checkLimit(t, "capacity", th.Capacity)
	checkLimit(t, "default reserved", th.Defaults.Reserved)
	checkLimit(t, "default hard", th.Defaults.HardLimit)
	if th.Defaults.Validate() != nil || th.ReadUnitSize < 1 || th.WriteUnitSize < 1 || th.StateFile == "" ||
		th.Burst < 0 || th.Burst.Milliseconds() > MaxBurstMS {
		t.Fatalf("throttle bounds violated: %+v", th)
	}
	switch cfg.Log.Format {
	case "json", "console":
	default:
		t.Fatalf("log.format %q", cfg.Log.Format)
	}
	seen := map[string]bool{}
	for i := range cfg.Buckets {
		b := &cfg.Buckets[i]
		if CheckBucketName(b.Name) != nil || seen[b.Name] || cfg.Bucket(b.Name) != b {
			t.Fatalf("bucket %q invalid, duplicate or not indexed", b.Name)
		}
		seen[b.Name] = true
		checkLimit(t, "bucket reserved", b.Throttle.Reserved)
		checkLimit(t, "bucket hard", b.Throttle.HardLimit)
		if b.Throttle.Validate() != nil {
			t.Fatalf("bucket %q: %v", b.Name, b.Throttle)
		}
	}
	if p.DefaultBucket != "" && cfg.Bucket(p.DefaultBucket) == nil {
		t.Fatalf("default_bucket %q undefined", p.DefaultBucket)
	}
	users := map[string]bool{}
	for i := range cfg.Users {
		usr := &cfg.Users[i]
		if usr.Name == "" || users[usr.Name] || cfg.User(usr.Name) != usr || checkHash(string(usr.passwordHash)) != nil {
			t.Fatalf("user %q invalid, duplicate, not indexed or without a usable hash", usr.Name)
		}
		users[usr.Name] = true
		for _, b := range usr.Buckets {
			if b != AllBuckets && cfg.Bucket(b) == nil {
				t.Fatalf("user %q lists undefined bucket %q", usr.Name, b)
			}
		}
		for _, pr := range usr.Privileges {
			if pr != PrivilegeAdmin && pr != PrivilegeUnthrottled {
				t.Fatalf("user %q has privilege %q", usr.Name, pr)
			}
		}
	}
}

// FuzzStateJSON feeds arbitrary bytes to the state file decoder: it must
// not panic, an accepted state must be valid, and it must survive a round
// trip through MarshalJSON unchanged.
func FuzzStateJSON(f *testing.F) {
	f.Add([]byte(`{"version":1,"buckets":{}}`))
	f.Add([]byte(`{"version":1,"capacity":25000,"default_throttle_reserved_units":0,"default_throttle_hard_limit":"unlimited","buckets":{"b":{"reserved":1,"hard_limit":2}},"epochs":{"b":3}}`))
	f.Add([]byte(`{"version":2,"buckets":{}}`))
	f.Add([]byte(`{"version":1,"buckets":{"b":{"reserved":5,"hard_limit":1}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s State
		if err := json.Unmarshal(data, &s); err != nil {
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("accepted an invalid state: %v", err)
		}
		out, err := json.Marshal(s)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		var back State
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("round trip of %s: %v", out, err)
		}
		again, _ := json.Marshal(back)
		if string(again) != string(out) {
			t.Fatalf("round trip changed %s into %s", out, again)
		}
	})
}
