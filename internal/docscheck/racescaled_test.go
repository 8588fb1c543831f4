package docscheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// makeVar returns the value of the Makefile's `name := value` line, with
// make's $$ read as $.
func makeVar(t *testing.T, makefile, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` := (.*)$`).FindStringSubmatch(makefile)
	if m == nil {
		t.Fatalf("the Makefile has no %s := line", name)
	}
	return strings.ReplaceAll(m[1], "$$", "$")
}

// raceScaled returns, for each test file of the repository, the top-level
// functions that call testmc.SkipUnderRace or testmc.UnderRace.
func raceScaled(t *testing.T) map[string][]string {
	t.Helper()
	found := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".") && path != repoRoot) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if ok && (sel.Sel.Name == "SkipUnderRace" || sel.Sel.Name == "UnderRace") {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "testmc" {
						found[path] = append(found[path], fn.Name.Name)
						return false
					}
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// A test that skips or shortens under -race runs in full in make test's
// pass without it: its package is in NORACE_PKGS, or it is a proxy test of
// the upstream-TLS pass (UPSTREAM_TLS_TESTS, run without -race) or of
// PROXY_NORACE_TESTS. Otherwise make test would never run what it skips.
func TestRaceScaledTestsRunWithoutRace(t *testing.T) {
	makefile := readRepo(t, "Makefile")
	norace := map[string]bool{}
	for _, p := range strings.Fields(makeVar(t, makefile, "NORACE_PKGS")) {
		norace[filepath.Clean(p)] = true
	}
	upstreamTLS := regexp.MustCompile(makeVar(t, makefile, "UPSTREAM_TLS_TESTS"))
	proxyNorace := regexp.MustCompile(makeVar(t, makefile, "PROXY_NORACE_TESTS"))
	found := raceScaled(t)
	if len(found) == 0 {
		t.Fatal("no test calls testmc.SkipUnderRace or testmc.UnderRace: the check found nothing to check")
	}
	used := map[string]bool{}
	for path, funcs := range found {
		rel, err := filepath.Rel(repoRoot, filepath.Dir(path))
		if err != nil {
			t.Fatal(err)
		}
		if norace[rel] {
			used[rel] = true
			continue
		}
		for _, fn := range funcs {
			if rel != "proxy" || !upstreamTLS.MatchString(fn) && !proxyNorace.MatchString(fn) {
				t.Errorf("%s: %s skips or shortens under -race, but make test runs it only with -race: add ./%s to the Makefile's NORACE_PKGS (a proxy test: to PROXY_NORACE_TESTS)", path, fn, rel)
			}
		}
	}
	for p := range norace {
		if !used[p] {
			t.Errorf("NORACE_PKGS lists ./%s, which has no test that skips or shortens under -race: make test runs it twice for nothing", p)
		}
	}
}
