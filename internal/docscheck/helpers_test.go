package docscheck

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// repoRoot is the repository, relative to this package's directory (where
// go test runs its tests).
const repoRoot = "../.."

var (
	binDir  string
	binOnce sync.Once
	binPath string

	checkerOnce sync.Once
	checker     *Checker
	checkerErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "docscheck-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// kvthrottleBin returns the kvthrottle binary of this tree
// (testmc.KvthrottleBin), built once per test binary.
func kvthrottleBin(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binPath = testmc.KvthrottleBin(t, "../../cmd/kvthrottle", binDir)
	})
	if binPath == "" {
		t.Fatal("no kvthrottle binary: its build failed in an earlier test")
	}
	return binPath
}

// readRepo returns the text of a file of the repository.
func readRepo(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// docFiles returns README.md, deploy/README.md and the docs/*.md files,
// relative to the repository.
func docFiles(t *testing.T) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(pages) == 0 {
		t.Fatal("no docs/*.md")
	}
	files := []string{"README.md", "deploy/README.md"}
	for _, p := range pages {
		rel, err := filepath.Rel(repoRoot, p)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rel)
	}
	return files
}

// needTools skips the test when a tool is missing, except under CI, where
// make test has installed them (scripts/deps.sh) and a missing one is a
// failure.
func needTools(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s not installed (scripts/deps.sh installs it): %v", tool, err)
			}
			t.Skipf("%s not installed (make deps installs it): %v", tool, err)
		}
	}
}

// sharedChecker returns a Checker of the binary kvthrottleBin builds,
// reading its usages once per test binary.
func sharedChecker(t *testing.T) *Checker {
	t.Helper()
	bin := kvthrottleBin(t)
	checkerOnce.Do(func() { checker, checkerErr = NewChecker(bin) })
	if checkerErr != nil {
		t.Fatal(checkerErr)
	}
	return checker
}
