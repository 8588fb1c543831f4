package text

import (
	"testing"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// TestCommandTable: every kind has a row, every row is found by its name
// and parsed as its kind, and each row that runs has a binary command
// whose class says how its units are counted.
func TestCommandTable(t *testing.T) {
	seen := map[Kind]bool{}
	var c Command
	for _, v := range Verbs() {
		seen[v.Kind] = true
		if got, ok := Lookup(v.Name); !ok || got.Name != v.Name {
			t.Errorf("Lookup(%q) = %v, %v", v.Name, got, ok)
		}
		if v.Run != RunRefused && !v.Op.Known() {
			t.Errorf("%s runs as no binary command", v.Name)
		}
		if v.Quiet == QuietNoreply && v.Run != RunRefused && v.QuietOp.Class() != v.Op.Class() {
			t.Errorf("%s with noreply is charged as %v, without as %v", v.Name, v.QuietOp, v.Op)
		}
		// Parse finds the row of a line's command, even when it refuses
		// the rest of the line.
		_, _ = Parse([]byte(v.Name+" k 0 0 1\r\nz\r\n"), 1024, &c)
		if c.Verb == nil || c.Verb.Name != v.Name {
			t.Errorf("%q parsed as %v", v.Name, c.Verb)
		}
	}
	for k := KindNone + 1; k < kindCount; k++ {
		if !seen[k] {
			t.Errorf("kind %d has no row", k)
		}
	}
	if _, ok := Lookup("nope"); ok {
		t.Error("Lookup found an unknown command")
	}
	units := []struct {
		name           string
		noreply, touch bool
		want           binary.Class
	}{
		{"get", false, false, binary.ClassRead},
		{"set", true, false, binary.ClassWrite},
		{"gat", false, false, binary.ClassReadWrite},
		{"mg", false, false, binary.ClassRead},
		{"mg", false, true, binary.ClassReadWrite},
		{"ms", false, false, binary.ClassWrite},
		{"version", false, false, binary.ClassOther},
	}
	for _, u := range units {
		v, _ := Lookup(u.name)
		if got := v.OpFor(u.noreply, u.touch).Class(); got != u.want {
			t.Errorf("%s (noreply %v, touch %v) charged as class %d, want %d", u.name, u.noreply, u.touch, got, u.want)
		}
	}
}
