package echo

import (
	"strings"
	"testing"
)

func TestCut(t *testing.T) {
	cases := []struct {
		in   string
		n    int
		want string
		cut  bool
	}{
		{"abc", 3, "abc", false},
		{"abcd", 3, "abc", true},
		{"", 0, "", false},
		{"aé", 2, "a", true}, // é is 2 bytes: never split a rune
		{"ééé", 5, "éé", true},
	}
	for _, c := range cases {
		if got, cut := Cut(c.in, c.n); got != c.want || cut != c.cut {
			t.Errorf("Cut(%q, %d) = %q, %v; want %q, %v", c.in, c.n, got, cut, c.want, c.cut)
		}
	}
}

func TestShortAndQuote(t *testing.T) {
	long := strings.Repeat("x", 500)
	if got := Short(long); got != strings.Repeat("x", Max)+"..." {
		t.Errorf("Short(500 x) = %q", got)
	}
	if got := Short("ok"); got != "ok" {
		t.Errorf("Short(ok) = %q", got)
	}
	if got := Quote("a\nb\x00"); got != `"a\nb\x00"` {
		t.Errorf("Quote = %s, want control bytes escaped", got)
	}
	if got := Quote(long); got != `"`+strings.Repeat("x", Max)+`"...` {
		t.Errorf("Quote(500 x) = %s", got)
	}
}
