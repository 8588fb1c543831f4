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
	div   int // memcaslap -d: keys per multi-get (0: single GETs)
}

// tpCases: the single-GET cases of DESIGN.md section 9, then multi-gets of
// 10 and 50 keys (pipelining clients; issue 17).
var tpCases = []tpCase{
	{value: 100, conns: 32}, {value: 100, conns: 256}, {value: 4096, conns: 32}, {value: 4096, conns: 256},
	{value: 100, conns: 32, div: 10}, {value: 100, conns: 256, div: 10},
	{value: 100, conns: 32, div: 50}, {value: 100, conns: 256, div: 50},
}

// String names the case in the table ("100 B values, 32 connections").
func (c tpCase) String() string {
	s := fmt.Sprintf("%s values, %d connections", sizeName(c.value), c.conns)
	if c.div > 0 {
		s = fmt.Sprintf("multi-gets of %d keys (-d %d), ", c.div, c.div) + s
	}
	return s
}

// The sides of a throughput case: memcached itself, kvthrottle in front of
// it, and the reference forwarder in front of it.
const (
	sideDirect = iota
	sideProxy
	sideBare
	sideBefore // -before-bin: an earlier kvthrottle, when given
	numSides
)

type tpResult struct {
	tpCase
	tps        [numSides][]float64 // TPS per run, in run order
	getMisses  [numSides]int64     // sum over runs
	gets, sets int64               // over every run
	load       cpuLoad             // CPU used by other processes during the case
	maxForeign float64             // the most of any run

	// CPU time (jiffies) of memcached and of the forwarding process
	// (kvthrottle or the bare forwarder) over the runs, memcaslap's own
	// (from its rusage), and the operations memcaslap counted.
	mcCPU, fwdCPU [numSides]int64
	lgCPU         [numSides]time.Duration
	ops           [numSides]int64
}

// cpuPerOp returns the CPU time per operation of memcached, of the
// forwarding process and of memcaslap, in µs (/proc counts in 1/100 s).
func (t *tpResult) cpuPerOp(side int) (mc, fwd, lg float64) {
	if t.ops[side] == 0 {
		return 0, 0, 0
	}
	per := 1e6 / 100 / float64(t.ops[side])
	return float64(t.mcCPU[side]) * per, float64(t.fwdCPU[side]) * per,
		t.lgCPU[side].Seconds() * 1e6 / float64(t.ops[side])
}

type maslapRun struct {
	tps                 float64
	cpu                 time.Duration // memcaslap's user+system time
	gets, sets, getMiss int64
	output              string
}

var (
	reTPS  = regexp.MustCompile(`TPS:\s*([0-9.]+)`)
	reStat = regexp.MustCompile(`(?m)^(cmd_get|cmd_set|get_misses):\s*([0-9]+)`)
)

// memaslapArgs is the memcaslap command line of one run.
func memaslapArgs(o *options, addr string, c tpCase) []string {
	args := []string{"-s", addr, "-B", "-T", strconv.Itoa(o.threads), "-c", strconv.Itoa(c.conns),
		"-X", strconv.Itoa(c.value), "-w", o.window, "-t", fmt.Sprintf("%ds", int(o.duration.Seconds()))}
	if c.div > 0 {
		args = append(args, "-d", strconv.Itoa(c.div))
	}
	return args
}

func memaslap(ctx context.Context, path string, args []string, timeout time.Duration) (maslapRun, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, state, err := runCommand(ctx, "", path, args...)
	r := maslapRun{output: out}
	if state != nil {
		r.cpu = state.UserTime() + state.SystemTime()
	}
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

// tpSides are what one throughput comparison runs memcaslap against, one
// address per side, and the processes whose CPU time it counts: memcached
// and, per side, the forwarder in front of it ("" for direct).
type tpSides struct {
	addrs, fwdPids [numSides]string
	mcPid          string
	live           []int // every long-running process of ours, for takeCPU
}

// warmUp runs memcaslap once for 1 s against every side, 100 B values and
// 32 connections, not counted.
func (s *tpSides) warmUp(ctx context.Context, o *options, t tools, args func(*options, string, tpCase) []string, check func(maslapRun) error) error {
	wo := *o
	wo.duration = time.Second
	for _, addr := range s.addrs {
		if addr == "" {
			continue
		}
		r, err := memaslap(ctx, t.memaslap, args(&wo, addr, tpCase{value: 100, conns: 32}), wo.duration+60*time.Second)
		if err == nil && check != nil {
			err = check(r)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// runCase runs o.rounds rounds of one memcaslap run per side for case c,
// the order rotating every round so drift favours no side. args gives
// memcaslap's command line; check, when not nil, vets each run's output.
func (s *tpSides) runCase(ctx context.Context, o *options, t tools, c tpCase, args func(*options, string, tpCase) []string, check func(maslapRun) error) (*tpResult, error) {
	timeout := o.duration + 60*time.Second
	res := &tpResult{tpCase: c}
	caseStart := takeCPU(s.live...)
	for i := 0; i < o.rounds; i++ {
		for k := range numSides {
			side := (i + k) % numSides
			if s.addrs[side] == "" {
				continue // a side this comparison does not have
			}
			before := takeCPU(s.live...)
			mc0, _ := procCPU(s.mcPid, false)
			var fwd0, fwd1 int64
			if s.fwdPids[side] != "" {
				fwd0, _ = procCPU(s.fwdPids[side], false)
			}
			r, err := memaslap(ctx, t.memaslap, args(o, s.addrs[side], c), timeout)
			if err == nil && check != nil {
				err = check(r)
			}
			if err != nil {
				return nil, err
			}
			mc1, _ := procCPU(s.mcPid, false)
			if s.fwdPids[side] != "" {
				fwd1, _ = procCPU(s.fwdPids[side], false)
			}
			res.mcCPU[side] += mc1 - mc0
			res.fwdCPU[side] += fwd1 - fwd0
			res.lgCPU[side] += r.cpu
			res.ops[side] += r.gets + r.sets
			if l := loadBetween(before, takeCPU(s.live...)); l.ok {
				res.maxForeign = max(res.maxForeign, l.foreignPct)
			}
			res.gets += r.gets
			res.sets += r.sets
			res.tps[side] = append(res.tps[side], r.tps)
			res.getMisses[side] += r.getMiss
		}
	}
	res.load = loadBetween(caseStart, takeCPU(s.live...))
	return res, nil
}

// runThroughput runs memcaslap directly against memcached, through
// kvthrottle and through the bare forwarder, one after the other, the order
// rotating every round so drift favours no side.
func runThroughput(ctx context.Context, o *options, t tools, mc *memcached, px, bare, before *proxyProc, rep *report) error {
	s := &tpSides{mcPid: strconv.Itoa(mc.pid()), live: []int{mc.pid(), px.pid(), bare.pid()}}
	s.addrs[sideDirect], s.addrs[sideProxy], s.addrs[sideBare] = mc.addr, px.addr, bare.addr
	s.fwdPids[sideProxy], s.fwdPids[sideBare] = strconv.Itoa(px.pid()), strconv.Itoa(bare.pid())
	if before != nil {
		s.addrs[sideBefore], s.fwdPids[sideBefore] = before.addr, strconv.Itoa(before.pid())
		s.live = append(s.live, before.pid())
	}
	section := takeCPU(s.live...)
	// Warm-up: one short run each way, not counted.
	if err := s.warmUp(ctx, o, t, memaslapArgs, nil); err != nil {
		return err
	}
	for _, c := range tpCases {
		res, err := s.runCase(ctx, o, t, c, memaslapArgs, nil)
		if err != nil {
			return err
		}
		d := median(res.tps[sideDirect])
		logf("throughput, %s (medians of %d): direct %.0f, kvthrottle %.0f (%.2fx), bare forwarder %.0f (%.2fx) ops/s; other processes' CPU %s (at most %.0f%% in one run)",
			c, o.rounds, d, median(res.tps[sideProxy]), median(res.tps[sideProxy])/d,
			median(res.tps[sideBare]), median(res.tps[sideBare])/d, res.load, res.maxForeign)
		rep.throughput = append(rep.throughput, res)
	}
	rep.tpLoad = loadBetween(section, takeCPU(s.live...))
	return nil
}

func sizeName(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%d KB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
