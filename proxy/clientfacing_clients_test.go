package proxy

import (
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Real clients reading the proxy's own answers. Each test skips only when
// its client is not installed; scripts/deps.sh (make test) installs them
// from Debian: ruby + ruby-dalli, libmemcached-tools, python3-pymemcache.

// runClient runs a client command with a deadline and returns its
// standard output.
func runClient(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Logf("%s stderr:\n%s", name, ee.Stderr)
	}
	return string(out), err
}

// dalliRefusedStat reads a refused STAT group, resets the stats (a single
// frame), then checks that the connection is still in step.
const dalliRefusedStat = `
require "dalli"
require "json"
c = Dalli::Client.new(ARGV[0], protocol: :binary, socket_timeout: 2, socket_max_failures: 1)
stats = c.stats(:slabs).values.first
c.reset_stats
c.set("dalli-key", "dalli-value")
puts JSON.generate({"stats" => stats, "get" => c.get("dalli-key")})
`

// TestDalliReadsRefusedStat: dalli (binary protocol) ends a STAT read only
// on a success frame with no key; a refused group must not leave it
// waiting for its socket timeout.
func TestDalliReadsRefusedStat(t *testing.T) {
	if err := exec.Command("ruby", "-e", `require "dalli"`).Run(); err != nil {
		t.Skipf("ruby with dalli not installed (make test installs ruby and ruby-dalli): %v", err)
	}
	p := startProxy(t, testConfig{})
	out, err := runClient(t, "ruby", "-e", dalliRefusedStat, p.Addr)
	if err != nil {
		t.Fatalf("dalli: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var res struct {
		Stats map[string]string `json:"stats"`
		Get   string            `json:"get"`
	}
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("dalli output %q: %v", out, err)
	}
	if len(res.Stats) != 1 || res.Stats["error"] != "STAT slabs needs the admin privilege" || res.Get != "dalli-value" {
		t.Fatalf("dalli: %+v, want the refusal as the only stat and the connection in step", res)
	}
}

// TestMemcstatReadsRefusedStat: libmemcached's memcstat shows the reason.
func TestMemcstatReadsRefusedStat(t *testing.T) {
	if _, err := exec.LookPath("memcstat"); err != nil {
		t.Skipf("memcstat not installed (make test installs libmemcached-tools): %v", err)
	}
	p := startProxy(t, testConfig{})
	out, err := runClient(t, "memcstat", "--binary", "--servers="+p.Addr, "items")
	if err != nil || !strings.Contains(out, "error: STAT items needs the admin privilege") {
		t.Fatalf("memcstat --binary items: %v\n%s", err, out)
	}
}

const pymemcacheGet = `
import sys
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheServerError
host, port = sys.argv[1].rsplit(":", 1)
c = Client((host, int(port)), connect_timeout=5, timeout=5)
try:
    c.get("foo")
    print("no error")
except MemcacheServerError as e:
    print("server error:", e)
`

// TestPymemcacheGetsServerError: a text-protocol client gets memcached's
// SERVER_ERROR line at once, which it reports as such.
func TestPymemcacheGetsServerError(t *testing.T) {
	python := ""
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import pymemcache").Run() == nil {
			python = py
			break
		}
	}
	if python == "" {
		t.Skip("python3 with pymemcache not installed (make test installs python3-pymemcache)")
	}
	p := startProxy(t, testConfig{})
	out, err := runClient(t, python, "-c", pymemcacheGet, p.Addr)
	if err != nil || !strings.Contains(out, "server error:") || !strings.Contains(out, "only the binary protocol is supported") {
		t.Fatalf("pymemcache get: %v\n%s", err, out)
	}
}
