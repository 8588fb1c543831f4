package docscheck

import (
	"regexp"
	"strings"
)

// mdLink matches the target of an inline Markdown link, [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// Links returns the link targets of md, outside code blocks.
func Links(md string) []string {
	var out []string
	inFence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

// Anchors returns the anchors of md's headings as GitHub makes them:
// lower case, punctuation other than '-' and '_' dropped, spaces as '-'.
func Anchors(md string) map[string]bool {
	out := map[string]bool{}
	inFence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(text) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				b.WriteRune(r)
			}
		}
		out[b.String()] = true
	}
	return out
}
