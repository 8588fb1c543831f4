package main

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

type report struct {
	opts          *options
	began         time.Time
	took          time.Duration
	nofile        uint64
	machine       machine
	tools         tools
	version       string
	mcVersion     string
	goVersion     string
	maslapVersion string
	twemVersion   string // nutcracker -V, without "This is "
	mcArgs        []string
	proxyConfig   string
	twemConfig    string // nutcracker's YAML

	throughput          []*tpResult
	latDirect, latProxy latResult
	latBare             latResult // through the bare forwarder
	latBefore           latResult // through -before-bin's kvthrottle
	beforeVersion       string    // -before-bin's version
	gobench             *goBench
	mem                 *memResult
	text                []*tpResult // section 5; sideTwem is nutcracker
	tls                 *tlsBench   // section 6

	startLoad, tpLoad, latLoad, benchLoad, textLoad cpuLoad

	pass, fail, unreliable int
}

// spread formats a median with the (min–max) of the runs.
func spread(v []float64) string {
	return fmt.Sprintf("%s (%s–%s)", thousands(median(v)), thousands(slices.Min(v)), thousands(slices.Max(v)))
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// thousands formats v rounded to an integer with "," separators.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(math.Round(v)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// num formats a benchmark value with about 3 significant digits.
func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1000:
		return thousands(v)
	case a >= 100 || v == math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

func micros(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	if math.Abs(us) >= 100 {
		return fmt.Sprintf("%.0f µs", us)
	}
	return fmt.Sprintf("%.1f µs", us)
}

// noisyPct: above this share of the machine's CPU used by other processes
// while a measurement ran, its verdict is flagged as unreliable.
const noisyPct = 10

func (r *report) verdict(ok bool) string {
	if ok {
		r.pass++
		return "**PASS**"
	}
	r.fail++
	return "**FAIL**"
}

// verdictUnder is verdict, flagged when the machine was busy.
func (r *report) verdictUnder(ok bool, l cpuLoad) string {
	v := r.verdict(ok)
	if l.ok && l.foreignPct >= noisyPct {
		r.unreliable++
		v += fmt.Sprintf(" (unreliable: other processes used %.0f%% of the CPU)", l.foreignPct)
	}
	return v
}

func (r *report) commandLine() string {
	var quoted []string
	for _, a := range os.Args[1:] {
		quoted = append(quoted, shellQuote(a))
	}
	flags := strings.Join(quoted, " ")
	gorun := "go run ./internal/benchtable"
	if flags != "" {
		gorun += " " + flags
	}
	if os.Getenv("MAKELEVEL") != "" {
		if flags != "" {
			return fmt.Sprintf("`make bench BENCHFLAGS=%s` (runs `%s`)", shellQuote(flags), gorun)
		}
		return fmt.Sprintf("`make bench` (runs `%s`)", gorun)
	}
	return "`" + gorun + "`"
}

func (r *report) markdown() string {
	o := r.opts
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	row := func(cells ...string) { w("| %s |\n", strings.Join(cells, " | ")) }
	r.pass, r.fail, r.unreliable = 0, 0, 0

	w("## kvthrottle benchmarks (DESIGN.md section 9)\n\n")
	w("- **Machine:** %s, %d cores, %.1f GiB RAM, %s\n", r.machine.cpu, r.machine.cores, r.machine.memGB, r.machine.kernel)
	w("- **Date:** %s (whole run: %s)\n", r.began.UTC().Format("2006-01-02 15:04 MST"), r.took.Round(time.Second))
	w("- **Command:** %s, from the module root\n", r.commandLine())
	version := r.version
	if !strings.HasPrefix(version, "kvthrottle") {
		version = "kvthrottle " + version
	}
	w("- **Versions:** %s; %s; %s (`%s`); %s\n", version, r.mcVersion, r.maslapVersion, r.tools.memaslap, r.goVersion)
	loads := []string{fmt.Sprintf("%s before starting", r.startLoad)}
	for _, l := range []struct {
		section byte
		load    cpuLoad
	}{{'1', r.tpLoad}, {'2', r.latLoad}, {'3', r.benchLoad}, {'5', r.textLoad}, {'6', r.tlsLoad()}} {
		if o.has(l.section) {
			loads = append(loads, fmt.Sprintf("%s during section %c", l.load, l.section))
		}
	}
	w("- **Background load** (CPU used by processes other than this program and what it started, in %% of all %d cores): %s\n",
		r.machine.cores, strings.Join(loads, ", "))
	if worst := max(r.startLoad.foreignPct, r.tpLoad.foreignPct, r.latLoad.foreignPct, r.benchLoad.foreignPct, r.textLoad.foreignPct, r.tlsLoad().foreignPct); worst >= 5 {
		w("\n> **Warning:** other processes used up to %.0f%% of the machine's CPU during this run: the side-by-side ratios are noisy. Run again on an idle machine for numbers to compare with the targets.\n", worst)
	}
	w("\n")

	row("#", "benchmark", "direct memcached / baseline", "through kvthrottle / ours", "kvthrottle vs baseline", "target (DESIGN.md §9)", "result")
	row("---", "---", "---:", "---:", "---:", "---", "---")

	// 1. Throughput.
	for _, t := range r.throughput {
		d, p := median(t.tps[sideDirect]), median(t.tps[sideProxy])
		ratio := p / d
		target, result := "—", "info"
		switch {
		case t.div > 0:
			target, result = "≥ 0.90x (issue 17)", r.verdictUnder(ratio >= 0.90, t.load)
		case t.value == 100 && t.conns == 32:
			target, result = "≥ 0.90x", r.verdictUnder(ratio >= 0.90, t.load)
		}
		row("1", fmt.Sprintf("throughput, %s (ops/s, median of %d)", t.tpCase, len(t.tps[sideDirect])),
			spread(t.tps[sideDirect]), spread(t.tps[sideProxy]), fmt.Sprintf("%.2fx", ratio), target, result)
	}
	for _, t := range r.throughput {
		d, b := median(t.tps[sideDirect]), median(t.tps[sideBare])
		row("1", fmt.Sprintf("reference: throughput through the bare forwarder (not kvthrottle), %s (ops/s, median of %d)", t.tpCase, len(t.tps[sideBare])),
			spread(t.tps[sideDirect]), spread(t.tps[sideBare]), fmt.Sprintf("%.2fx", b/d), "—", "info")
	}

	for _, t := range r.throughput {
		if len(t.tps[sideBefore]) == 0 {
			break
		}
		b, p := median(t.tps[sideBefore]), median(t.tps[sideProxy])
		row("1", fmt.Sprintf("before and after: throughput through kvthrottle %s (before) and %s (this one), %s (ops/s, median of %d)", bareVersion(r.beforeVersion), bareVersion(r.version), t.tpCase, len(t.tps[sideBefore])),
			"before: "+spread(t.tps[sideBefore]), spread(t.tps[sideProxy]),
			fmt.Sprintf("%.2fx (before: %.2fx of direct)", p/b, b/median(t.tps[sideDirect])), "—", "info")
	}

	for _, t := range r.throughput {
		dm, _, dl := t.cpuPerOp(sideDirect)
		pm, pp, pl := t.cpuPerOp(sideProxy)
		bm, bp, bl := t.cpuPerOp(sideBare)
		if dm == 0 || pm+pp == 0 {
			continue
		}
		row("1", fmt.Sprintf("server CPU time per request, %s (memcached [+ proxy]; bare forwarder: %.1f + %.1f µs)", t.tpCase, bm, bp),
			fmt.Sprintf("%.1f µs", dm), fmt.Sprintf("%.1f + %.1f = %.1f µs", pm, pp, pm+pp), fmt.Sprintf("%.2fx", (pm+pp)/dm), "—", "info")
		if dl == 0 || pl == 0 {
			continue
		}
		row("1", fmt.Sprintf("CPU time per request of all processes, %s (memcaslap + memcached [+ proxy]; bare forwarder: %.1f µs)", t.tpCase, bl+bm+bp),
			fmt.Sprintf("%.1f + %.1f = %.1f µs", dl, dm, dl+dm), fmt.Sprintf("%.1f + %.1f + %.1f = %.1f µs", pl, pm, pp, pl+pm+pp),
			fmt.Sprintf("%.2fx (throughput bound %.2fx)", (pl+pm+pp)/(dl+dm), (dl+dm)/(pl+pm+pp)), "—", "info")
	}

	// 2. Latency.
	added := func(d, p time.Duration) string {
		if p >= d {
			return "+" + micros(p-d)
		}
		return micros(p - d)
	}
	for _, q := range r.latRows() {
		d, p := r.latDirect.pct(q.p), r.latProxy.pct(q.p)
		row("2", fmt.Sprintf("latency %s at %d req/s, %d connections, 100 B GET/SET 9:1", q.name, o.latRate, o.latConns),
			micros(d), micros(p), added(d, p), "—", "info")
	}
	for _, q := range r.latRows() {
		if len(r.latBare.samples) == 0 {
			break
		}
		d, b := r.latDirect.pct(q.p), r.latBare.pct(q.p)
		row("2", fmt.Sprintf("reference: latency %s through the bare forwarder (not kvthrottle), same load", q.name),
			micros(d), micros(b), added(d, b), "—", "info")
	}

	for _, q := range r.latRows() {
		if len(r.latBefore.samples) == 0 {
			break
		}
		d, b, p := r.latDirect.pct(q.p), r.latBefore.pct(q.p), r.latProxy.pct(q.p)
		row("2", fmt.Sprintf("before and after: latency %s through kvthrottle %s (before) and %s (this one), same load", q.name, bareVersion(r.beforeVersion), bareVersion(r.version)),
			"before: "+micros(b)+" ("+added(d, b)+")", micros(p)+" ("+added(d, p)+")", added(b, p), "—", "info")
	}

	// 3. Go benchmarks.
	gb := r.gobench
	if gb == nil {
		gb = &goBench{}
	}
	for _, bm := range gb.results {
		ns, _ := bm.med("ns/op")
		bytes, hasB := bm.med("B/op")
		allocs, hasA := bm.med("allocs/op")
		var ours []string
		if ns >= 1e9 {
			ours = append(ours, fmt.Sprintf("%.1f s/op", ns/1e9))
		} else {
			ours = append(ours, num(ns)+" ns/op")
		}
		for _, u := range bm.custom() {
			v, _ := bm.med(u)
			ours = append(ours, num(v)+" "+u)
		}
		if hasB {
			ours = append(ours, num(bytes)+" B/op")
		}
		if hasA {
			ours = append(ours, num(allocs)+" allocs/op")
		}
		base, ratio, target, result := "—", "—", "—", "info"
		timed := false // the verdict compares times, which depend on load
		switch {
		case bm.refKind == "bare" && bm.ref != nil:
			refNs, _ := bm.ref.med("ns/op")
			base = fmt.Sprintf("%s: %s ns/op", bm.ref.name, num(refNs))
			ratio = fmt.Sprintf("%.2fx ns/op (%.2fx throughput)", ns/refNs, refNs/ns)
			target = "(reference: the bare forwarder)"
		case bm.isReference():
			target = "(baseline)"
		case bm.hotPath():
			target = "0 allocs/op"
			ok := hasA && allocs == 0
			if bm.ref != nil {
				refNs, _ := bm.ref.med("ns/op")
				switch bm.ref.refKind {
				case "AllowN":
					base = fmt.Sprintf("AllowN: %s ns/op", num(refNs))
					ratio = fmt.Sprintf("%.2fx", ns/refNs)
					target += "; faster than AllowN (< 1.00x)"
					ok = ok && ns < refNs
				default:
					base = fmt.Sprintf("%s: %s ns/op", bm.ref.name, num(refNs))
					ratio = fmt.Sprintf("%.2fx ns/op (%.2fx throughput)", ns/refNs, refNs/ns)
					if bm.name == "ProxyPipelined" {
						target += "; ≤ 1.30x DirectPipelined (issue 17)"
						ok = ok && ns <= 1.30*refNs
						timed = true
					}
				}
			}
			if timed || bm.ref != nil && bm.ref.refKind == "AllowN" {
				result = r.verdictUnder(ok, r.benchLoad) // a timing comparison
			} else {
				result = r.verdict(ok) // allocations do not depend on load
			}
		default:
			target = "— (simulation, not per request)"
		}
		name := fmt.Sprintf("`%s` %s", bm.pkg, bm.name)
		if bm.once {
			name += " (one run, -benchtime 1x)"
		} else {
			name += fmt.Sprintf(" (median of %d)", len(bm.samples["ns/op"]))
		}
		row("3", name, base, strings.Join(ours, " · "), ratio, target, result)
	}

	// 4. Memory.
	if m := r.mem; m != nil {
		row("4", "proxy resident memory (VmRSS), started fresh, before connecting", "—", fmt.Sprintf("%.1f MB", mb(m.rssBeforeKB)), "—", "—", "info")
		perConn := float64(m.rssAfterKB-m.rssBeforeKB) * 1024 / float64(m.conns) / 1000
		row("4", fmt.Sprintf("proxy resident memory (VmRSS) holding %s idle client connections", thousands(float64(m.conns))), "—",
			fmt.Sprintf("%.1f MB (peak VmHWM %.1f MB; %s fds open)", mb(m.rssAfterKB), mb(m.hwmKB), thousands(float64(m.fdsWith))),
			fmt.Sprintf("+%.1f kB per connection", perConn), "< 200 MB", r.verdict(mb(m.rssAfterKB) < 200))
	}

	// 5. Text protocol throughput.
	r.textRows(row)

	// 6. TLS against plaintext.
	r.tlsRows(row)

	w("\n**%d PASS, %d FAIL**", r.pass, r.fail)
	if r.unreliable > 0 {
		w(" (%d of them measured while other processes used ≥ %d%% of the CPU: unreliable)", r.unreliable, noisyPct)
	}
	w(". \"kvthrottle vs baseline\": proxy/direct throughput, proxy − direct latency, our ns/op over the baseline's. MB = 10^6 bytes. Configuration of each section:\n\n")

	if o.has('1') {
		r.captionThroughput(w)
	}
	if o.has('2') {
		w("2. **Latency**: this program's own load generator (binary protocol, Go): %d connections, each sending one request every %v (%d req/s in all, well below saturation) and waiting for its response; "+
			"100-byte values, GET:SET = 9:1 over %d keys set beforehand; %s of warm-up, then %s measured, first directly, then through the same proxy as section 1, then through the bare forwarder; "+
			"latency = from just before the request's write to the end of its response (%s samples direct, %s through the proxy).\n",
			o.latConns, time.Duration(float64(time.Second)*float64(o.latConns)/float64(o.latRate)), o.latRate, latKeys,
			map[bool]string{true: "0.5 s", false: "1 s"}[o.quick], o.latDur, thousands(float64(len(r.latDirect.samples))), thousands(float64(len(r.latProxy.samples))))
	}
	if o.has('3') {
		r.captionGoBench(w)
	}
	if m := r.mem; m != nil {
		w("4. **Memory**: a second proxy, started fresh with the same configuration (max_connections = 20000); %s TCP connections opened to it from this program, each sending one NOOP and reading its response, then left idle; "+
			"VmRSS of the proxy from /proc/PID/status, 1 s after the last connection (before: 0.5 s after start). RLIMIT_NOFILE raised to %d with setrlimit, inherited by the proxy.\n",
			thousands(float64(m.conns)), r.nofile)
	}
	if o.has('5') {
		r.captionText(w)
	}
	if o.has('6') {
		r.captionTLS(w)
	}
	if r.proxyConfig != "" {
		w("\n<details><summary>generated proxy configuration</summary>\n\n```toml\n%s```\n</details>\n", r.proxyConfig)
	}
	if r.twemConfig != "" {
		w("\n<details><summary>generated twemproxy (nutcracker) configuration</summary>\n\n```yaml\n%s```\n</details>\n", r.twemConfig)
	}
	return b.String()
}

func (r *report) captionThroughput(w func(string, ...any)) {
	o := r.opts
	var gets, sets int64
	var missD, missP int64
	for _, t := range r.throughput {
		gets += t.gets
		sets += t.sets
		missD += t.getMisses[sideDirect]
		missP += t.getMisses[sideProxy] + t.getMisses[sideBare]
	}
	w("1. **Throughput**: `%s -s ADDR -B -T %d -c CONNS -X VALUE_BYTES -w %s -t %ds`, plus `-d KEYS` in the multi-get cases (memcaslap then sends each GET as KEYS binary GETs written at once, a pipelining client), ADDR being memcached itself, the kvthrottle proxy in front of it, or the bare forwarder in front of it. "+
		"memcaslap's default command mix, set:get = 1:9 (measured over all runs: %s gets, %s sets; get misses: %s direct, %s through a forwarder); "+
		"keys as memcaslap generates them (the proxy prefixes them with the bucket's namespace). "+
		"%d rounds per case of one run per side, the order rotating every round, after a 1 s warm-up run each way; the cells give the median TPS memcaslap reports (\"TPS:\") and the (min–max) of the runs. "+
		"memcached: `%s`. Proxy: `%s serve --config FILE` with the configuration below (throttling on, limits far above what is reached). "+
		"The %d cores are shared by memcached (2 threads), the proxy and memcaslap (%d threads); nothing is pinned.\n",
		r.tools.memaslap, o.threads, o.window, int(o.duration.Seconds()), thousands(float64(gets)), thousands(float64(sets)),
		thousands(float64(missD)), thousands(float64(missP)), o.rounds, strings.Join(r.mcArgs, " "), shortPath(o.bin), r.machine.cores, o.threads)
	w("   The **bare forwarder** (`internal/bareforward`, run as `benchtable -bare-forwarder`) is a reference, not a product: the cheapest forwarder we know how to write — " +
		"raw epoll on locked threads, one per core, no parsing beyond the header, no throttling or tenants, the ready clients' requests sent upstream in one write per pass and each client's responses in one write. " +
		"It pays what any proxy must, a second read and write per request on the client sockets, and nothing else; where kvthrottle is close to it, what is left of the gap to direct memcached is the cost of putting any process in the path on this machine.\n")
	if r.beforeVersion != "" {
		w("   **Before and after** (`-before-bin %s`): a second kvthrottle process, built from an earlier commit (%s), with the same generated configuration in front of the same memcached, run as a fourth side in the same rotating rounds (and in section 2 after the others), so that both versions' figures come from one run and share its noise; the ratio is this version's median over the earlier one's.\n",
			shortPath(o.beforeBin), bareVersion(r.beforeVersion))
	}
	var perCase []string
	for _, t := range r.throughput {
		perCase = append(perCase, fmt.Sprintf("%s %s (one run at most %.0f%%)", t.tpCase, t.load, t.maxForeign))
	}
	w("   Other processes' CPU per case: %s. "+
		"Server CPU time per request: the user+system CPU time memcached and the forwarder used during the runs (/proc/PID/stat) over the operations memcaslap counted; memcaslap's own from its rusage. "+
		"Unlike throughput it hardly depends on what else runs on the machine, and with every core busy, throughput is about inversely proportional to the CPU time spent per request by all processes, memcaslap's included: "+
		"the \"throughput bound\" is direct's total over the proxy's.\n",
		strings.Join(perCase, "; "))
}

func (r *report) captionGoBench(w func(string, ...any)) {
	gb := r.gobench
	procs := "GOMAXPROCS default"
	if gb.procs != "" {
		procs = "GOMAXPROCS " + gb.procs + " (the \"-" + gb.procs + "\" suffix is left out of the names)"
	}
	w("3. **Go benchmarks**: in each package with benchmarks (found with `go test -list '^Benchmark' ./...`: %s), first `%s` to find the timed simulations "+
		"(one iteration ≥ 1 s: they are meant to run once and are reported from this pass), then `%s` for all the others; run with nothing else of ours running; "+
		"medians over the runs; %s. The AdmitCharge benchmarks start exactly the number of goroutines in their name whatever GOMAXPROCS is, so -cpu is not needed. "+
		"\"vs baseline\" is our median ns/op over that of the x/time/rate `Limiter.AllowN` benchmark with the same other name elements, "+
		"or over that of the Direct… benchmark for a Proxy… one (same client load on memcached itself); a Bare… benchmark is that load through the bare forwarder of section 1, shown against Direct… for reference. "+
		"0 allocs/op is required of every per-request benchmark (the proxy runs inside the test binary of `./proxy`, so its allocations are counted); benchmarks reporting their own metrics are simulations. Took %s.\n",
		strings.Join(wrapCode(gb.pkgs), ", "), gb.cmd1, gb.cmd, procs, gb.duration.Round(time.Second))
}

func wrapCode(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = "`" + v + "`"
	}
	return out
}

// shortPath shows a path relative to the working directory when inside it.
func shortPath(p string) string {
	wd, err := os.Getwd()
	if err == nil {
		if rel, ok := strings.CutPrefix(p, wd+"/"); ok {
			return rel
		}
	}
	return p
}

func (r *report) latRows() []struct {
	name string
	p    float64
} {
	if !r.opts.has('2') {
		return nil
	}
	return []struct {
		name string
		p    float64
	}{{"p50", 0.50}, {"p99", 0.99}, {"p99.9", 0.999}}
}

// shellQuote quotes a for a POSIX shell when it needs it.
func shellQuote(a string) string {
	if a != "" && strings.Trim(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:=,+-") == "" {
		return a
	}
	return "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
}

// bareVersion is a `kvthrottle version` output without the program name.
func bareVersion(v string) string { return strings.TrimSpace(strings.TrimPrefix(v, "kvthrottle")) }
