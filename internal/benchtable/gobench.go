package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

type benchResult struct {
	pkg     string // import path relative to the module ("./throttle")
	name    string // without "Benchmark" and without the GOMAXPROCS suffix
	samples map[string][]float64
	units   []string // in the order of the output
	ref     *benchResult
	once    bool   // a long simulation, run once
	refKind string // "AllowN", "direct", "bare": a baseline
	order   int    // position in the first pass
}

func (b *benchResult) med(unit string) (float64, bool) {
	s, ok := b.samples[unit]
	if !ok || len(s) == 0 {
		return 0, false
	}
	return median(s), true
}

// custom reports the units other than the standard ones (b.ReportMetric).
func (b *benchResult) custom() []string {
	var out []string
	for _, u := range b.units {
		switch u {
		case "ns/op", "B/op", "allocs/op", "MB/s":
		default:
			out = append(out, u)
		}
	}
	return out
}

// isReference tells the baselines: x/time/rate's AllowN, memcached direct.
func (b *benchResult) isReference() bool { return b.refKind != "" }

// hotPath: every benchmark of ours without custom metrics (those with
// custom metrics are simulations reporting accuracy, not per-request work).
func (b *benchResult) hotPath() bool {
	return !b.isReference() && len(b.custom()) == 0
}

type goBench struct {
	cmd      string // the go test command line, with PKG for the package
	pkgs     []string
	results  []*benchResult
	cmd1     string // the first pass
	procs    string // GOMAXPROCS suffix stripped from the names
	goVer    string
	duration time.Duration
}

var reBenchLine = regexp.MustCompile(`^(Benchmark\S*)\s+(\d+)\s+(.+)$`)

// listBenchPackages returns the packages of the module with benchmarks.
func listBenchPackages(ctx context.Context, goCmd, root, modPath string) ([]string, error) {
	out, err := goCommand(ctx, goCmd, root, "test", "-list", "^Benchmark", "./...")
	if err != nil {
		return nil, fmt.Errorf("go test -list: %v\n%s", err, out)
	}
	var pkgs []string
	names := 0
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "Benchmark") {
			names++
			continue
		}
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "ok" {
			if names > 0 {
				pkgs = append(pkgs, "."+strings.TrimPrefix(f[1], modPath))
			}
			names = 0
		}
	}
	return pkgs, nil
}

func goCommand(ctx context.Context, goCmd, dir string, args ...string) (string, error) {
	// shortCommand with a working directory.
	return shortCommandIn(ctx, dir, goCmd, args...)
}

// longOp: a benchmark whose single iteration takes this long is a timed
// simulation meant to run once (-benchtime 1x); its first-pass result is
// kept and it is not repeated -count times.
const longOp = 1e9 // ns

func runGoBench(ctx context.Context, o *options, root string, rep *report) error {
	began := time.Now()
	section := takeCPU()
	goCmd := rep.tools.goCmd
	modPath := strings.TrimSpace(commandOutputIn(ctx, root, goCmd, "list", "-m"))
	if modPath == "" || modPath == "?" {
		return fmt.Errorf("go list -m failed in %s", root)
	}
	pkgs, err := listBenchPackages(ctx, goCmd, root, modPath)
	if err != nil {
		return err
	}
	if len(pkgs) == 0 {
		return fmt.Errorf("no package of %s has benchmarks", modPath)
	}
	gb := &goBench{pkgs: pkgs, goVer: commandOutputIn(ctx, root, goCmd, "version"), procs: testProcs()}
	base := []string{"test", "-run", "^$", "-benchmem"}
	args := append(slices.Clone(base), "-count", strconv.Itoa(o.benchCount), "-benchtime", o.benchTime)
	gb.cmd = "go " + strings.Join(quoteArgs(append(args, "-bench", "PATTERN")), " ") + " PKG"
	gb.cmd1 = "go " + strings.Join(quoteArgs(append(slices.Clone(base), "-bench", ".", "-benchtime", "1x")), " ") + " PKG"
	run := func(pkg string, args ...string) ([]*benchResult, error) {
		out, err := goCommand(ctx, goCmd, root, append(args, pkg)...)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			return nil, fmt.Errorf("go %s %s: %v\n%s", strings.Join(args, " "), pkg, err, out)
		}
		return parseBench(pkg, out, gb.procs), nil
	}
	for _, pkg := range pkgs {
		// Pass 1: every benchmark once, to find the long simulations.
		logf("go benchmarks of %s: one iteration each", pkg)
		first, err := run(pkg, append(slices.Clone(base), "-bench", ".", "-benchtime", "1x")...)
		if err != nil {
			return err
		}
		order := map[string]int{}
		for i, b := range first {
			order[b.name] = i
		}
		patterns, long := benchPatterns(first)
		for _, b := range long {
			b.once = true
			b.order = order[b.name]
			gb.results = append(gb.results, b)
		}
		// Pass 2: the others, -count times.
		for _, pat := range patterns {
			logf("go benchmarks of %s: -bench '%s' -count %d -benchtime %s", pkg, pat, o.benchCount, o.benchTime)
			res, err := run(pkg, append(slices.Clone(args), "-bench", pat)...)
			if err != nil {
				return err
			}
			if len(res) == 0 {
				return fmt.Errorf("go test -bench '%s' %s ran no benchmark", pat, pkg)
			}
			for _, b := range res {
				b.order = order[b.name]
			}
			gb.results = append(gb.results, res...)
		}
	}
	gb.sortAndPair()
	gb.duration = time.Since(began)
	rep.benchLoad = loadBetween(section, takeCPU())
	rep.gobench = gb
	return nil
}

// testProcs is the GOMAXPROCS the test binaries run with (the "-P" suffix
// of benchmark names), "" when 1 (no suffix).
func testProcs() string {
	p := runtime.GOMAXPROCS(0)
	if v, err := strconv.Atoi(os.Getenv("GOMAXPROCS")); err == nil && v > 0 {
		p = v
	}
	if p == 1 {
		return ""
	}
	return strconv.Itoa(p)
}

// benchPatterns returns the -bench patterns that run every benchmark of a
// package except the long ones (which it returns), grouping by top-level
// name: "^(A|B)$" for whole top-level benchmarks, "^C$/^(x|y)$" for a
// top-level one with some long sub-benchmarks.
func benchPatterns(first []*benchResult) (patterns []string, long []*benchResult) {
	type top struct {
		name            string
		subs, shortSubs []string
		anyLong, deep   bool
	}
	var tops []*top
	byName := map[string]*top{}
	for _, b := range first {
		t, sub, hasSub := strings.Cut(b.name, "/")
		tp := byName[t]
		if tp == nil {
			tp = &top{name: t}
			byName[t] = tp
			tops = append(tops, tp)
		}
		if strings.Contains(sub, "/") {
			tp.deep = true
		}
		ns, _ := b.med("ns/op")
		isLong := ns >= longOp
		if isLong {
			tp.anyLong = true
			long = append(long, b)
		} else if hasSub {
			tp.shortSubs = append(tp.shortSubs, regexp.QuoteMeta(sub))
		}
		tp.subs = append(tp.subs, sub)
	}
	var whole []string
	for _, t := range tops {
		switch {
		case !t.anyLong:
			whole = append(whole, regexp.QuoteMeta(t.name))
		case len(t.shortSubs) == 0 || t.deep:
			// every sub-benchmark long (or too deep to filter): pass 1 is it.
			if t.deep && len(t.shortSubs) > 0 {
				logf("benchmark %s: long sub-benchmarks in a deep tree: the others are run once too", t.name)
			}
		default:
			patterns = append(patterns, "^Benchmark"+regexp.QuoteMeta(t.name)+"$/^("+strings.Join(t.shortSubs, "|")+")$")
		}
	}
	if len(whole) > 0 {
		patterns = append([]string{"^Benchmark(" + strings.Join(whole, "|") + ")$"}, patterns...)
	}
	return patterns, long
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, "^$ *") {
			a = "'" + a + "'"
		}
		out[i] = a
	}
	return out
}

// parseBench parses go test -bench output: one line per run,
// "BenchmarkName-P  N  v1 unit1  v2 unit2 ...".
func parseBench(pkg, out, procs string) []*benchResult {
	var res []*benchResult
	byName := map[string]*benchResult{}
	pending := "" // a name printed alone on its line (the benchmark logged output)
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if pending != "" && len(line) > 0 && line[0] >= '0' && line[0] <= '9' {
			line = pending + " " + line
		}
		pending = ""
		if f := strings.Fields(line); len(f) == 1 && strings.HasPrefix(f[0], "Benchmark") {
			pending = f[0]
			continue
		}
		m := reBenchLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		name := strings.TrimPrefix(m[1], "Benchmark")
		if procs != "" {
			name = strings.TrimSuffix(name, "-"+procs)
		}
		b := byName[name]
		if b == nil {
			b = &benchResult{pkg: pkg, name: name, samples: map[string][]float64{}}
			byName[name] = b
			res = append(res, b)
		}
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			unit := f[i+1]
			if _, seen := b.samples[unit]; !seen {
				b.units = append(b.units, unit)
			}
			b.samples[unit] = append(b.samples[unit], v)
		}
	}
	return res
}

// sortAndPair orders the results as the first pass listed them and pairs
// each of our benchmarks with its baseline:
//   - the x/time/rate benchmark whose name differs in exactly one element,
//     that element naming AllowN ("AdmitCharge/engine/goroutines=1" with
//     "AdmitCharge/x-time-rate-AllowN/goroutines=1");
//   - for a top-level name starting with "Proxy", the same name starting
//     with "Direct" (memcached without the proxy);
//   - for a name starting with "Fleet", the same name without it (the
//     proxy in fleet mode against the proxy alone);
//   - for a name starting with "Bare" (the bare forwarder, itself a
//     reference), the same name starting with "Direct".
func (g *goBench) sortAndPair() {
	for _, b := range g.results {
		if strings.Contains(b.name, "AllowN") {
			b.refKind = "AllowN"
		}
	}
	for _, b := range g.results {
		if b.refKind != "" {
			continue
		}
		if rest, ok := strings.CutPrefix(b.name, "Fleet"); ok {
			for _, r := range g.results {
				if r.pkg == b.pkg && r.name == rest {
					b.ref = r
				}
			}
			continue
		}
		if rest, ok := strings.CutPrefix(b.name, "Bare"); ok {
			// The bare forwarder: a reference, shown against Direct.
			b.refKind = "bare"
			for _, r := range g.results {
				if r.pkg == b.pkg && r.name == "Direct"+rest {
					r.refKind = "direct"
					b.ref = r
				}
			}
			continue
		}
		if rest, ok := strings.CutPrefix(b.name, "Proxy"); ok {
			for _, r := range g.results {
				if r.pkg == b.pkg && r.name == "Direct"+rest {
					r.refKind = "direct"
					b.ref = r
				}
			}
			continue
		}
		be := strings.Split(b.name, "/")
		for _, r := range g.results {
			if r.refKind != "AllowN" || r.pkg != b.pkg {
				continue
			}
			re := strings.Split(r.name, "/")
			if len(re) != len(be) {
				continue
			}
			diff := -1
			for i := range re {
				if re[i] != be[i] {
					if diff >= 0 {
						diff = -2
						break
					}
					diff = i
				}
			}
			if diff >= 0 && strings.Contains(re[diff], "AllowN") {
				b.ref = r
				break
			}
		}
	}
	slices.SortStableFunc(g.results, func(a, b *benchResult) int {
		if c := strings.Compare(a.pkg, b.pkg); c != 0 {
			return c
		}
		return a.order - b.order
	})
}
