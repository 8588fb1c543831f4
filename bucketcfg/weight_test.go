package bucketcfg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// Bucket weights and throttle.free_pool (DESIGN.md section 13).

func TestParseWeightAndFreePool(t *testing.T) {
	cfg := mustParse(t, `
[proxy]
default_bucket = ""
[throttle]
free_pool = "fcfs"
[[bucket]]
name = "a"
[[bucket]]
name = "b"
weight = 3
[[bucket]]
name = "c"
weight = 10000
`)
	if cfg.Throttle.FreePool != throttle.FreePoolFCFS {
		t.Errorf("free_pool %v, want fcfs", cfg.Throttle.FreePool)
	}
	for name, want := range map[string]struct {
		w   int
		set bool
	}{"a": {1, false}, "b": {3, true}, "c": {10000, true}} {
		b := cfg.Bucket(name)
		if b.Weight != want.w || b.WeightSet != want.set {
			t.Errorf("bucket %s: weight %d (set %v), want %d (set %v)", name, b.Weight, b.WeightSet, want.w, want.set)
		}
	}
	// The defaults: fcfs, and weight 1 for the implicit "default" bucket.
	def := mustParse(t, ``)
	if def.Throttle.FreePool != throttle.FreePoolFCFS || def.Bucket("default").Weight != 1 {
		t.Errorf("defaults: free_pool %v, weight %d", def.Throttle.FreePool, def.Bucket("default").Weight)
	}
	if got := FreePoolModes(); len(got) != 2 || got[0] != throttle.FreePoolFCFS || got[1] != throttle.FreePoolFair {
		t.Errorf("FreePoolModes() = %v, want [fcfs fair]", got)
	}
	if fair := mustParse(t, "[throttle]\nfree_pool = \"fair\""); fair.Throttle.FreePool != throttle.FreePoolFair {
		t.Errorf("free_pool = \"fair\" parsed as %v", fair.Throttle.FreePool)
	}
}

func TestParseWeightAndFreePoolRejects(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{`[throttle]` + "\n" + `free_pool = "FCFS"`, `throttle.free_pool: unknown value "FCFS" (known: "fcfs" or "fair")`},
		{`[throttle]` + "\n" + `free_pool = ""`, `throttle.free_pool: unknown value ""`},
		{`[throttle]` + "\n" + `free_pool = 1`, `free_pool`},
		{"[[bucket]]\nname = \"b\"\nweight = 0", `bucket "b": weight: must be an integer from 1 to 10000, got 0`},
		{"[[bucket]]\nname = \"b\"\nweight = -2", `bucket "b": weight: must be an integer from 1 to 10000, got -2`},
		{"[[bucket]]\nname = \"b\"\nweight = 10001", `bucket "b": weight: must be an integer from 1 to 10000, got 10001`},
		{"[[bucket]]\nname = \"b\"\nweight = 1.5", `bucket "b": weight: must be an integer from 1 to 10000, got 1.5`},
		{"[[bucket]]\nname = \"b\"\nweight = \"2\"", `bucket "b": weight: must be an integer from 1 to 10000, got "2"`},
		{"[[bucket]]\nname = \"b\"\nweight = true", `got true`},
		{"[[bucket]]\nname = \"b\"\nWeight = 2", `bucket.Weight: unknown key`},
	} {
		_, err := Parse([]byte("[proxy]\ndefault_bucket = \"\"\n" + tc.doc))
		if err == nil {
			t.Fatalf("%q: no error", tc.doc)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %q, want it to contain %q", tc.doc, err, tc.want)
		}
	}
}

func TestParseBucketProperties(t *testing.T) {
	for _, tc := range []struct {
		body    string
		want    BucketProperties
		wantErr string
	}{
		{`{"reserved":10,"hard_limit":20,"weight":3}`, BucketProperties{BucketThrottle{10, 20}, 3}, ""},
		{`{"weight":10000}`, BucketProperties{BucketThrottle{throttle.Unlimited, throttle.Unlimited}, 10000}, ""},
		{`{"reserved":10,"hard_limit":20}`, BucketProperties{BucketThrottle{10, 20}, 0}, ""}, // keeps the weight
		{`{}`, BucketProperties{BucketThrottle{throttle.Unlimited, throttle.Unlimited}, 0}, ""},
		{`{"weight":0}`, BucketProperties{}, "weight: must be an integer from 1 to 10000, got 0"},
		{`{"weight":-1}`, BucketProperties{}, "got -1"},
		{`{"weight":10001}`, BucketProperties{}, "got 10001"},
		{`{"weight":1.5}`, BucketProperties{}, "got 1.5"},
		{`{"weight":1.0}`, BucketProperties{}, "got 1.0"},
		{`{"weight":1e2}`, BucketProperties{}, "got 1e2"},
		{`{"weight":"2"}`, BucketProperties{}, `got "2"`},
		{`{"weight":null}`, BucketProperties{}, "got null"},
		{`{"weight":"unlimited"}`, BucketProperties{}, `got "unlimited"`},
		{`{"weight":1,"weight":2}`, BucketProperties{}, `duplicate field "weight"`},
		{`{"Weight":2}`, BucketProperties{}, `unknown field "Weight"`},
		{`{"weight":2,"hard_limit":5}`, BucketProperties{}, "reserved is missing"},
		{`{"weight":2,"reserved":-1}`, BucketProperties{}, "reserved:"},
	} {
		got, err := ParseBucketProperties([]byte(tc.body))
		switch {
		case tc.wantErr == "" && (err != nil || got != tc.want):
			t.Errorf("ParseBucketProperties(%s) = %+v, %v; want %+v", tc.body, got, err, tc.want)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ParseBucketProperties(%s) = %+v, %v; want an error containing %q", tc.body, got, err, tc.wantErr)
		}
	}
	// The limits-only parser does not take a weight.
	if _, err := ParseBucketThrottle([]byte(`{"weight":2}`)); err == nil {
		t.Error(`ParseBucketThrottle({"weight":2}): no error`)
	}
}

// A weight set at run time is persisted, overrides the file's, and is
// independent of the limits; files without weights still load (weight 1
// or the file's).
func TestStateWeights(t *testing.T) {
	cfg := mustParse(t, `
[[bucket]]
name = "default"
[[bucket]]
name = "a"
weight = 4
[[bucket]]
name = "b"
`)
	path := filepath.Join(t.TempDir(), "state.json")
	// An older state file, without weights.
	if err := os.WriteFile(path, []byte(`{"version":1,"buckets":{"a":{"reserved":5,"hard_limit":50}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := LoadState(path)
	if err != nil {
		t.Fatal(err)
	}
	eff, err := Effective(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := eff.Bucket("a"), eff.Bucket("b"); a.Weight != 4 || b.Weight != 1 || a.Throttle != (BucketThrottle{5, 50}) {
		t.Fatalf("old state file: a weight %d %v, b weight %d", a.Weight, a.Throttle, b.Weight)
	}

	next := st.Clone()
	if err := next.SetWeight("b", 7); err != nil {
		t.Fatal(err)
	}
	if err := next.SetWeight("a", 2); err != nil {
		t.Fatal(err)
	}
	for _, w := range []int{0, -1, 10001} {
		if err := next.SetWeight("a", w); err == nil {
			t.Errorf("SetWeight(a, %d): no error", w)
		}
	}
	if err := next.SetWeight("bad name", 2); err == nil {
		t.Error("SetWeight with a bad name: no error")
	}
	if st.Weights["b"] != 0 {
		t.Fatal("Clone shares Weights")
	}
	if err := next.Save(path); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), `"weights": {`) {
		t.Errorf("state file lacks the weights:\n%s", data)
	}
	back, err := LoadState(path)
	if err != nil {
		t.Fatal(err)
	}
	eff, err = Effective(cfg, back)
	if err != nil {
		t.Fatal(err)
	}
	// a: the state's weight over the file's 4; its limits untouched. b:
	// a weight without a limits entry.
	if a, b := eff.Bucket("a"), eff.Bucket("b"); a.Weight != 2 || b.Weight != 7 || a.Throttle != (BucketThrottle{5, 50}) || b.Throttle != (BucketThrottle{0, throttle.Unlimited}) {
		t.Fatalf("after reload: a %d %v, b %d %v", a.Weight, a.Throttle, b.Weight, b.Throttle)
	}
	// Effective starts from the file's weights each time.
	if again, err := Effective(eff, NewState()); err != nil || again.Bucket("a").Weight != 4 || again.Bucket("b").Weight != 1 {
		t.Fatalf("Effective(eff, empty) weights %d %d, %v", again.Bucket("a").Weight, again.Bucket("b").Weight, err)
	}
	// A state without weights writes no "weights" key (older proxies read it).
	empty := filepath.Join(t.TempDir(), "s.json")
	if err := NewState().Save(empty); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(empty); strings.Contains(string(data), "weights") {
		t.Errorf("empty state writes weights:\n%s", data)
	}
	// Invalid weights in a state file are refused.
	for _, doc := range []string{
		`{"version":1,"buckets":{},"weights":{"a":0}}`,
		`{"version":1,"buckets":{},"weights":{"a":10001}}`,
		`{"version":1,"buckets":{},"weights":{"a":1.5}}`,
		`{"version":1,"buckets":{},"weights":{"bad name":2}}`,
	} {
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadState(path); err == nil {
			t.Errorf("LoadState(%s): no error", doc)
		}
	}
}
