package bucketcfg

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/throttle"
)

func TestParseBucketThrottle(t *testing.T) {
	unl := throttle.Unlimited
	cases := []struct {
		name    string
		body    string
		want    BucketThrottle
		wantErr string // substring; "" = success
	}{
		{"both numbers", `{"reserved": 100, "hard_limit": 1000}`, BucketThrottle{lim(100), lim(1000)}, ""},
		{"equal", `{"reserved": 5, "hard_limit": 5}`, BucketThrottle{lim(5), lim(5)}, ""},
		{"zeros", `{"reserved":0,"hard_limit":0}`, BucketThrottle{lim(0), lim(0)}, ""},
		{"unlimited hard", `{"reserved": 100, "hard_limit": "unlimited"}`, BucketThrottle{lim(100), unl}, ""},
		{"both unlimited", `{"reserved": "unlimited", "hard_limit": "unlimited"}`, BucketThrottle{unl, unl}, ""},
		{"empty object", `{}`, BucketThrottle{unl, unl}, ""},
		{"missing hard", `{"reserved": 10}`, BucketThrottle{lim(10), unl}, ""},
		{"white space", " \n\t{ \"reserved\" : 1 }\r\n ", BucketThrottle{lim(1), unl}, ""},
		{"field order", `{"hard_limit": 9, "reserved": 3}`, BucketThrottle{lim(3), lim(9)}, ""},
		{"max", `{"reserved": 1000000000, "hard_limit": 1000000000}`, BucketThrottle{lim(throttle.MaxUnits), lim(throttle.MaxUnits)}, ""},

		{"missing reserved", `{"hard_limit": 100}`, BucketThrottle{}, `reserved is missing, which means "unlimited", and that exceeds hard_limit 100`},
		{"reserved over hard", `{"reserved": 200, "hard_limit": 100}`, BucketThrottle{}, "reserved 200 exceeds hard_limit 100"},
		{"unlimited reserved finite hard", `{"reserved": "unlimited", "hard_limit": 1}`, BucketThrottle{}, "reserved unlimited exceeds hard_limit 1"},
		{"other string", `{"reserved": "lots"}`, BucketThrottle{}, `reserved: must be a non-negative integer or "unlimited", got "lots"`},
		{"capitalised unlimited", `{"hard_limit": "Unlimited"}`, BucketThrottle{}, `hard_limit: must be a non-negative integer or "unlimited", got "Unlimited"`},
		{"numeric string", `{"reserved": "5"}`, BucketThrottle{}, `reserved: must be a non-negative integer or "unlimited", got "5"`},
		{"negative", `{"reserved": -1, "hard_limit": 10}`, BucketThrottle{}, "reserved: must be a non-negative integer or \"unlimited\", got -1"},
		{"negative hard", `{"hard_limit": -10}`, BucketThrottle{}, "hard_limit: must be a non-negative integer or \"unlimited\", got -10"},
		{"fraction", `{"reserved": 1.5}`, BucketThrottle{}, "reserved: must be a non-negative integer or \"unlimited\", got 1.5"},
		{"exponent", `{"hard_limit": 1e3}`, BucketThrottle{}, "hard_limit: must be a non-negative integer or \"unlimited\", got 1e3"},
		{"too large", `{"hard_limit": 1000000001}`, BucketThrottle{}, "hard_limit: must be at most 1000000000"},
		{"huge", `{"hard_limit": 123456789012345678901234567890}`, BucketThrottle{}, "hard_limit: must be at most"},
		{"bool", `{"reserved": true}`, BucketThrottle{}, "reserved: must be a non-negative integer or \"unlimited\", got true"},
		{"null", `{"reserved": null}`, BucketThrottle{}, "reserved: must be a non-negative integer or \"unlimited\", got null"},
		{"array", `{"reserved": [1]}`, BucketThrottle{}, "got an array"},
		{"object value", `{"reserved": {}}`, BucketThrottle{}, "got an object"},
		{"unknown field", `{"reserved": 1, "burst": 2}`, BucketThrottle{}, `unknown field "burst"`},
		{"case variant", `{"Reserved": 1}`, BucketThrottle{}, `unknown field "Reserved"`},
		{"duplicate", `{"reserved": 1, "reserved": "unlimited"}`, BucketThrottle{}, `duplicate field "reserved"`},
		{"empty", ``, BucketThrottle{}, "empty body"},
		{"blank", "  \n", BucketThrottle{}, "empty body"},
		{"null body", `null`, BucketThrottle{}, "body must be a JSON object"},
		{"array body", `[{"reserved": 1}]`, BucketThrottle{}, "body must be a JSON object"},
		{"number body", `5`, BucketThrottle{}, "body must be a JSON object"},
		{"truncated", `{"reserved": 1`, BucketThrottle{}, "invalid JSON"},
		{"bad JSON", `{"reserved": 1,}`, BucketThrottle{}, "invalid JSON"},
		{"single quotes", `{'reserved': 1}`, BucketThrottle{}, "invalid JSON"},
		{"trailing garbage", `{"reserved": 1} x`, BucketThrottle{}, "unexpected data after the object"},
		{"two objects", `{}{}`, BucketThrottle{}, "unexpected data after the object"},
		{"too big", `{"reserved": 1` + strings.Repeat(" ", MaxAdminBodyBytes) + `}`, BucketThrottle{}, "body too large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseBucketThrottle([]byte(c.body))
			if c.wantErr == "" {
				if err != nil || got != c.want {
					t.Fatalf("ParseBucketThrottle(%q) = %v, %v; want %v", c.body, got, err, c.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseBucketThrottle(%q) = %v, want an error containing %q", c.body, got, c.wantErr)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("ParseBucketThrottle(%q) error = %q, want it to contain %q", c.body, err, c.wantErr)
			}
			if len(err.Error()) > 160 {
				t.Errorf("reason is %d bytes; reasons go into a memcached response and must stay short", len(err.Error()))
			}
		})
	}
}

func TestParseBucketThrottleBodySizeBoundary(t *testing.T) {
	body := `{"reserved": 1}`
	body += strings.Repeat(" ", MaxAdminBodyBytes-len(body))
	if _, err := ParseBucketThrottle([]byte(body)); err != nil {
		t.Fatalf("body of exactly %d bytes rejected: %v", len(body), err)
	}
	if _, err := ParseBucketThrottle([]byte(body + " ")); err == nil {
		t.Fatalf("body of %d bytes accepted", len(body)+1)
	}
}

func TestBucketThrottleJSONRoundTrip(t *testing.T) {
	for _, bt := range []BucketThrottle{{lim(0), lim(0)}, {lim(5), throttle.Unlimited}, {throttle.Unlimited, throttle.Unlimited}} {
		b, err := json.Marshal(bt)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseBucketThrottle(b)
		if err != nil || got != bt {
			t.Errorf("round trip of %v via %s = %v, %v", bt, b, got, err)
		}
	}
}

func TestParseNodeThrottle(t *testing.T) {
	unl := throttle.Unlimited
	type want struct {
		capacity *throttle.Limit
		defaults *BucketThrottle
	}
	lp := func(l throttle.Limit) *throttle.Limit { return &l }
	cases := []struct {
		name    string
		body    string
		want    want
		wantErr string
	}{
		{"empty object is a no-op", `{}`, want{}, ""},
		{"capacity only", `{"capacity": 25000}`, want{capacity: lp(lim(25000))}, ""},
		{"capacity unlimited", `{"capacity": "unlimited"}`, want{capacity: lp(unl)}, ""},
		{"capacity zero", `{"capacity": 0}`, want{capacity: lp(lim(0))}, ""},
		{"defaults only", `{"default_throttle_reserved_units": 10, "default_throttle_hard_limit": "unlimited"}`,
			want{defaults: &BucketThrottle{lim(10), unl}}, ""},
		{"all", `{"capacity": 100, "default_throttle_reserved_units": 0, "default_throttle_hard_limit": 50}`,
			want{capacity: lp(lim(100)), defaults: &BucketThrottle{lim(0), lim(50)}}, ""},
		{"defaults equal", `{"default_throttle_reserved_units": 7, "default_throttle_hard_limit": 7}`,
			want{defaults: &BucketThrottle{lim(7), lim(7)}}, ""},

		{"only reserved default", `{"default_throttle_reserved_units": 10}`, want{}, "must be given together"},
		{"only hard default", `{"capacity": 1, "default_throttle_hard_limit": 10}`, want{}, "must be given together"},
		{"defaults reversed", `{"default_throttle_reserved_units": 20, "default_throttle_hard_limit": 10}`, want{},
			"default_throttle_reserved_units 20 exceeds default_throttle_hard_limit 10"},
		{"capacity string", `{"capacity": "lots"}`, want{}, `capacity: must be a non-negative integer or "unlimited", got "lots"`},
		{"capacity negative", `{"capacity": -1}`, want{}, "capacity: must be a non-negative integer"},
		{"capacity fraction", `{"capacity": 1.5}`, want{}, "capacity: must be a non-negative integer or \"unlimited\", got 1.5"},
		{"capacity null", `{"capacity": null}`, want{}, "capacity: must be a non-negative integer or \"unlimited\", got null"},
		{"default bad type", `{"default_throttle_reserved_units": false, "default_throttle_hard_limit": 1}`, want{},
			"default_throttle_reserved_units: must be a non-negative integer"},
		{"unknown field", `{"capacity": 1, "reserved": 1}`, want{}, `unknown field "reserved"`},
		{"duplicate", `{"capacity": 1, "capacity": 2}`, want{}, `duplicate field "capacity"`},
		{"not an object", `"capacity"`, want{}, "body must be a JSON object"},
		{"bad JSON", `{"capacity" 1}`, want{}, "invalid JSON"},
		{"trailing", `{"capacity": 1}}`, want{}, "unexpected data after the object"},
		{"empty", ``, want{}, "empty body"},
		{"too big", `{"capacity": 1` + strings.Repeat("\t", MaxAdminBodyBytes) + `}`, want{}, "body too large"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseNodeThrottle([]byte(c.body))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ParseNodeThrottle(%q) = %+v, %v; want error containing %q", c.body, got, err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseNodeThrottle(%q): %v", c.body, err)
			}
			if (got.Capacity == nil) != (c.want.capacity == nil) || (got.Capacity != nil && *got.Capacity != *c.want.capacity) {
				t.Errorf("Capacity = %v, want %v", got.Capacity, c.want.capacity)
			}
			if (got.Defaults == nil) != (c.want.defaults == nil) || (got.Defaults != nil && *got.Defaults != *c.want.defaults) {
				t.Errorf("Defaults = %v, want %v", got.Defaults, c.want.defaults)
			}
			if got.IsEmpty() != (c.want.capacity == nil && c.want.defaults == nil) {
				t.Errorf("IsEmpty() = %v", got.IsEmpty())
			}
		})
	}
}

func TestNodeThrottleMarshalJSON(t *testing.T) {
	c := throttle.Unlimited
	cases := []struct {
		nt   NodeThrottle
		want string
	}{
		{NodeThrottle{}, `{}`},
		{NodeThrottle{Capacity: &c}, `{"capacity":"unlimited"}`},
		{NodeThrottle{Defaults: &BucketThrottle{lim(1), lim(2)}}, `{"default_throttle_reserved_units":1,"default_throttle_hard_limit":2}`},
	}
	for _, tc := range cases {
		b, err := json.Marshal(tc.nt)
		if err != nil || string(b) != tc.want {
			t.Errorf("Marshal(%+v) = %s, %v; want %s", tc.nt, b, err, tc.want)
		}
		back, err := ParseNodeThrottle(b)
		if err != nil {
			t.Fatalf("ParseNodeThrottle(%s): %v", b, err)
		}
		b2, _ := json.Marshal(back)
		if string(b2) != string(b) {
			t.Errorf("round trip %s -> %s", b, b2)
		}
	}
}
