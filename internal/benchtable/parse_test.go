package main

import (
	"slices"
	"strings"
	"testing"
)

const sampleBench = `goos: linux
goarch: amd64
pkg: github.com/kvthrottle/kvthrottle/throttle
cpu: AMD EPYC
BenchmarkAdmitCharge/engine/goroutines=1-2         	28661965	        42.16 ns/op	       0 B/op	       0 allocs/op
BenchmarkAdmitCharge/x-time-rate-AllowN/goroutines=1-2         	17900385	        67.45 ns/op	       0 B/op	       0 allocs/op
BenchmarkAdmitCharge/engine/goroutines=1-2         	28661965	        44.00 ns/op	       0 B/op	       0 allocs/op
BenchmarkAdmitCharge/x-time-rate-AllowN/goroutines=1-2         	17900385	        69.45 ns/op	       0 B/op	       0 allocs/op
BenchmarkAccuracy/hard-limit-2                                 	     100	  11894715 ns/op	         0 rate_err_%	    8352 B/op	      33 allocs/op
BenchmarkSlow-2
some log line
BenchmarkSlow-2 	       1	10000872357 ns/op	         0.10 rate_err_%	 8514232 B/op	  189048 allocs/op
BenchmarkProxyPipelined-2 	  500000	      1599 ns/op	       0 B/op	       0 allocs/op
BenchmarkDirectPipelined-2 	  500000	      1197 ns/op	       0 B/op	       0 allocs/op
BenchmarkBarePipelined-2 	  500000	      1300 ns/op	       0 B/op	       0 allocs/op
PASS
ok  	github.com/kvthrottle/kvthrottle/throttle	13.629s
`

func TestParseAndPair(t *testing.T) {
	res := parseBench("./throttle", sampleBench, "2")
	var names []string
	for _, b := range res {
		names = append(names, b.name)
	}
	want := []string{"AdmitCharge/engine/goroutines=1", "AdmitCharge/x-time-rate-AllowN/goroutines=1", "Accuracy/hard-limit", "Slow", "ProxyPipelined", "DirectPipelined", "BarePipelined"}
	if !slices.Equal(names, want) {
		t.Fatalf("names %q, want %q", names, want)
	}
	if ns, _ := res[0].med("ns/op"); ns != 43.08 {
		t.Errorf("median ns/op %v, want 43.08", ns)
	}
	if got := res[2].custom(); !slices.Equal(got, []string{"rate_err_%"}) {
		t.Errorf("custom units %q", got)
	}

	g := &goBench{results: res}
	g.sortAndPair()
	if res[0].ref != res[1] || !res[1].isReference() || !res[0].hotPath() {
		t.Errorf("engine not paired with AllowN")
	}
	if res[4].ref != res[5] || res[5].refKind != "direct" {
		t.Errorf("ProxyPipelined not paired with DirectPipelined")
	}
	if res[6].ref != res[5] || res[6].refKind != "bare" || res[6].hotPath() {
		t.Errorf("BarePipelined not a reference shown against DirectPipelined")
	}
	if res[2].hotPath() || res[3].hotPath() {
		t.Errorf("simulations taken for hot-path benchmarks")
	}

	pats, long := benchPatterns(res)
	if len(long) != 1 || long[0].name != "Slow" {
		t.Fatalf("long %v", long)
	}
	if want := []string{"^Benchmark(AdmitCharge|Accuracy|ProxyPipelined|DirectPipelined|BarePipelined)$"}; !slices.Equal(pats, want) {
		t.Errorf("patterns %q, want %q", pats, want)
	}
}

func TestBenchPatternsMixedSubs(t *testing.T) {
	res := parseBench("./x", `BenchmarkA/fast-2 	100	10 ns/op
BenchmarkA/slow-2 	1	2000000000 ns/op
BenchmarkB-2 	100	10 ns/op
`, "2")
	pats, long := benchPatterns(res)
	if len(long) != 1 || long[0].name != "A/slow" {
		t.Fatalf("long %v", long)
	}
	if want := []string{"^Benchmark(B)$", "^BenchmarkA$/^(fast)$"}; !slices.Equal(pats, want) {
		t.Errorf("patterns %q, want %q", pats, want)
	}
}

func TestMemaslapOutput(t *testing.T) {
	out := `servers: 127.0.0.1:23456
cmd_get: 301013
cmd_set: 33460
get_misses: 7

Run time: 3.0s Ops: 334473 TPS: 111481 Net_rate: 23.0M/s
`
	m := reTPS.FindAllStringSubmatch(out, -1)
	if len(m) != 1 || m[0][1] != "111481" {
		t.Fatalf("TPS %q", m)
	}
	if n := len(reStat.FindAllStringSubmatch(out, -1)); n != 3 {
		t.Errorf("%d stats", n)
	}
}

func TestFormatting(t *testing.T) {
	for in, want := range map[float64]string{1234567: "1,234,567", 999: "999", -1234: "-1,234"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
	if got := shellQuote("-quick"); got != "-quick" {
		t.Errorf("shellQuote: %q", got)
	}
	if got := shellQuote(""); got != "''" {
		t.Errorf("shellQuote empty: %q", got)
	}
	if !strings.Contains(proxyConfig("a", "b", "c"), "capacity = 100000000") {
		t.Error("config")
	}
}
