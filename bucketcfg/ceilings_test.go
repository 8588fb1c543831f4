package bucketcfg

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// Ceilings round-trip through the state file; of two ceilings the greater
// epoch wins, then the larger class; a class below 1 is refused.
func TestStateCeilings(t *testing.T) {
	s := NewState()
	s.SetCeiling("a", Ceiling{Epoch: 2, Class: 32})
	s.SetCeiling("a", Ceiling{Epoch: 2, Class: 8})   // lower, same epoch: kept at 32
	s.SetCeiling("b", Ceiling{Epoch: 1, Class: 257}) // then a FLUSH's epoch
	s.SetCeiling("b", Ceiling{Epoch: 3, Class: 1})
	if s.Ceilings["a"] != (Ceiling{2, 32}) || s.Ceilings["b"] != (Ceiling{3, 1}) {
		t.Fatalf("ceilings %v", s.Ceilings)
	}
	if c := s.Clone(); c.Ceilings["a"] != s.Ceilings["a"] {
		t.Fatal("Clone lost the ceilings")
	}
	path := filepath.Join(t.TempDir(), "state.json")
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := LoadState(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Ceilings) != 2 || got.Ceilings["a"] != s.Ceilings["a"] || got.Ceilings["b"] != s.Ceilings["b"] {
		t.Fatalf("loaded ceilings %v, want %v", got.Ceilings, s.Ceilings)
	}
	bad := `{"version":1,"buckets":{},"ceilings":{"a":{"epoch":1,"class":0}}}`
	if err := json.Unmarshal([]byte(bad), NewState()); err == nil || !strings.Contains(err.Error(), "class") {
		t.Fatalf("class 0 accepted: %v", err)
	}
	empty, _ := json.Marshal(NewState())
	if strings.Contains(string(empty), "ceilings") {
		t.Fatalf("an empty state writes ceilings: %s", empty)
	}
}
