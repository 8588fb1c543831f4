package proxy

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// libmemcached's tools (Debian's libmemcached-tools) speaking the text
// protocol to the proxy: without --binary (memcstat, memccp, memccat) or
// -B (memcaslap) they never send a binary frame. Each test skips only when
// its tool is not installed; scripts/deps.sh (make test) installs them.

// lookTool returns the path of the first of names installed, or skips t.
func lookTool(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	t.Skipf("%s not installed (make test installs libmemcached-tools)", strings.Join(names, " or "))
	return ""
}

// maslapRun is memcaslap's end-of-run summary.
type maslapRun struct {
	stats map[string]int64 // cmd_get, cmd_set, get_misses, verify_misses, verify_failed ...
	ops   int64            // "Ops:" of the "Run time:" line
}

var (
	maslapStat = regexp.MustCompile(`(?m)^(cmd_get|cmd_set|get_misses|verify_misses|verify_failed|expired_get|unexpired_unget): (\d+)$`)
	maslapOps  = regexp.MustCompile(`(?m)^Run time: \S+ Ops: (\d+) TPS: \d+`)
)

// runMaslap runs memcaslap against addr in its default (text) protocol
// and parses its summary; the test fails if it fails or prints none.
func runMaslap(t *testing.T, tool, addr string, args ...string) maslapRun {
	t.Helper()
	out, err := runClient(t, tool, append([]string{"--servers=" + addr}, args...)...)
	if err != nil {
		t.Fatalf("%s against %s: %v\n%s", tool, addr, err, out)
	}
	m := maslapOps.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("%s against %s: no \"Run time: ... Ops:\" summary:\n%s", tool, addr, out)
	}
	r := maslapRun{stats: map[string]int64{}}
	r.ops, _ = strconv.ParseInt(m[1], 10, 64)
	for _, s := range maslapStat.FindAllStringSubmatch(out, -1) {
		r.stats[s[1]], _ = strconv.ParseInt(s[2], 10, 64)
	}
	for _, k := range []string{"cmd_get", "cmd_set", "get_misses", "verify_misses", "verify_failed"} {
		if _, ok := r.stats[k]; !ok {
			t.Fatalf("%s against %s: no %s in its summary:\n%s", tool, addr, k, out)
		}
	}
	return r
}

// TestMemcaslapTextThroughProxy: memcaslap in its text protocol (no -B)
// runs a fixed number of sets and gets (multi-key gets of 4 keys, a tenth
// of them verified against the values it set) through the proxy as
// cleanly as directly against memcached: every operation done, no more
// get misses than memcached gives it, no verification miss or failure.
// Under -race 5,000 operations (16 connections of multi-gets and sets
// meet on the proxy's loops from the first on); make test runs the
// 20,000 without -race in the upstream-TLS pass.
func TestMemcaslapTextThroughProxy(t *testing.T) {
	t.Parallel()
	tool := lookTool(t, "memcaslap", "memaslap")
	ops := testmc.UnderRace[int64](20000, 5000)
	args := []string{"--threads=2", "--concurrency=8", "--execute_number=" + strconv.FormatInt(ops, 10), "--verify=0.1", "--division=4"}
	direct := runMaslap(t, tool, testmc.Start(t).Addr, args...)
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`})
	via := runMaslap(t, tool, p.Addr, args...)
	t.Logf("memcaslap text, %d ops: direct %+v; through the proxy %+v", ops, direct, via)
	for name, r := range map[string]maslapRun{"directly": direct, "through the proxy": via} {
		if r.ops != ops || r.stats["cmd_get"]+r.stats["cmd_set"] != ops {
			t.Errorf("%s: %d ops (%d gets + %d sets), want %d", name, r.ops, r.stats["cmd_get"], r.stats["cmd_set"], ops)
		}
		if r.stats["verify_misses"] != 0 || r.stats["verify_failed"] != 0 {
			t.Errorf("%s: verify_misses %d, verify_failed %d; want none", name, r.stats["verify_misses"], r.stats["verify_failed"])
		}
	}
	if via.stats["get_misses"] > direct.stats["get_misses"] {
		t.Errorf("get_misses through the proxy %d, directly %d: the proxy lost values", via.stats["get_misses"], direct.stats["get_misses"])
	}
	// The proxy metered them as a text client of the default bucket.
	var commands uint64
	for _, b := range p.AppendBuckets(nil) {
		if b.Name == "default" {
			commands = b.Commands
		}
	}
	if commands < uint64(ops) {
		t.Errorf("default bucket: %d commands admitted, want at least memcaslap's %d", commands, ops)
	}
}

// TestMemcstatText: memcstat without --binary sends the text "stats" and
// prints the proxy's answer to a text tenant: the proxy's own general
// stats (its pid, memcached's version as VERSION gives it, its own
// version, and the bucket of the [[listener]] the client came in through,
// with that bucket's counters), its "throttle" group showing that bucket
// only, and a group tenants may not read as an empty group.
func TestMemcstatText(t *testing.T) {
	t.Parallel()
	tool := lookTool(t, "memcstat")
	l := testmc.FreeAddr(t)
	tail := tenantTail(t) + fmt.Sprintf("[[listener]]\nlisten = %q\nbucket = \"bob\"\n", l)
	p := startProxy(t, testConfig{tail: tail})
	eventually(t, time.Minute, "memcached's version known", func() bool { return p.pool.Version() != nil })
	tc := dialText(t, l)
	if _, err := io.WriteString(tc.c, "set k 0 0 2\r\nhi\r\n"); err != nil {
		t.Fatal(err)
	}
	if line := tc.line(t); line != "STORED\r\n" {
		t.Fatalf("set on the listener: %q", line)
	}
	out, err := runClient(t, tool, "--servers="+l)
	if err != nil {
		t.Fatalf("memcstat: %v\n%s", err, out)
	}
	for _, want := range []string{
		"\tpid: " + strconv.Itoa(os.Getpid()) + "\n",    // the proxy's, not memcached's
		"\tversion: " + string(p.pool.Version()) + "\n", // VERSION's answer
		"\tkvthrottle_version: test\n",
		"\tcmd_set: 1\n",
		"\tbucket: bob\n",
		"\tcurr_connections: 2\n", // tc and memcstat's
		"\tcmd_total: 1\n",
		"\tunits_total: 1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("memcstat: no %q in\n%s", want, out)
		}
	}
	out, err = runClient(t, tool, "--servers="+l, "throttle")
	if err != nil || !strings.Contains(out, "\tbucket:bob:write_units_total: 1\n") || strings.Contains(out, "bucket:alice:") {
		t.Errorf("memcstat throttle: %v, want bob's bucket only, with its one write unit:\n%s", err, out)
	}
	// A group bob may not see is an empty group: nothing to print.
	out, err = runClient(t, tool, "--servers="+l, "items")
	if err != nil || strings.TrimSpace(out) != "" && !strings.HasPrefix(strings.TrimSpace(out), "Server:") || strings.Contains(out, "items:") {
		t.Errorf("memcstat items: %v, want no item stats:\n%s", err, out)
	}
	if _, err := io.WriteString(tc.c, "stats items\r\n"); err != nil {
		t.Fatal(err)
	}
	if line := tc.line(t); line != "END\r\n" {
		t.Errorf("stats items: %q, want an empty group", line)
	}
}

// TestMemccpMemccatText: memccp stores a file and memccat reads it back,
// both in the text protocol, through a [[listener]] bound to bob's bucket:
// memccat prints what it prints directly against memcached, and a binary
// client of bob's bucket reads the value memccp stored.
func TestMemccpMemccatText(t *testing.T) {
	t.Parallel()
	cp, cat := lookTool(t, "memccp"), lookTool(t, "memccat")
	l := testmc.FreeAddr(t)
	tail := tenantTail(t) + fmt.Sprintf("[[listener]]\nlisten = %q\nbucket = \"bob\"\n", l)
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tail})
	file := filepath.Join(t.TempDir(), "text-greeting.txt")
	want := "hello over text\n" + strings.Repeat("0123456789", 1000) + "\n"
	if err := os.WriteFile(file, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	roundTrip := func(addr string) string {
		t.Helper()
		if out, err := runLibmemcached(t, cp, "--servers="+addr, file); err != nil {
			t.Fatalf("memccp to %s: %v\n%s", addr, err, out)
		}
		out, err := runLibmemcached(t, cat, "--servers="+addr, "text-greeting.txt")
		if err != nil {
			t.Fatalf("memccat from %s: %v\n%s", addr, err, out)
		}
		return out
	}
	direct := roundTrip(p.MC.Addr)
	if !strings.HasPrefix(direct, want) {
		t.Fatalf("memccat directly from memcached: %q, want the file first", direct)
	}
	if via := roundTrip(l); via != direct {
		t.Errorf("memccat through the proxy printed %d bytes, directly %d: %q", len(via), len(direct), via)
	}
	bob := login(t, p.Addr, "bob")
	if r, err := bob.Get([]byte("text-greeting.txt")); err != nil || string(r.Value) != want {
		t.Errorf("bob (binary) reads %v %v, want memccp's file", err, r)
	}
}
