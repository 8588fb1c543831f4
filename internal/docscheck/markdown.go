// Package docscheck checks the documentation against the code: that every
// configuration key is documented in docs/configuration.md, and that the
// commands README.md and docs/ show exist, with the README's tour run
// for real against a proxy and a memcached (see the tests). The helpers
// here read Markdown, TOML and shell lines just well enough for that.
package docscheck

import (
	"regexp"
	"strings"
)

// Block is one fenced code block of a Markdown document.
type Block struct {
	// Lang is the info string's first word ("sh", "text", "toml", ...),
	// "" when the fence has none.
	Lang string
	// Body is the block's content, every line ending in "\n".
	Body string
	// Line is the 1-based line number of the opening fence.
	Line int
}

// Blocks returns the fenced code blocks (``` fences) of md in order. An
// unclosed fence runs to the end of the document.
func Blocks(md string) []Block {
	var out []Block
	var cur *Block
	var body strings.Builder
	for i, line := range strings.Split(md, "\n") {
		trimmed := strings.TrimSpace(line)
		if !strings.HasPrefix(trimmed, "```") {
			if cur != nil {
				body.WriteString(line + "\n")
			}
			continue
		}
		if cur != nil {
			cur.Body = body.String()
			out = append(out, *cur)
			cur = nil
			continue
		}
		lang, _, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), " ")
		cur = &Block{Lang: lang, Line: i + 1}
		body.Reset()
	}
	if cur != nil {
		cur.Body = body.String()
		out = append(out, *cur)
	}
	return out
}

// tableHeading matches a heading that names a TOML table, as
// docs/configuration.md writes them: "## `[proxy]`", "### `[upstream.tls]`",
// "## `[[bucket]]`".
var tableHeading = regexp.MustCompile("^#+\\s+`\\[\\[?([a-z_.]+)\\]\\]?`")

// TableSections returns, for each heading of md that names a TOML table,
// the text from that heading to the next heading of any level (so a
// table's section does not include its sub-tables'), keyed by the table's
// dotted name. Headings inside code blocks are not headings.
func TableSections(md string) map[string]string {
	out := map[string]string{}
	name, inFence := "", false
	var body strings.Builder
	flush := func() {
		if name != "" {
			out[name] += body.String()
		}
		body.Reset()
	}
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
		}
		if !inFence && strings.HasPrefix(line, "#") {
			flush()
			name = ""
			if m := tableHeading.FindStringSubmatch(line); m != nil {
				name = m[1]
			}
			continue
		}
		body.WriteString(line + "\n")
	}
	flush()
	return out
}
