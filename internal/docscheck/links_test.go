package docscheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocLinks: every link of README.md and docs/*.md points into the
// repository, at a file that exists and, with #anchor, at one of its
// headings. Nothing outside the repository is linked.
func TestDocLinks(t *testing.T) {
	n := 0
	for _, f := range docFiles(t) {
		for _, target := range Links(readRepo(t, f)) {
			n++
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				t.Errorf("%s: links outside the repository: %s", f, target)
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			rel := f
			if path != "" {
				rel = filepath.Join(filepath.Dir(f), path)
			}
			if strings.HasPrefix(filepath.Clean(rel), "..") {
				t.Errorf("%s: links outside the repository: %s", f, target)
				continue
			}
			if _, err := os.Stat(filepath.Join(repoRoot, rel)); err != nil {
				t.Errorf("%s: link %s: %v", f, target, err)
				continue
			}
			if anchor != "" && strings.HasSuffix(rel, ".md") && !Anchors(readRepo(t, rel))[anchor] {
				t.Errorf("%s: link %s: %s has no heading with that anchor", f, target, rel)
			}
		}
	}
	if n < 10 {
		t.Errorf("found %d links in the documentation; expected more", n)
	}
}

// TestAnchors: headings become anchors as GitHub makes them.
func TestAnchors(t *testing.T) {
	a := Anchors("# Top\n## `[upstream.tls]`\n```sh\n# not a heading\n```\n### The free pool: fcfs and fair\n## kvthrottle ctl\n")
	for _, want := range []string{"top", "upstreamtls", "the-free-pool-fcfs-and-fair", "kvthrottle-ctl"} {
		if !a[want] {
			t.Errorf("no anchor %q in %v", want, a)
		}
	}
	if a["not-a-heading"] {
		t.Error("a comment in a code block became an anchor")
	}
}
