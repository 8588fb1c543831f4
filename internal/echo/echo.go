// Package echo renders untrusted input for error messages: cut short, so a
// client or a file cannot fill an error (or a log line) with its own bytes,
// and quoted where asked, so control bytes are escaped.
//
// It has no state and no dependencies beyond the standard library; any
// package may import it.
package echo

import (
	"strconv"
	"unicode/utf8"
)

// Max is how many bytes of a rejected value [Short] and [Quote] keep.
const Max = 32

// Cut returns the longest prefix of s of at most n bytes that ends on a
// rune boundary, and whether s was cut.
func Cut(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], true
}

// Short cuts s to at most Max bytes, marking a cut with "...".
func Short(s string) string {
	if p, cut := Cut(s, Max); cut {
		return p + "..."
	}
	return s
}

// Quote quotes s in Go syntax (so control bytes are escaped) after cutting
// it to at most Max bytes, marking a cut with "..." after the closing quote.
func Quote(s string) string {
	if p, cut := Cut(s, Max); cut {
		return strconv.Quote(p) + "..."
	}
	return strconv.Quote(s)
}
