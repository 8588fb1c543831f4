package bucketcfg

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestPendingFlushes: a delayed flush targets the epoch after the
// bucket's, a later one replaces it, an immediate one cancels it; due
// flushes move the epoch once (applying again changes nothing), void ones
// (overtaken by an immediate flush) are dropped.
func TestPendingFlushes(t *testing.T) {
	s := NewState()
	s.Epochs["a"], s.Epochs["b"] = 3, 0
	if f := s.ScheduleFlush("a", 100); f != (PendingFlush{At: 100, Epoch: 4}) {
		t.Fatalf("ScheduleFlush = %+v", f)
	}
	s.ScheduleFlush("a", 200) // replaces
	s.ScheduleFlush("b", 150)
	if s.ApplyFlushes(199) != true || s.Epochs["a"] != 3 || s.Epochs["b"] != 1 || len(s.Flushes) != 1 {
		t.Fatalf("at 199: epochs %v, flushes %v", s.Epochs, s.Flushes)
	}
	if !s.ApplyFlushes(200) || s.Epochs["a"] != 4 || len(s.Flushes) != 0 {
		t.Fatalf("at 200: epochs %v, flushes %v", s.Epochs, s.Flushes)
	}
	if s.ApplyFlushes(10_000) || s.Epochs["a"] != 4 {
		t.Fatalf("applied twice: epochs %v", s.Epochs)
	}
	s.ScheduleFlush("a", 300)
	if e := s.FlushNow("a"); e != 5 || len(s.Flushes) != 0 {
		t.Fatalf("FlushNow = %d, flushes %v", e, s.Flushes)
	}
	s.Flushes["a"] = PendingFlush{At: 1, Epoch: 5} // overtaken: void
	if !s.ApplyFlushes(400) || s.Epochs["a"] != 5 || len(s.Flushes) != 0 {
		t.Fatalf("void flush: epochs %v, flushes %v", s.Epochs, s.Flushes)
	}
}

// TestPendingFlushesSaved: pending flushes survive Save and LoadState and
// Clone; malformed ones are refused.
func TestPendingFlushesSaved(t *testing.T) {
	s := NewState()
	s.Epochs["a"] = 2
	s.ScheduleFlush("a", 1780000000)
	path := filepath.Join(t.TempDir(), "state.json")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	if !strings.Contains(string(data), `"flushes": {`) || !strings.Contains(string(data), `"at": 1780000000`) {
		t.Errorf("state file:\n%s", data)
	}
	got, err := LoadState(path)
	if err != nil || !reflect.DeepEqual(got, s) || !reflect.DeepEqual(s.Clone(), s) {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, s)
	}
	for name, content := range map[string]string{
		"no epoch": `{"version": 1, "buckets": {}, "flushes": {"a": {"at": 5}}}`,
		"no time":  `{"version": 1, "buckets": {}, "flushes": {"a": {"epoch": 5}}}`,
		"bad name": `{"version": 1, "buckets": {}, "flushes": {"a b": {"at": 5, "epoch": 1}}}`,
		"unknown":  `{"version": 1, "buckets": {}, "flushes": {"a": {"at": 5, "epoch": 1, "x": 1}}}`,
	} {
		os.WriteFile(path, []byte(content), 0o600)
		if _, err := LoadState(path); err == nil {
			t.Errorf("%s: accepted %s", name, content)
		}
	}
}
