package main

import (
	"fmt"
	"strings"
	"time"
)

// Section 6's rows and caption. Baseline: kvthrottle's plaintext
// listener; ours: its TLS listener, in the same process.

// The targets of issue 15.
const (
	tlsTargetThroughput = 0.60 // TLS ops/s over plaintext ops/s, at least
	tlsTargetAddedP50   = 1.50 // TLS added p50 over plaintext added p50, at most
	tlsTargetMemMB      = 400  // RSS with the requested idle TLS connections, under
)

// tlsLoad is the CPU other processes used during section 6 (its
// throughput part, the longest).
func (r *report) tlsLoad() cpuLoad {
	if r.tls == nil {
		return cpuLoad{}
	}
	return r.tls.tpLoad
}

func (r *report) tlsRows(row func(...string)) {
	tb := r.tls
	if tb == nil || !r.opts.has('6') {
		return
	}
	for _, t := range tb.throughput {
		p, s := median(t.tps[tlsSidePlain]), median(t.tps[tlsSideTLS])
		ratio := s / p
		target, result := fmt.Sprintf("≥ %.2fx plaintext (issue 15)", tlsTargetThroughput), ""
		if t.depth == 1 {
			result = r.verdictUnder(ratio >= tlsTargetThroughput, t.load)
		} else {
			target, result = "— (pipelined: shown for where the cost goes)", "info"
		}
		row("6", fmt.Sprintf("TLS throughput, 100 B GET/SET 9:1, %s, Go load generator (ops/s, median of %d)", t.name(), len(t.tps[tlsSideTLS])),
			"plaintext: "+spread(t.tps[tlsSidePlain]), "TLS: "+spread(t.tps[tlsSideTLS]), fmt.Sprintf("%.2fx", ratio), target, result)
	}
	for _, t := range tb.throughput {
		d, p := median(t.tps[tlsSideDirect]), median(t.tps[tlsSidePlain])
		row("6", fmt.Sprintf("reference: the same load directly against memcached and through kvthrottle's plaintext listener, %s (ops/s)", t.name()),
			"direct: "+spread(t.tps[tlsSideDirect]), "plaintext: "+spread(t.tps[tlsSidePlain]), fmt.Sprintf("%.2fx", p/d), "—", "info")
	}
	for _, t := range tb.throughput {
		pp, pm, pl := t.cpuPerOp(tlsSidePlain)
		sp, sm, sl := t.cpuPerOp(tlsSideTLS)
		if pp == 0 || sp == 0 {
			continue
		}
		row("6", fmt.Sprintf("CPU time per request, %s (proxy + memcached + load generator)", t.name()),
			fmt.Sprintf("plaintext: %.1f + %.1f + %.1f = %.1f µs", pp, pm, pl, pp+pm+pl),
			fmt.Sprintf("TLS: %.1f + %.1f + %.1f = %.1f µs", sp, sm, sl, sp+sm+sl),
			fmt.Sprintf("proxy %.2fx, all %.2fx (throughput bound %.2fx)", sp/pp, (sp+sm+sl)/(pp+pm+pl), (pp+pm+pl)/(sp+sm+sl)), "—", "info")
	}

	if len(tb.lat[tlsSideTLS].samples) > 0 {
		for _, q := range []struct {
			name   string
			p      float64
			target bool
		}{{"p50", 0.50, true}, {"p99", 0.99, false}} {
			d, p, s := tb.lat[tlsSideDirect].pct(q.p), tb.lat[tlsSidePlain].pct(q.p), tb.lat[tlsSideTLS].pct(q.p)
			ratio, ok := addedRatio(d, p, s)
			cell := "n/a (plaintext adds nothing measurable)"
			if ok {
				cell = fmt.Sprintf("%.2fx", ratio)
			}
			target, result := "—", "info"
			if q.target {
				target = fmt.Sprintf("TLS added ≤ %.1fx plaintext added (issue 15)", tlsTargetAddedP50)
				result = r.verdictUnder(ok && ratio <= tlsTargetAddedP50, tb.latLoad)
			}
			row("6", fmt.Sprintf("added latency %s (proxy − direct memcached %s) at %d req/s, %d connections, 100 B GET/SET 9:1", q.name, micros(d), r.opts.latRate, r.opts.latConns),
				fmt.Sprintf("plaintext: %s (%s)", signedMicros(p-d), micros(p)), fmt.Sprintf("TLS: %s (%s)", signedMicros(s-d), micros(s)), cell, target, result)
		}
	}

	if m := tb.mem; m != nil {
		row("6", "proxy resident memory (VmRSS), started fresh with a TLS listener, before connecting", "—", fmt.Sprintf("%.1f MB", mb(m.rssBeforeKB)), "—", "—", "info")
		for i, pt := range m.points {
			target, result := "—", "info"
			if !m.extrapolated && i == len(m.points)-1 {
				target, result = fmt.Sprintf("< %d MB (issue 15)", tlsTargetMemMB), r.verdict(mb(pt.rssKB) < tlsTargetMemMB)
			}
			perConn := float64(pt.rssKB-m.rssBeforeKB) * 1.024 / float64(pt.conns)
			row("6", fmt.Sprintf("proxy resident memory (VmRSS) holding %s idle TLS client connections (measured)", thousands(float64(pt.conns))), "—",
				fmt.Sprintf("%.1f MB (%s fds open)", mb(pt.rssKB), thousands(float64(pt.fds))),
				fmt.Sprintf("+%.1f kB per connection", perConn), target, result)
		}
		if m.extrapolated {
			row("6", fmt.Sprintf("proxy resident memory holding %s idle TLS client connections: **extrapolated** linearly from the two measured points (%s did not fit: %s)",
				thousands(float64(m.requested)), thousands(float64(m.requested)), m.fitReason), "—",
				fmt.Sprintf("≈ %.1f MB (estimate)", mb(m.estimateKB)),
				fmt.Sprintf("+%.1f kB per connection (slope)", m.slopeKB*1.024),
				fmt.Sprintf("< %d MB (issue 15)", tlsTargetMemMB), r.verdict(mb(m.estimateKB) < tlsTargetMemMB)+" (extrapolated)")
		}
	}
}

// signedMicros is micros with a "+" on positive values.
func signedMicros(d time.Duration) string {
	if d >= 0 {
		return "+" + micros(d)
	}
	return micros(d)
}

func (r *report) captionTLS(w func(string, ...any)) {
	o, tb := r.opts, r.tls
	var version, suite string
	for _, t := range tb.throughput {
		if t.version != "" {
			version, suite = t.version, t.cipherSuite
		}
	}
	if version == "" && tb.mem != nil {
		version, suite = tb.mem.version, tb.mem.cipherSuite
	}
	negotiated := ""
	if version != "" {
		negotiated = fmt.Sprintf(" (negotiated: %s, %s)", version, suite)
	}
	var perCase []string
	for _, t := range tb.throughput {
		perCase = append(perCase, fmt.Sprintf("%s: %s (one run at most %.0f%%)", t.name(), t.load, t.maxForeign))
	}
	how := "sends one request and waits for its response before the next (as memcaslap does; the verdicts are on these cases)"
	if tb.depth > 1 {
		how += fmt.Sprintf(", or, in the pipelined case, writes %d requests at once and reads their responses before the next batch", tb.depth)
	}
	w("6. **TLS against plaintext** (issue 15): one kvthrottle process, configured as above plus `[tls]` with a throwaway ECDSA P-256 certificate for 127.0.0.1 made by this program, serving the same bucket on `proxy.listen` and on `tls.listen`%s; Go's crypto/tls on both ends, no client certificate, no session resumption (the proxy disables tickets). "+
		"memcaslap has no TLS, so the load comes from this program's own closed-loop generator (binary protocol): each of N connections %s, 100-byte values, GET:SET = 9:1 over %d keys set beforehand; "+
		"%d rounds per case of one %s run per side (direct memcached, kvthrottle plaintext, kvthrottle TLS), the order rotating every round, after a 1 s warm-up run each way; each run opens its connections (handshakes not timed), runs 0.5 s unmeasured, then counts the responses completed in the measured window. "+
		"The load generator runs in this program and shares the %d cores with memcached and the proxy: its own TLS work (encrypting requests, decrypting responses) is on the same cores, so the ratio understates what a TLS client on another machine would see. "+
		"CPU time per request: the proxy's and memcached's from /proc/PID/stat and this program's own, over the measured windows. Other processes' CPU per case: %s.\n",
		negotiated, how, latKeys, o.rounds, o.duration, r.machine.cores, strings.Join(perCase, "; "))
	if len(tb.lat[tlsSideTLS].samples) > 0 {
		w("   Added latency: section 2's fixed-rate generator (%d connections, %d req/s in all, one request at a time, 100 B GET:SET 9:1), %d round(s) of %v measured per side after a warm-up, the order rotating, samples pooled: "+
			"%s direct, %s plaintext, %s TLS. Added = percentile through the proxy − the same percentile directly against memcached; the verdict compares TLS's added p50 with plaintext's.\n",
			o.latConns, o.latRate, tb.latRounds, o.latDur,
			thousands(float64(len(tb.lat[tlsSideDirect].samples))), thousands(float64(len(tb.lat[tlsSidePlain].samples))), thousands(float64(len(tb.lat[tlsSideTLS].samples))))
	}
	if m := tb.mem; m != nil {
		fdLimit := fmt.Sprintf("soft %s, hard %s", thousands(float64(m.fdSoft)), thousands(float64(m.fdHard)))
		w("   Memory: a third kvthrottle process, started fresh with the same configuration; %s TLS connections opened to it from this program (%d handshakes at a time: the proxy allows 32 in progress per source), each completing its handshake, sending one NOOP and reading its response, then left idle; "+
			"VmRSS of the proxy from /proc/PID/status 1 s after the last connection of each step (before: 0.5 s after start; peak VmHWM %.1f MB). "+
			"The proxy's RLIMIT_NOFILE (/proc/PID/limits): %s; a TLS connection holds %.2f of its descriptors (measured; its socket, which its event loop reads). ",
			strings.Join(pointCounts(m.points), " then "), dialWorkers, mb(m.hwmKB), fdLimit, m.fdsPerConn)
		if m.extrapolated {
			w("%s connections did not fit (%s), so the table gives RSS measured at the largest round count that fits with a margin of 5%% of the limit (at least 1,000) and at half of it, and **extrapolates** linearly through those two points to %s: an estimate, not a measurement.\n",
				thousands(float64(m.requested)), m.fitReason, thousands(float64(m.requested)))
		} else {
			w("The verdict is on the measurement at %s.\n", thousands(float64(m.requested)))
		}
	}
}

// name describes a case for the table.
func (c tlsCase) name() string {
	if c.depth == 1 {
		return fmt.Sprintf("%d connections, one request at a time", c.conns)
	}
	return fmt.Sprintf("%d connections, %d pipelined requests at a time", c.conns, c.depth)
}

func pointCounts(ps []tlsMemPoint) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = thousands(float64(p.conns))
	}
	return out
}
