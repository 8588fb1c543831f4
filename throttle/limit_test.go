package throttle

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/BurntSushi/toml"
)

func TestLimitZeroValue(t *testing.T) {
	var l Limit
	if n, ok := l.Finite(); l.IsUnlimited() || !ok || n != 0 || l.String() != "0" {
		t.Fatalf("zero Limit = %v (unlimited=%v units=%d), want finite 0", l, l.IsUnlimited(), n)
	}
}

func TestLimitMethods(t *testing.T) {
	u := Unlimited
	if !u.IsUnlimited() || !math.IsInf(u.Float64(), 1) || u.String() != "unlimited" {
		t.Fatalf("Unlimited = %v float=%v", u, u.Float64())
	}
	if n, ok := u.Finite(); ok || n != 0 {
		t.Fatalf("Unlimited.Finite() = %d, %v", n, ok)
	}
	f := Limit(42)
	if f.IsUnlimited() || f.Float64() != 42 || f.String() != "42" {
		t.Fatalf("Limit(42) = %v", f)
	}
	if n, ok := f.Finite(); !ok || n != 42 {
		t.Fatalf("Finite() = %d, %v", n, ok)
	}
	cases := []struct {
		a, b Limit
		le   bool
	}{
		{Limit(1), Limit(2), true},
		{Limit(2), Limit(2), true},
		{Limit(3), Limit(2), false},
		{Limit(MaxUnits), Unlimited, true},
		{Unlimited, Limit(MaxUnits), false},
		{Unlimited, Unlimited, true},
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
		if l, err := NewLimit(n); err != nil || int64(l) != n {
			t.Errorf("NewLimit(%d) = %v, %v", n, l, err)
		}
	}
}

func TestParseLimit(t *testing.T) {
	good := map[string]Limit{"0": Limit(0), "25000": Limit(25000), "unlimited": Unlimited}
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
		{`0`, Limit(0), ""},
		{`25000`, Limit(25000), ""},
		{`1000000000`, Limit(MaxUnits), ""},
		{`"unlimited"`, Unlimited, ""},
		{`"unlim\u0069ted"`, Unlimited, ""}, // JSON escapes are decoded first
		{`"Unlimited"`, Limit(0), `got "Unlimited"`},
		{`"lots"`, Limit(0), `must be a non-negative integer or "unlimited", got "lots"`},
		{`""`, Limit(0), `got ""`},
		{`"100"`, Limit(0), `got "100"`},
		{`-1`, Limit(0), `got -1`},
		{`-0`, Limit(0), `got -0`},
		{`1.5`, Limit(0), `got 1.5`},
		{`1.0`, Limit(0), `got 1.0`},
		{`1e3`, Limit(0), `got 1e3`},
		{`1000000001`, Limit(0), `must be at most 1000000000`},
		{`99999999999999999999999`, Limit(0), `must be at most`},
		{`true`, Limit(0), `got true`},
		{`false`, Limit(0), `got false`},
		{`null`, Limit(0), `got null`},
		{`[1]`, Limit(0), `got an array`},
		{`{"a":1}`, Limit(0), `got an object`},
		{`"` + strings.Repeat("x", 500) + `"`, Limit(0), `"...`},
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
		if err != nil && !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("Unmarshal(%s) error %v does not wrap ErrInvalidLimit", c.in, err)
		}
		if err != nil && len(err.Error()) > 100 {
			t.Errorf("Unmarshal(%.20s...) error is %d bytes long, want a short reason", c.in, len(err.Error()))
		}
	}
}

func TestLimitJSONRoundTrip(t *testing.T) {
	for _, l := range []Limit{Limit(0), Limit(7), Limit(MaxUnits), Unlimited} {
		b, err := json.Marshal(l)
		if err != nil {
			t.Fatal(err)
		}
		var back Limit
		if err := json.Unmarshal(b, &back); err != nil || back != l {
			t.Errorf("round trip of %v via %s = %v, %v", l, b, back, err)
		}
	}
	if b, _ := json.Marshal(Unlimited); string(b) != `"unlimited"` {
		t.Errorf("Marshal(Unlimited) = %s", b)
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
		{`l = 0`, Limit(0), ""},
		{`l = 25_000`, Limit(25000), ""},
		{`l = "unlimited"`, Unlimited, ""},
		{`l = "lots"`, Limit(0), `got "lots"`},
		{`l = -5`, Limit(0), `got -5`},
		{`l = 1.5`, Limit(0), `got 1.5`},
		{`l = true`, Limit(0), `got true`},
		{`l = [1]`, Limit(0), `got an array`},
		{`l = {a = 1}`, Limit(0), `got a table`},
		{`l = 1979-05-27`, Limit(0), `got a date/time`},
		{`l = 2000000000`, Limit(0), `must be at most`},
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
	if err := toml.NewEncoder(&sb).Encode(map[string]Limit{"a": Unlimited, "b": Limit(3)}); err != nil {
		t.Fatal(err)
	}
	var back map[string]Limit
	if _, err := toml.Decode(sb.String(), &back); err != nil || back["a"] != Unlimited || back["b"] != Limit(3) {
		t.Errorf("TOML round trip via %q = %v, %v", sb.String(), back, err)
	}
}

// The text form is ParseLimit's, and every encoder refuses a Limit that its
// decoder would not take back.
func TestLimitText(t *testing.T) {
	for _, l := range []Limit{0, 7, Limit(MaxUnits), Unlimited} {
		b, err := l.MarshalText()
		if err != nil || string(b) != l.String() {
			t.Errorf("%v.MarshalText() = %q, %v", l, b, err)
		}
		var back Limit
		if err := back.UnmarshalText(b); err != nil || back != l {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", b, back, err, l)
		}
	}
	var l Limit
	for _, in := range []string{"1.5", "-1", "", "Unlimited", "1000000001"} {
		if err := l.UnmarshalText([]byte(in)); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("UnmarshalText(%q) = %v, want an error wrapping ErrInvalidLimit", in, err)
		}
	}
	for _, bad := range []Limit{-2, math.MinInt64, Limit(MaxUnits + 1), math.MaxInt64} {
		if _, err := bad.MarshalText(); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("Limit(%d).MarshalText() error = %v, want ErrInvalidLimit", int64(bad), err)
		}
		if b, err := json.Marshal(bad); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("json.Marshal(Limit(%d)) = %s, %v; want an error wrapping ErrInvalidLimit", int64(bad), b, err)
		}
		if _, err := bad.MarshalTOML(); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("Limit(%d).MarshalTOML() error = %v, want ErrInvalidLimit", int64(bad), err)
		}
	}
}
