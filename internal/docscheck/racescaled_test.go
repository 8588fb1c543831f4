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

// raceScaledTests returns the tests of the package in dir (relative to the
// repository) that skip or shorten under -race: they call
// testmc.SkipUnderRace or testmc.UnderRace, or call a function of the
// package's test files that does, at any depth.
func raceScaledTests(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, dir, "*_test.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("%s: no test files (%v)", dir, err)
	}
	calls := map[string]map[string]bool{} // function -> the names it calls
	scaled := map[string]bool{}
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			name := fn.Name.Name
			calls[name] = map[string]bool{}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok {
					return true
				}
				switch fun := call.Fun.(type) {
				case *ast.Ident:
					calls[name][fun.Name] = true
				case *ast.SelectorExpr:
					if id, ok := fun.X.(*ast.Ident); ok && id.Name == "testmc" && (fun.Sel.Name == "SkipUnderRace" || fun.Sel.Name == "UnderRace") {
						scaled[name] = true
					}
					calls[name][fun.Sel.Name] = true // a method of the package's
				case *ast.IndexExpr: // a generic function
					if sel, ok := fun.X.(*ast.SelectorExpr); ok && sel.Sel.Name == "UnderRace" {
						scaled[name] = true
					}
				}
				return true
			})
		}
	}
	for changed := true; changed; {
		changed = false
		for fn, callees := range calls {
			for c := range callees {
				if scaled[c] && !scaled[fn] {
					scaled[fn], changed = true, true
				}
			}
		}
	}
	var tests []string
	for fn := range scaled {
		if strings.HasPrefix(fn, "Test") {
			tests = append(tests, fn)
		}
	}
	return tests
}

// The pass without -race (test-norace) runs, of NORACE_PKGS, only the
// tests NORACE_TESTS names: every test that skips or shortens under -race
// must be one of them (the others ran in full under -race already).
func TestNoraceTestsListsEveryRaceScaledTest(t *testing.T) {
	makefile := readRepo(t, "Makefile")
	list := regexp.MustCompile(makeVar(t, makefile, "NORACE_TESTS"))
	n := 0
	for _, p := range strings.Fields(makeVar(t, makefile, "NORACE_PKGS")) {
		for _, name := range raceScaledTests(t, filepath.Clean(p)) {
			n++
			if !list.MatchString(name) {
				t.Errorf("%s: %s skips or shortens under -race, but the Makefile's NORACE_TESTS does not name it: make test never runs it in full", p, name)
			}
		}
	}
	if n == 0 {
		t.Fatal("no test of NORACE_PKGS skips or shortens under -race: the check found nothing to check")
	}
}
