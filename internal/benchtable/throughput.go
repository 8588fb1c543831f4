package main

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

type tpCase struct {
	value int // bytes
	conns int // memcaslap concurrency (connections)
}

var tpCases = []tpCase{{100, 32}, {100, 256}, {4096, 32}, {4096, 256}}

type tpResult struct {
	tpCase
	direct, proxy []float64 // TPS per run, in run order
	getMisses     [2]int64  // direct, proxy (sum over runs)
	gets, sets    int64     // over every run
	load          cpuLoad   // CPU used by other processes during the case
	maxForeign    float64   // the most of any run

	// CPU time (jiffies) of memcached and the proxy over the runs, and the
	// operations memcaslap counted: index 0 direct, 1 through the proxy.
	mcCPU, pxCPU [2]int64
	ops          [2]int64
}

// cpuPerOp returns the CPU time per operation of memcached and of the
// proxy, in µs (/proc counts in 1/100 s).
func (t *tpResult) cpuPerOp(side int) (mc, px float64) {
	if t.ops[side] == 0 {
		return 0, 0
	}
	per := 1e6 / 100 / float64(t.ops[side])
	return float64(t.mcCPU[side]) * per, float64(t.pxCPU[side]) * per
}

type maslapRun struct {
	tps                 float64
	gets, sets, getMiss int64
	output              string
}

var (
	reTPS  = regexp.MustCompile(`TPS:\s*([0-9.]+)`)
	reStat = regexp.MustCompile(`(?m)^(cmd_get|cmd_set|get_misses):\s*([0-9]+)`)
)

// memaslapArgs is the memcaslap command line of one run.
func memaslapArgs(o *options, addr string, c tpCase) []string {
	return []string{"-s", addr, "-B", "-T", strconv.Itoa(o.threads), "-c", strconv.Itoa(c.conns),
		"-X", strconv.Itoa(c.value), "-w", o.window, "-t", fmt.Sprintf("%ds", int(o.duration.Seconds()))}
}

func memaslap(ctx context.Context, path string, args []string, timeout time.Duration) (maslapRun, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := shortCommand(ctx, path, args...)
	r := maslapRun{output: out}
	if err != nil {
		return r, fmt.Errorf("memcaslap %s: %v; output:\n%s", strings.Join(args, " "), err, out)
	}
	m := reTPS.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return r, fmt.Errorf("memcaslap %s: no TPS in its output:\n%s", strings.Join(args, " "), out)
	}
	r.tps, _ = strconv.ParseFloat(m[len(m)-1][1], 64)
	for _, s := range reStat.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseInt(s[2], 10, 64)
		switch s[1] {
		case "cmd_get":
			r.gets = v
		case "cmd_set":
			r.sets = v
		case "get_misses":
			r.getMiss = v
		}
	}
	if r.tps <= 0 {
		return r, fmt.Errorf("memcaslap %s: zero throughput; output:\n%s", strings.Join(args, " "), out)
	}
	return r, nil
}

// runThroughput alternates direct and proxied memcaslap runs (the order
// flips every pair so drift does not favour either side).
func runThroughput(ctx context.Context, o *options, t tools, mc *memcached, px *proxyProc, rep *report) error {
	direct, proxied := mc.addr, px.addr
	live := []int{mc.pid(), px.pid()}
	section := takeCPU(live...)
	timeout := o.duration + 60*time.Second
	// Warm-up: one short run each way, not counted.
	wo := *o
	wo.duration = time.Second
	for _, addr := range []string{direct, proxied} {
		if _, err := memaslap(ctx, t.memaslap, memaslapArgs(&wo, addr, tpCase{100, 32}), timeout); err != nil {
			return err
		}
	}
	for _, c := range tpCases {
		res := &tpResult{tpCase: c}
		caseStart := takeCPU(live...)
		for i := 0; i < o.pairs; i++ {
			order := []bool{false, true} // proxy?
			if i%2 == 1 {
				order = []bool{true, false}
			}
			for _, viaProxy := range order {
				addr := direct
				if viaProxy {
					addr = proxied
				}
				before := takeCPU(live...)
				mc0, _ := procCPU(strconv.Itoa(mc.pid()), false)
				px0, _ := procCPU(strconv.Itoa(px.pid()), false)
				r, err := memaslap(ctx, t.memaslap, memaslapArgs(o, addr, c), timeout)
				if err != nil {
					return err
				}
				mc1, _ := procCPU(strconv.Itoa(mc.pid()), false)
				px1, _ := procCPU(strconv.Itoa(px.pid()), false)
				side := 0
				if viaProxy {
					side = 1
				}
				res.mcCPU[side] += mc1 - mc0
				res.pxCPU[side] += px1 - px0
				res.ops[side] += r.gets + r.sets
				if l := loadBetween(before, takeCPU(live...)); l.ok {
					res.maxForeign = max(res.maxForeign, l.foreignPct)
				}
				res.gets += r.gets
				res.sets += r.sets
				if viaProxy {
					res.proxy = append(res.proxy, r.tps)
					res.getMisses[1] += r.getMiss
				} else {
					res.direct = append(res.direct, r.tps)
					res.getMisses[0] += r.getMiss
				}
			}
		}
		res.load = loadBetween(caseStart, takeCPU(live...))
		logf("throughput %s, %d conns: direct %.0f, proxy %.0f ops/s (medians of %d): %.2fx; other processes' CPU %s (at most %.0f%% in one run)",
			sizeName(c.value), c.conns, median(res.direct), median(res.proxy), o.pairs, median(res.proxy)/median(res.direct), res.load, res.maxForeign)
		rep.throughput = append(rep.throughput, res)
	}
	rep.tpLoad = loadBetween(section, takeCPU(live...))
	return nil
}

func sizeName(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%d KB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
