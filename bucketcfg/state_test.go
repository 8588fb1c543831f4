package bucketcfg

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/throttle"
)

func sampleState() *State {
	s := NewState()
	c := throttle.Limit(30000)
	s.Capacity = &c
	s.Defaults = &BucketThrottle{lim(5), throttle.Unlimited}
	s.Buckets["b1"] = BucketThrottle{lim(100), lim(1000)}
	s.Buckets["b2"] = BucketThrottle{throttle.Unlimited, throttle.Unlimited}
	s.Epochs["b1"], s.Epochs["b2"], s.Epochs["old"] = 0, 3, 1
	s.Retired["old"] = true
	return s
}

func TestLoadStateMissingFileIsEmpty(t *testing.T) {
	s, err := LoadState(filepath.Join(t.TempDir(), "absent.json"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Capacity != nil || s.Defaults != nil || s.Buckets == nil || len(s.Buckets) != 0 {
		t.Fatalf("missing file gave %+v, want an empty state", s)
	}
}

func TestStateSaveLoadRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	for _, s := range []*State{NewState(), sampleState()} {
		if err := s.Save(path); err != nil {
			t.Fatal(err)
		}
		got, err := LoadState(path)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, s) {
			t.Fatalf("round trip: got %+v, want %+v", got, s)
		}
	}
	data, _ := os.ReadFile(path)
	for _, want := range []string{`"version": 1`, `"capacity": 30000`, `"default_throttle_reserved_units": 5`,
		`"default_throttle_hard_limit": "unlimited"`, `"b1": {`, `"hard_limit": 1000`, `"old": 1`, `"retired": [`} {
		if !strings.Contains(string(data), want) {
			t.Errorf("state file lacks %s:\n%s", want, data)
		}
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, %v", fi.Mode(), err)
	}
}

func TestLoadStateRejectsCorruptFiles(t *testing.T) {
	cases := map[string]string{
		"empty":             ``,
		"torn":              `{"version": 1, "buckets": {"b1": {"reserved": 1`,
		"not JSON":          `garbage`,
		"no version":        `{"buckets": {}}`,
		"future version":    `{"version": 2, "buckets": {}}`,
		"unknown field":     `{"version": 1, "buckets": {}, "extra": 1}`,
		"one default":       `{"version": 1, "default_throttle_reserved_units": 1}`,
		"defaults reversed": `{"version": 1, "default_throttle_reserved_units": 9, "default_throttle_hard_limit": 1}`,
		"bad capacity":      `{"version": 1, "capacity": "lots"}`,
		"entry incomplete":  `{"version": 1, "buckets": {"b1": {"reserved": 1}}}`,
		"entry reversed":    `{"version": 1, "buckets": {"b1": {"reserved": 2, "hard_limit": 1}}}`,
		"entry bad name":    `{"version": 1, "buckets": {"a b": {"reserved": 1, "hard_limit": 1}}}`,
		"entry unknown key": `{"version": 1, "buckets": {"b1": {"reserved": 1, "hard_limit": 1, "x": 0}}}`,
		"trailing data":     `{"version": 1, "buckets": {}} {}`,
		"array":             `[]`,
		"retired no epoch":  `{"version": 1, "epochs": {"a": 1}, "retired": ["b"]}`,
		"epoch bad name":    `{"version": 1, "epochs": {"a b": 1}}`,
	}
	dir := t.TempDir()
	for name, content := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".json")
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := LoadState(path)
		if err == nil {
			t.Errorf("%s: LoadState accepted %q -> %+v", name, content, s)
			continue
		}
		if !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q does not name the file", name, err)
		}
	}
	// A null capacity or absent buckets map is fine.
	path := filepath.Join(dir, "ok.json")
	os.WriteFile(path, []byte(`{"version": 1, "capacity": null}`), 0o600)
	if s, err := LoadState(path); err != nil || s.Capacity != nil || s.Buckets == nil {
		t.Errorf("LoadState(null capacity) = %+v, %v", s, err)
	}
}

func TestLoadStateDirectoryIsError(t *testing.T) {
	if _, err := LoadState(t.TempDir()); err == nil {
		t.Fatal("LoadState(directory) succeeded")
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// A write that fails half-way must leave the old file untouched and no
// temporary file behind.
func TestSaveFailedWriteKeepsOldFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	old := NewState()
	old.Buckets["b1"] = BucketThrottle{lim(1), lim(2)}
	if err := old.Save(path); err != nil {
		t.Fatal(err)
	}
	before, _ := os.ReadFile(path)

	orig := saveWrite
	t.Cleanup(func() { saveWrite = orig })
	saveWrite = func(f *os.File, data []byte) error {
		f.Write(data[:len(data)/2])
		return errors.New("disk full (simulated)")
	}
	err := sampleState().Save(path)
	if err == nil || !strings.Contains(err.Error(), "disk full") || !strings.Contains(err.Error(), path) {
		t.Fatalf("Save error = %v", err)
	}
	after, _ := os.ReadFile(path)
	if string(after) != string(before) {
		t.Fatalf("old file changed:\n%s\n->\n%s", before, after)
	}
	if names := listDir(t, dir); !reflect.DeepEqual(names, []string{"state.json"}) {
		t.Fatalf("directory holds %v, want only state.json", names)
	}
	got, err := LoadState(path)
	if err != nil || !reflect.DeepEqual(got, old) {
		t.Fatalf("LoadState = %+v, %v; want the old state", got, err)
	}
}

// A crash between writing the temporary file and renaming it (simulated by
// a panic, which skips all cleanup like a real crash) leaves the old state
// complete; the stray temporary file is ignored by LoadState and does not
// disturb later saves.
func TestSaveCrashBeforeRenameLeavesOldOrNew(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	old := NewState()
	old.Buckets["b1"] = BucketThrottle{lim(1), lim(2)}
	if err := old.Save(path); err != nil {
		t.Fatal(err)
	}
	newState := sampleState()

	var tmpSeen string
	t.Cleanup(func() { saveBeforeRename = nil })
	saveBeforeRename = func(tmp string) error {
		tmpSeen = tmp
		panic("simulated crash")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("hook did not run")
			}
		}()
		newState.Save(path)
	}()
	saveBeforeRename = nil

	// The temporary file is complete (it was fsynced) and separate.
	if filepath.Dir(tmpSeen) != dir || !strings.HasPrefix(filepath.Base(tmpSeen), ".state.json.tmp-") {
		t.Fatalf("temporary file %q is not a hidden sibling of %q", tmpSeen, path)
	}
	if _, err := os.Stat(tmpSeen); err != nil {
		t.Fatalf("temporary file should survive a crash: %v", err)
	}
	got, err := LoadState(path)
	if err != nil || !reflect.DeepEqual(got, old) {
		t.Fatalf("after crash LoadState = %+v, %v; want the old state", got, err)
	}
	// What the crash left in the temporary file is the complete new state.
	tmpState, err := LoadState(tmpSeen)
	if err != nil || !reflect.DeepEqual(tmpState, newState) {
		t.Fatalf("temporary file holds %+v, %v", tmpState, err)
	}

	// Restart: the next save replaces the file; the stray file is harmless.
	if err := newState.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err = LoadState(path)
	if err != nil || !reflect.DeepEqual(got, newState) {
		t.Fatalf("after second save LoadState = %+v, %v", got, err)
	}
}

func TestSaveHookErrorCleansUp(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	t.Cleanup(func() { saveBeforeRename = nil })
	saveBeforeRename = func(string) error { return errors.New("injected") }
	if err := sampleState().Save(path); err == nil {
		t.Fatal("Save succeeded")
	}
	if names := listDir(t, dir); len(names) != 0 {
		t.Fatalf("directory holds %v after a failed first save", names)
	}
	if s, err := LoadState(path); err != nil || len(s.Buckets) != 0 {
		t.Fatalf("LoadState = %+v, %v; want empty", s, err)
	}
}

func TestSaveErrors(t *testing.T) {
	if err := NewState().Save(filepath.Join(t.TempDir(), "no", "such", "dir", "s.json")); err == nil {
		t.Error("Save into a missing directory succeeded")
	}
	bad := NewState()
	bad.Buckets["b"] = BucketThrottle{lim(2), lim(1)}
	path := filepath.Join(t.TempDir(), "s.json")
	if err := bad.Save(path); err == nil {
		t.Error("Save of an invalid state succeeded")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Error("invalid state was written")
	}
}

func TestSaveRelativePath(t *testing.T) {
	t.Chdir(t.TempDir())
	if err := sampleState().Save("state.json"); err != nil {
		t.Fatal(err)
	}
	if s, err := LoadState("state.json"); err != nil || !reflect.DeepEqual(s, sampleState()) {
		t.Fatalf("LoadState = %+v, %v", s, err)
	}
}

func TestStateSetBucketAndClone(t *testing.T) {
	s := NewState()
	if err := s.SetBucket("b1", BucketThrottle{lim(1), lim(2)}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetBucket("b1", BucketThrottle{lim(3), lim(2)}); err == nil {
		t.Error("invalid throttle accepted")
	}
	if err := s.SetBucket("bad name", BucketThrottle{}); err == nil {
		t.Error("invalid name accepted")
	}
	if s.Buckets["b1"] != (BucketThrottle{lim(1), lim(2)}) || len(s.Buckets) != 1 {
		t.Errorf("Buckets = %v", s.Buckets)
	}
	orig := sampleState()
	c := orig.Clone()
	if !reflect.DeepEqual(c, orig) {
		t.Fatal("clone differs")
	}
	*c.Capacity = lim(1)
	c.Defaults.Reserved = lim(0)
	c.Buckets["b1"] = BucketThrottle{}
	if !reflect.DeepEqual(orig, sampleState()) {
		t.Fatal("changing the clone changed the original")
	}
	var zero State
	if err := zero.SetBucket("x", BucketThrottle{}); err != nil || len(zero.Buckets) != 1 {
		t.Errorf("SetBucket on zero State: %v", err)
	}
	if err := zero.SetNode(NodeThrottle{Defaults: &BucketThrottle{lim(2), lim(1)}}, nil); err == nil || zero.Defaults != nil {
		t.Errorf("SetNode accepted invalid defaults")
	}
}

const effectiveTOML = `
[throttle]
capacity = 1000
default_throttle_reserved_units = 10
default_throttle_hard_limit = 100
[[bucket]]
name = "default"
[[bucket]]
name = "explicit"
reserved = 20
hard_limit = 200
[[bucket]]
name = "res_only"
reserved = 30
[[bucket]]
name = "hard_only"
hard_limit = 300
`

func bucketThrottles(cfg *Config) map[string]BucketThrottle {
	m := map[string]BucketThrottle{}
	for _, b := range cfg.Buckets {
		m[b.Name] = b.Throttle
	}
	return m
}

func TestEffective(t *testing.T) {
	cfg := mustParse(t, effectiveTOML)
	fileView := bucketThrottles(cfg)

	// No state: the file's values.
	for _, st := range []*State{nil, NewState()} {
		eff, err := Effective(cfg, st)
		if err != nil {
			t.Fatal(err)
		}
		if eff.Throttle != cfg.Throttle || !reflect.DeepEqual(bucketThrottles(eff), fileView) {
			t.Fatalf("Effective(empty state) changed values: %+v", bucketThrottles(eff))
		}
	}

	st := NewState()
	c := throttle.Limit(5000)
	st.Capacity = &c
	st.Defaults = &BucketThrottle{lim(1), lim(50)}
	st.Buckets["explicit"] = BucketThrottle{lim(7), throttle.Unlimited} // overrides the file
	st.Buckets["gone"] = BucketThrottle{lim(1), lim(1)}                 // ignored
	eff, err := Effective(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	if eff.Throttle.Capacity != c || eff.Throttle.Defaults != *st.Defaults {
		t.Errorf("Throttle = %+v", eff.Throttle)
	}
	want := map[string]BucketThrottle{
		"default":   {lim(1), lim(50)},            // both from the state's defaults
		"explicit":  {lim(7), throttle.Unlimited}, // state entry
		"res_only":  {lim(30), lim(50)},           // file reserved, state default hard
		"hard_only": {lim(1), lim(300)},           // state default reserved, file hard
	}
	if got := bucketThrottles(eff); !reflect.DeepEqual(got, want) {
		t.Errorf("buckets = %v, want %v", got, want)
	}
	if eff.Bucket("gone") != nil || eff.Bucket("explicit") != &eff.Buckets[1] {
		t.Error("bucket index wrong")
	}
	// The input is not modified.
	if !reflect.DeepEqual(bucketThrottles(cfg), fileView) || cfg.Throttle.Capacity != lim(1000) {
		t.Error("Effective modified its input")
	}
	// Effective of an effective Config starts again from the file.
	again, err := Effective(eff, nil)
	if err != nil || !reflect.DeepEqual(bucketThrottles(again), fileView) || again.Throttle != cfg.Throttle {
		t.Errorf("Effective(eff, nil) = %v, %v; want the file's values", bucketThrottles(again), err)
	}
	// Users and authentication survive.
	if eff.auth != cfg.auth || len(eff.Users) != len(cfg.Users) {
		t.Error("auth state not shared")
	}
}

func TestEffectiveConflict(t *testing.T) {
	cfg := mustParse(t, effectiveTOML)
	st := NewState()
	st.Defaults = &BucketThrottle{lim(0), lim(25)} // res_only has reserved = 30 in the file
	_, err := Effective(cfg, st)
	if err == nil || !strings.Contains(err.Error(), `bucket "res_only": reserved 30 exceeds hard_limit 25`) {
		t.Fatalf("error = %v", err)
	}
	// A state entry for that bucket resolves the conflict.
	st.Buckets["res_only"] = BucketThrottle{lim(30), lim(30)}
	if _, err := Effective(cfg, st); err != nil {
		t.Fatal(err)
	}
	// Invalid hand-made state values are reported, not used.
	bad := NewState()
	bad.Buckets["default"] = BucketThrottle{lim(2), lim(1)}
	if _, err := Effective(cfg, bad); err == nil {
		t.Fatal("invalid state entry accepted")
	}
}

// New node defaults apply to buckets created afterwards only: SetNode pins
// the existing buckets that followed the old defaults.
func TestSetNodePinsExistingBuckets(t *testing.T) {
	cfg := mustParse(t, effectiveTOML)
	current, err := Effective(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	st := NewState()
	st.Buckets["hard_only"] = BucketThrottle{lim(2), lim(3)} // already overridden: kept
	c := throttle.Limit(9)
	if err := st.SetNode(NodeThrottle{Capacity: &c, Defaults: &BucketThrottle{lim(40), lim(400)}}, current); err != nil {
		t.Fatal(err)
	}
	want := map[string]BucketThrottle{
		"default":   {lim(10), lim(100)}, // pinned at the old defaults
		"res_only":  {lim(30), lim(100)}, // pinned (its hard limit followed the defaults)
		"hard_only": {lim(2), lim(3)},    // existing entry untouched
	}
	if !reflect.DeepEqual(st.Buckets, want) {
		t.Fatalf("state buckets = %v, want %v ('explicit' sets both limits and needs no pin)", st.Buckets, want)
	}
	eff, err := Effective(cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	if got := bucketThrottles(eff); got["default"] != current.Bucket("default").Throttle || got["res_only"] != current.Bucket("res_only").Throttle ||
		got["explicit"] != current.Bucket("explicit").Throttle || eff.Throttle.Capacity != c {
		t.Fatalf("existing buckets changed: %v", got)
	}
	// A bucket added at the next reload gets the new defaults.
	reloaded := mustParse(t, effectiveTOML+"[[bucket]]\nname = \"newcomer\"\n")
	eff, err = Effective(reloaded, st)
	if err != nil {
		t.Fatal(err)
	}
	if got := eff.Bucket("newcomer").Throttle; got != (BucketThrottle{lim(40), lim(400)}) {
		t.Fatalf("new bucket = %v, want the new defaults", got)
	}
	// Capacity only: nothing pinned.
	st2 := NewState()
	if err := st2.SetNode(NodeThrottle{Capacity: &c}, current); err != nil || len(st2.Buckets) != 0 || st2.Defaults != nil {
		t.Fatalf("capacity-only SetNode: %+v, %v", st2, err)
	}
}

// TrackBuckets raises the epoch of a bucket once when it goes out of
// service, whether by reload or while the proxy was down, and records new
// buckets, so that a name coming back never finds the old keys.
func TestTrackBuckets(t *testing.T) {
	s := NewState()
	s.Epochs["flushed"] = 2
	s1, changed := s.TrackBuckets([]string{"a", "flushed"})
	if !changed || !reflect.DeepEqual(s1.Epochs, map[string]uint64{"a": 0, "flushed": 2}) || len(s1.Retired) != 0 {
		t.Fatalf("first start: changed %v, epochs %v, retired %v", changed, s1.Epochs, s1.Retired)
	}
	if len(s.Epochs) != 1 {
		t.Fatalf("TrackBuckets changed its receiver: %v", s.Epochs)
	}
	if s2, changed := s1.TrackBuckets([]string{"flushed", "a"}); changed || s2 != s1 {
		t.Fatalf("same buckets again: changed %v", changed)
	}
	// "a" removed: raised once, however many restarts or reloads follow.
	s3, changed := s1.TrackBuckets([]string{"flushed"})
	if !changed || s3.Epochs["a"] != 1 || !s3.Retired["a"] {
		t.Fatalf("removed: changed %v, epochs %v, retired %v", changed, s3.Epochs, s3.Retired)
	}
	if s4, changed := s3.TrackBuckets([]string{"flushed"}); changed || s4.Epochs["a"] != 1 {
		t.Fatalf("still removed: changed %v, epochs %v", changed, s4.Epochs)
	}
	// Back in service: the raised epoch, no longer retired.
	s5, changed := s3.TrackBuckets([]string{"flushed", "a"})
	if !changed || s5.Epochs["a"] != 1 || s5.Retired["a"] {
		t.Fatalf("back: changed %v, epochs %v, retired %v", changed, s5.Epochs, s5.Retired)
	}
	// Removed again: a third namespace.
	if s6, _ := s5.TrackBuckets(nil); s6.Epochs["a"] != 2 || s6.Epochs["flushed"] != 3 {
		t.Fatalf("removed again: epochs %v", s6.Epochs)
	}
}
