package bucketcfg

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestLimitZeroValue(t *testing.T) {
	var l Limit
	if l.IsUnlimited() || l.Units() != 0 || l.String() != "0" {
		t.Fatalf("zero Limit = %v (unlimited=%v units=%d), want finite 0", l, l.IsUnlimited(), l.Units())
	}
	if l != UnitsPerSecond(0) {
		t.Fatal("zero Limit != UnitsPerSecond(0)")
	}
}

func TestLimitMethods(t *testing.T) {
	u := Unlimited()
	if !u.IsUnlimited() || u.Units() != math.MaxInt64 || u.String() != "unlimited" {
		t.Fatalf("Unlimited() = %v units=%d", u, u.Units())
	}
	if n, ok := u.Finite(); ok || n != 0 {
		t.Fatalf("Unlimited().Finite() = %d, %v", n, ok)
	}
	f := UnitsPerSecond(42)
	if f.IsUnlimited() || f.Units() != 42 || f.String() != "42" {
		t.Fatalf("UnitsPerSecond(42) = %v", f)
	}
	if n, ok := f.Finite(); !ok || n != 42 {
		t.Fatalf("Finite() = %d, %v", n, ok)
	}
	cases := []struct {
		a, b Limit
		le   bool
	}{
		{UnitsPerSecond(1), UnitsPerSecond(2), true},
		{UnitsPerSecond(2), UnitsPerSecond(2), true},
		{UnitsPerSecond(3), UnitsPerSecond(2), false},
		{UnitsPerSecond(MaxUnits), Unlimited(), true},
		{Unlimited(), UnitsPerSecond(MaxUnits), false},
		{Unlimited(), Unlimited(), true},
	}
	for _, c := range cases {
		if got := c.a.LessOrEqual(c.b); got != c.le {
			t.Errorf("%v.LessOrEqual(%v) = %v, want %v", c.a, c.b, got, c.le)
		}
	}
}

func TestNewLimitRange(t *testing.T) {
	for _, n := range []int64{-1, MaxUnits + 1, math.MinInt64, math.MaxInt64} {
		if _, err := NewLimit(n); err == nil {
			t.Errorf("NewLimit(%d) accepted", n)
		}
	}
	for _, n := range []int64{0, 1, MaxUnits} {
		if l, err := NewLimit(n); err != nil || l.Units() != n {
			t.Errorf("NewLimit(%d) = %v, %v", n, l, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("UnitsPerSecond(-1) did not panic")
		}
	}()
	UnitsPerSecond(-1)
}

func TestParseLimit(t *testing.T) {
	good := map[string]Limit{"0": UnitsPerSecond(0), "25000": UnitsPerSecond(25000), "unlimited": Unlimited()}
	for in, want := range good {
		if got, err := ParseLimit(in); err != nil || got != want {
			t.Errorf("ParseLimit(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "+1", "1.5", "Unlimited", "lots", " 1", "99999999999999999999", "1000000001"} {
		if _, err := ParseLimit(in); err == nil {
			t.Errorf("ParseLimit(%q) accepted", in)
		}
	}
}

func TestLimitJSON(t *testing.T) {
	cases := []struct {
		in      string
		want    Limit
		wantErr string // substring; "" = success
	}{
		{`0`, UnitsPerSecond(0), ""},
		{`25000`, UnitsPerSecond(25000), ""},
		{`1000000000`, UnitsPerSecond(MaxUnits), ""},
		{`"unlimited"`, Unlimited(), ""},
		{`"unlim\u0069ted"`, Unlimited(), ""}, // JSON escapes are decoded first
		{`"Unlimited"`, Limit{}, `got "Unlimited"`},
		{`"lots"`, Limit{}, `must be a non-negative integer or "unlimited", got "lots"`},
		{`""`, Limit{}, `got ""`},
		{`"100"`, Limit{}, `got "100"`},
		{`-1`, Limit{}, `got -1`},
		{`-0`, Limit{}, `got -0`},
		{`1.5`, Limit{}, `got 1.5`},
		{`1.0`, Limit{}, `got 1.0`},
		{`1e3`, Limit{}, `got 1e3`},
		{`1000000001`, Limit{}, `must be at most 1000000000`},
		{`99999999999999999999999`, Limit{}, `must be at most`},
		{`true`, Limit{}, `got true`},
		{`false`, Limit{}, `got false`},
		{`null`, Limit{}, `got null`},
		{`[1]`, Limit{}, `got an array`},
		{`{"a":1}`, Limit{}, `got an object`},
		{`"` + strings.Repeat("x", 500) + `"`, Limit{}, `"...`},
	}
	for _, c := range cases {
		var l Limit
		err := json.Unmarshal([]byte(c.in), &l)
		if c.wantErr == "" {
			if err != nil || l != c.want {
				t.Errorf("Unmarshal(%s) = %v, %v; want %v", c.in, l, err, c.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("Unmarshal(%s) error = %v; want it to contain %q", c.in, err, c.wantErr)
		}
		if err != nil && len(err.Error()) > 100 {
			t.Errorf("Unmarshal(%.20s...) error is %d bytes long, want a short reason", c.in, len(err.Error()))
		}
	}
}

func TestLimitJSONRoundTrip(t *testing.T) {
	for _, l := range []Limit{UnitsPerSecond(0), UnitsPerSecond(7), UnitsPerSecond(MaxUnits), Unlimited()} {
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		var back Limit
		if err := json.Unmarshal(b, &back); err != nil || back != l {
			t.Errorf("round trip of %v via %s = %v, %v", l, b, back, err)
		}
	}
	if b, _ := json.Marshal(Unlimited()); string(b) != `"unlimited"` {
		t.Errorf("Marshal(Unlimited()) = %s", b)
	}
}

func TestLimitTOML(t *testing.T) {
	type doc struct {
		L Limit `toml:"l"`
	}
	cases := []struct {
		in      string
		want    Limit
		wantErr string
	}{
		{`l = 0`, UnitsPerSecond(0), ""},
		{`l = 25_000`, UnitsPerSecond(25000), ""},
		{`l = "unlimited"`, Unlimited(), ""},
		{`l = "lots"`, Limit{}, `got "lots"`},
		{`l = -5`, Limit{}, `got -5`},
		{`l = 1.5`, Limit{}, `got 1.5`},
		{`l = true`, Limit{}, `got true`},
		{`l = [1]`, Limit{}, `got an array`},
		{`l = {a = 1}`, Limit{}, `got a table`},
		{`l = 1979-05-27`, Limit{}, `got a date/time`},
		{`l = 2000000000`, Limit{}, `must be at most`},
	}
	for _, c := range cases {
		var d doc
		_, err := toml.Decode(c.in, &d)
		if c.wantErr == "" {
			if err != nil || d.L != c.want {
				t.Errorf("Decode(%s) = %v, %v; want %v", c.in, d.L, err, c.want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("Decode(%s) error = %v; want it to contain %q", c.in, err, c.wantErr)
		}
	}
	var sb strings.Builder
	if err := toml.NewEncoder(&sb).Encode(map[string]Limit{"a": Unlimited(), "b": UnitsPerSecond(3)}); err != nil {
		t.Fatal(err)
	}
	var back map[string]Limit
	if _, err := toml.Decode(sb.String(), &back); err != nil || back["a"] != Unlimited() || back["b"] != UnitsPerSecond(3) {
		t.Errorf("TOML round trip via %q = %v, %v", sb.String(), back, err)
	}
}
