package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Section 6 (issue 15): the proxy's TLS listener against its plaintext
// one, in the same process. memcaslap has no TLS, so the load comes from
// this program (Go, binary protocol) on the same two cores.

// The sides of a section-6 comparison.
const (
	tlsSideDirect = iota // memcached itself (reference)
	tlsSidePlain         // kvthrottle's proxy.listen
	tlsSideTLS           // kvthrottle's [tls] listen
	numTLSSides
)

var tlsSideNames = [numTLSSides]string{"direct", "plaintext", "TLS"}

// tlsCase is one throughput comparison: conns connections, each keeping
// depth requests in flight.
type tlsCase struct{ conns, depth int }

// tlsCases are the throughput comparisons: one request at a time per
// connection, as memcaslap and section 1 do, at 32 and 256 connections;
// and, when depth > 1, 32 connections each writing depth requests at once.
func tlsCases(depth int) []tlsCase {
	cs := []tlsCase{{32, 1}, {256, 1}}
	if depth > 1 {
		cs = append(cs, tlsCase{32, depth})
	}
	return cs
}

// dialWorkers bounds the handshakes this program runs at once: the proxy
// closes at once a source's connections beyond 32 handshakes in progress.
const dialWorkers = 16

type tlsTpResult struct {
	tlsCase
	tps [numTLSSides][]float64 // ops/s per run, in run order
	// Over the measured part of every run: operations completed, and the
	// CPU time (jiffies) of the proxy, memcached and this program.
	ops                  [numTLSSides]int64
	pxCPU, mcCPU, lgCPU  [numTLSSides]int64
	load                 cpuLoad
	maxForeign           float64
	version, cipherSuite string // negotiated by the TLS runs
}

// cpuPerOp returns the CPU time per operation of the proxy, memcached and
// the load generator on side, in µs (/proc counts in 1/100 s).
func (t *tlsTpResult) cpuPerOp(side int) (px, mc, lg float64) {
	if t.ops[side] == 0 {
		return 0, 0, 0
	}
	per := 1e6 / 100 / float64(t.ops[side])
	return float64(t.pxCPU[side]) * per, float64(t.mcCPU[side]) * per, float64(t.lgCPU[side]) * per
}

// tlsMemPoint is one measurement of the proxy holding conns idle TLS
// connections.
type tlsMemPoint struct {
	conns int
	rssKB int64
	fds   int
}

type tlsMemResult struct {
	requested            int   // -tls-idle-conns
	fdSoft, fdHard       int64 // the proxy's RLIMIT_NOFILE, from /proc/PID/limits
	fdsBefore            int
	rssBeforeKB, hwmKB   int64
	points               []tlsMemPoint // in the order measured, the most connections last
	fdsPerConn           float64       // measured at the last point
	extrapolated         bool          // the requested count did not fit: estimated from the points
	estimateKB           int64         // RSS at requested (measured, or extrapolated)
	slopeKB              float64       // RSS per connection between the points, kB
	fitReason            string        // why fewer than requested, for the table
	version, cipherSuite string
}

// tlsBench holds what section 6 measured.
type tlsBench struct {
	depth      int // of the pipelined throughput case; 1: none
	throughput []*tlsTpResult
	lat        [numTLSSides]latResult
	latRounds  int
	latLoad    cpuLoad
	mem        *tlsMemResult
	tpLoad     cpuLoad
	tomlTLS    string
}

// tlsDialers returns the three sides' dialers.
func tlsDialers(mc *memcached, px *proxyProc, certs *benchCerts) [numTLSSides]dialer {
	var d [numTLSSides]dialer
	d[tlsSideDirect] = tcpDialer(mc.addr)
	d[tlsSidePlain] = tcpDialer(px.addr)
	d[tlsSideTLS] = tlsDialer(px.tlsAddr, certs.client)
	return d
}

// runTLSThroughput runs the closed-loop load generator against memcached,
// kvthrottle's plaintext listener and its TLS listener, o.rounds rounds per
// connection count, the order rotating every round, after a warm-up run
// each way.
func runTLSThroughput(ctx context.Context, o *options, mc *memcached, px *proxyProc, certs *benchCerts, rep *report) error {
	tb := rep.tls
	live := []int{mc.pid(), px.pid()}
	section := takeCPU(live...)
	defer func() { tb.tpLoad = loadBetween(section, takeCPU(live...)) }()
	for _, addr := range []string{mc.addr, px.addr} {
		if err := populate(addr); err != nil {
			return fmt.Errorf("TLS throughput: populate %s: %w", addr, err)
		}
	}
	dials := tlsDialers(mc, px, certs)
	pids := loadPids{proxy: px.pid(), memcached: mc.pid()}
	for side := range numTLSSides {
		if _, err := closedLoop(ctx, dials[side], 32, 1, 200*time.Millisecond, 800*time.Millisecond, pids); err != nil {
			return fmt.Errorf("TLS throughput: warm-up %s: %w", tlsSideNames[side], err)
		}
	}
	for _, c := range tlsCases(tb.depth) {
		res := &tlsTpResult{tlsCase: c}
		caseStart := takeCPU(live...)
		for i := 0; i < o.rounds; i++ {
			for k := range numTLSSides {
				side := (i + k) % numTLSSides
				before := takeCPU(live...)
				run, err := closedLoop(ctx, dials[side], c.conns, c.depth, 500*time.Millisecond, o.duration, pids)
				if err != nil {
					return fmt.Errorf("TLS throughput, %d connections, depth %d, %s: %w", c.conns, c.depth, tlsSideNames[side], err)
				}
				if l := loadBetween(before, takeCPU(live...)); l.ok {
					res.maxForeign = max(res.maxForeign, l.foreignPct)
				}
				res.tps[side] = append(res.tps[side], float64(run.ops)/o.duration.Seconds())
				res.ops[side] += run.ops
				res.mcCPU[side] += run.mcCPU
				res.lgCPU[side] += run.selfCPU
				if side != tlsSideDirect {
					res.pxCPU[side] += run.pxCPU
				}
				if side == tlsSideTLS {
					res.version, res.cipherSuite = run.version, run.cipherSuite
				}
			}
		}
		res.load = loadBetween(caseStart, takeCPU(live...))
		p := median(res.tps[tlsSidePlain])
		logf("TLS throughput, %d conns, depth %d (medians of %d): direct %.0f, plaintext %.0f, TLS %.0f ops/s (TLS/plaintext %.2fx); other processes' CPU %s (at most %.0f%% in one run)",
			c.conns, c.depth, o.rounds, median(res.tps[tlsSideDirect]), p, median(res.tps[tlsSideTLS]), median(res.tps[tlsSideTLS])/p, res.load, res.maxForeign)
		tb.throughput = append(tb.throughput, res)
	}
	return nil
}

// loadPids are the processes whose CPU time a run counts.
type loadPids struct{ proxy, memcached int }

type loadRun struct {
	ops                   int64 // completed in the measured window
	pxCPU, mcCPU, selfCPU int64 // jiffies over the measured window
	version, cipherSuite  string
}

// closedLoop opens conns connections with dial, then each sends depth
// requests at a time (100-byte values, GET:SET 9:1 over the keys populate
// set), waits for their responses and sends the next, for warm + measure;
// it counts the responses completed during measure and the CPU time the
// given processes and this one used meanwhile.
func closedLoop(ctx context.Context, dial dialer, conns, depth int, warm, measure time.Duration, pids loadPids) (loadRun, error) {
	var run loadRun
	cs, err := openConns(ctx, dial, conns, nil)
	defer func() {
		for _, c := range cs {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err != nil {
		return run, err
	}
	if tc, ok := cs[0].(*tls.Conn); ok {
		st := tc.ConnectionState()
		run.version, run.cipherSuite = tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite)
	}
	start := time.Now()
	warmEnd := start.Add(warm)
	end := warmEnd.Add(measure)
	stop := context.AfterFunc(ctx, func() {
		for _, c := range cs {
			c.Close()
		}
	})
	defer stop()

	var (
		counted  atomic.Int64
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for id, c := range cs {
		_ = c.SetDeadline(end.Add(10 * time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(id), 7))
			r := bufio.NewReaderSize(c, 16<<10)
			val := make([]byte, latValueSize)
			buf := make([]byte, 0, depth*(headerLen+40+latValueSize))
			var hdr [headerLen]byte
			var n int64
			for seq := uint32(0); ; {
				now := time.Now()
				if !now.Before(end) {
					break
				}
				buf = buf[:0]
				first := seq
				for range depth {
					key := latKey(rng.IntN(latKeys))
					if rng.IntN(latSetEvery) == 0 {
						buf = appendRequest(buf, opSet, seq, setExtras, key, val)
					} else {
						buf = appendRequest(buf, opGet, seq, nil, key, nil)
					}
					seq++
				}
				if _, err := c.Write(buf); err != nil {
					setErr(&mu, &firstErr, err)
					return
				}
				for k := range depth {
					st, opaque, err := readResponse(r, &hdr)
					if err != nil {
						setErr(&mu, &firstErr, err)
						return
					}
					if st != 0 || opaque != first+uint32(k) {
						setErr(&mu, &firstErr, fmt.Errorf("response status 0x%x opaque %d, want 0 and %d", st, opaque, first+uint32(k)))
						return
					}
				}
				if done := time.Now(); !done.Before(warmEnd) && done.Before(end) {
					n += int64(depth)
				}
			}
			counted.Add(n)
		}()
	}
	// CPU time over the measured window.
	sleepUntil(ctx, warmEnd)
	px0, mc0, self0 := cpuOf(pids.proxy), cpuOf(pids.memcached), selfCPU()
	sleepUntil(ctx, end)
	run.pxCPU, run.mcCPU, run.selfCPU = cpuOf(pids.proxy)-px0, cpuOf(pids.memcached)-mc0, selfCPU()-self0
	wg.Wait()
	if ctx.Err() != nil {
		return run, ctx.Err()
	}
	if firstErr != nil {
		return run, firstErr
	}
	run.ops = counted.Load()
	return run, nil
}

func sleepUntil(ctx context.Context, t time.Time) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Until(t)):
	}
}

// cpuOf is the user+system CPU time of pid in jiffies, 0 if unknown.
func cpuOf(pid int) int64 {
	v, _ := procCPU(strconv.Itoa(pid), false)
	return v
}

// selfCPU is this process's own user+system CPU time in jiffies.
func selfCPU() int64 {
	v, _ := procCPU("self", false)
	return v
}

// openConns opens n connections with dial, dialWorkers at a time; when
// first is not nil, each sends it and reads one response with status 0.
// It returns the connections opened so far also on error (the caller
// closes them); an error ends the opening.
func openConns(ctx context.Context, dial dialer, n int, first []byte) ([]net.Conn, error) {
	cs := make([]net.Conn, n)
	var (
		next     atomic.Int64
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	for range min(dialWorkers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				failed := firstErr != nil
				mu.Unlock()
				i := int(next.Add(1) - 1)
				if failed || i >= n {
					return
				}
				c, err := dial()
				if err != nil {
					setErr(&mu, &firstErr, fmt.Errorf("connection %d: %w", i, err))
					return
				}
				cs[i] = c
				if first == nil {
					continue
				}
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				st, err := roundTrip(c, bufio.NewReaderSize(c, 64), first)
				if err == nil && st != 0 {
					err = fmt.Errorf("status 0x%x", st)
				}
				if err != nil {
					setErr(&mu, &firstErr, fmt.Errorf("connection %d: %w", i, err))
					return
				}
				_ = c.SetDeadline(time.Time{})
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return cs, firstErr
	}
	return cs, ctx.Err()
}

// runTLSLatency measures the latency of section 2's fixed, moderate
// request rate directly, through kvthrottle's plaintext listener and
// through its TLS listener, in rounds of one run per side, the order
// rotating; each side's samples are pooled over the rounds.
func runTLSLatency(ctx context.Context, o *options, mc *memcached, px *proxyProc, certs *benchCerts, rep *report) error {
	tb := rep.tls
	live := []int{mc.pid(), px.pid()}
	section := takeCPU(live...)
	defer func() { tb.latLoad = loadBetween(section, takeCPU(live...)) }()
	warm := time.Second
	if o.quick {
		warm = 500 * time.Millisecond
	}
	dials := tlsDialers(mc, px, certs)
	for i := 0; i < tb.latRounds; i++ {
		for k := range numTLSSides {
			side := (i + k) % numTLSSides
			res, err := fixedRate(ctx, dials[side], o.latConns, o.latRate, warm, o.latDur)
			if err != nil {
				return fmt.Errorf("TLS latency, %s: %w", tlsSideNames[side], err)
			}
			acc := &tb.lat[side]
			acc.samples = append(acc.samples, res.samples...)
			acc.requests += res.requests
			acc.elapsed += res.elapsed
		}
	}
	for side := range numTLSSides {
		res := &tb.lat[side]
		slices.Sort(res.samples)
		logf("TLS section latency %s: %d requests at %.0f/s, p50 %v, p99 %v", tlsSideNames[side], len(res.samples),
			float64(res.requests)/res.elapsed.Seconds(), res.pct(0.50), res.pct(0.99))
	}
	return nil
}

// addedRatio is (tls - direct) / (plain - direct): how much more latency
// TLS adds than plaintext does; ok is false when plaintext adds nothing
// measurable (the ratio would be meaningless).
func addedRatio(direct, plain, tls time.Duration) (ratio float64, ok bool) {
	if plain <= direct {
		return 0, false
	}
	return float64(tls-direct) / float64(plain-direct), true
}

// nofileLimits reads the soft and hard "Max open files" of a process from
// /proc/PID/limits.
func nofileLimits(pid int) (soft, hard int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseNofileLimits(string(b))
}

// parseNofileLimits finds the "Max open files" line of a /proc/PID/limits
// text ("unlimited" is returned as -1).
func parseNofileLimits(text string) (soft, hard int64, err error) {
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, "Max open files")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 2 {
			break
		}
		parse := func(s string) (int64, error) {
			if s == "unlimited" {
				return -1, nil
			}
			return strconv.ParseInt(s, 10, 64)
		}
		if soft, err = parse(f[0]); err != nil {
			return 0, 0, fmt.Errorf("/proc limits, max open files: %w", err)
		}
		if hard, err = parse(f[1]); err != nil {
			return 0, 0, fmt.Errorf("/proc limits, max open files: %w", err)
		}
		return soft, hard, nil
	}
	return 0, 0, errors.New("no \"Max open files\" line")
}

// Each TLS client connection costs the proxy this many file descriptors:
// its socket, enrolled in an event loop once the handshake is done
// (README, "TLS"). The measurement checks it.
const tlsFDsPerConn = 1

// tlsMemPlan decides at how many connections to measure: the requested
// count and half of it when they fit in the proxy's descriptor limit,
// else the largest round count that fits with a margin (1000 descriptors
// or 5% of the limit, whichever is more) and half of it, and why. limit <
// 0 means unlimited. The client ends are in this program, whose own limit
// is clientRoom (free descriptors).
func tlsMemPlan(requested int, limit int64, fdsBefore int, fdsPerConn float64, clientRoom int) (top int, reason string) {
	top = requested
	if limit >= 0 {
		margin := max(1000, limit/20)
		fit := int(float64(limit-int64(fdsBefore)-margin) / fdsPerConn)
		if fit < top {
			top = fit
			reason = fmt.Sprintf("the proxy's RLIMIT_NOFILE is %s and each TLS connection holds %.1f of its descriptors: %s connections need %s",
				thousands(float64(limit)), fdsPerConn, thousands(float64(requested)), thousands(float64(requested)*fdsPerConn+float64(fdsBefore)))
		}
	}
	if clientRoom < top {
		top = clientRoom
		reason = fmt.Sprintf("this program can hold only %s more descriptors", thousands(float64(clientRoom)))
	}
	if top < requested && top >= 2000 {
		top -= top % 1000
	}
	return max(top, 0), reason
}

// extrapolate estimates RSS at n connections on the line through the two
// points (kB), and returns the slope in kB per connection.
func extrapolate(a, b tlsMemPoint, n int) (estimateKB int64, slopeKB float64) {
	if b.conns == a.conns {
		return b.rssKB, 0
	}
	slopeKB = float64(b.rssKB-a.rssKB) / float64(b.conns-a.conns)
	return b.rssKB + int64(slopeKB*float64(n-b.conns)), slopeKB
}

// runTLSMemory opens idle TLS connections to a freshly started proxy
// (each does its handshake, sends one NOOP and reads the response, then
// stays idle) and reads the proxy's VmRSS at half and at all of them. When
// the requested count does not fit in the proxy's descriptor limit, it
// measures at the most that fits and extrapolates linearly to the
// requested count.
func runTLSMemory(ctx context.Context, o *options, px *proxyProc, certs *benchCerts, cl *cleaner, rep *report) error {
	time.Sleep(500 * time.Millisecond)
	pid := px.pid()
	res := &tlsMemResult{requested: o.tlsIdleConns}
	var err error
	if res.fdSoft, res.fdHard, err = nofileLimits(pid); err != nil {
		return fmt.Errorf("TLS memory: the proxy's limits: %w", err)
	}
	if res.rssBeforeKB, err = procStatusKB(pid, "VmRSS"); err != nil {
		return err
	}
	res.fdsBefore = openFDs(pid)
	clientRoom := int(rep.nofile) - openFDs(os.Getpid()) - 200
	top, reason := tlsMemPlan(res.requested, res.fdSoft, res.fdsBefore, tlsFDsPerConn, clientRoom)
	if top < 2 {
		return fmt.Errorf("TLS memory: no room for connections (%s)", reason)
	}
	if reason != "" {
		logf("TLS memory: measuring at %d connections, not %d: %s", top, res.requested, reason)
	}

	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	closeAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		conns = nil
	}
	cl.add(closeAll)
	defer closeAll()

	noop := appendRequest(nil, opNoop, 7, nil, nil, nil)
	dial := tlsDialer(px.tlsAddr, certs.client)
	began := time.Now()
	for _, target := range []int{top / 2, top} {
		mu.Lock()
		have := len(conns)
		mu.Unlock()
		cs, err := openConns(ctx, dial, target-have, noop)
		mu.Lock()
		conns = append(conns, cs...)
		mu.Unlock()
		if err != nil {
			return fmt.Errorf("TLS memory: %d idle connections: %w", target, err)
		}
		if res.version == "" {
			if tc, ok := cs[0].(*tls.Conn); ok {
				st := tc.ConnectionState()
				res.version, res.cipherSuite = tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite)
			}
		}
		time.Sleep(time.Second) // let the proxy settle
		if err := px.ensureAlive(); err != nil {
			return err
		}
		pt := tlsMemPoint{conns: target, fds: openFDs(pid)}
		if pt.rssKB, err = procStatusKB(pid, "VmRSS"); err != nil {
			return err
		}
		res.points = append(res.points, pt)
		logf("TLS memory: %d idle TLS connections (%v): proxy RSS %.1f MB, %d fds open", target, time.Since(began).Round(time.Millisecond), mb(pt.rssKB), pt.fds)
	}
	res.hwmKB, _ = procStatusKB(pid, "VmHWM")
	a, b := res.points[0], res.points[1]
	res.fdsPerConn = float64(b.fds-res.fdsBefore) / float64(b.conns)
	if top < res.requested {
		res.extrapolated = true
		res.fitReason = reason
		res.estimateKB, res.slopeKB = extrapolate(a, b, res.requested)
		logf("TLS memory: extrapolated to %d connections: %.1f MB (%.1f kB per connection)", res.requested, mb(res.estimateKB), res.slopeKB*1.024)
	} else {
		res.estimateKB = b.rssKB
		_, res.slopeKB = extrapolate(a, b, b.conns)
	}
	rep.tls.mem = res
	return nil
}

// runTLSSection runs section 6: a proxy with both listeners for the
// throughput and latency comparisons, then a fresh one for the memory of
// idle TLS connections.
func runTLSSection(ctx context.Context, o *options, mc *memcached, tmp string, cl *cleaner, rep *report) error {
	certs, err := makeBenchCerts(tmp)
	if err != nil {
		return err
	}
	px, err := startProxy(ctx, cl, o.bin, tmp, "tls", mc.addr, certs)
	if err != nil {
		return err
	}
	rep.tls.tomlTLS = certs.toml(px.tlsAddr)
	if rep.proxyConfig == "" {
		rep.proxyConfig = strings.TrimSuffix(px.config, rep.tls.tomlTLS)
	}
	if err := runTLSThroughput(ctx, o, mc, px, certs, rep); err != nil {
		return err
	}
	if err := runTLSLatency(ctx, o, mc, px, certs, rep); err != nil {
		return err
	}
	if err := px.ensureAlive(); err != nil {
		return err
	}
	px.stop()

	px, err = startProxy(ctx, cl, o.bin, tmp, "tls-memory", mc.addr, certs)
	if err != nil {
		return err
	}
	if err := runTLSMemory(ctx, o, px, certs, cl, rep); err != nil {
		return err
	}
	px.stop()
	return nil
}
