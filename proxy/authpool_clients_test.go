package proxy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Pools opened at once through real clients, the password cache cold
// (authpool_test.go): pylibmc, memjs and dalli, each with SASL PLAIN on the
// binary protocol, 32 connections of the pool user from one host. Every
// connection must store and read its key, and the keys must be in the pool
// user's bucket, never in default_bucket (memjs took the Etmpfail that all
// but 9 of them got for a success and wrote there).

// poolResult is what a client script reports for one connection.
type poolResult struct {
	Set   any    `json:"set"`
	Get   any    `json:"get"`
	Error string `json:"error"`
}

// runPoolClient runs a client script and checks its last output line:
// one poolResult per connection, connection i having stored "<prefix> i"
// under key "pool-<short>-i". It returns the keys and values to look for.
func runPoolClient(t *testing.T, short, prefix, name string, args ...string) map[string]string {
	t.Helper()
	out, err := runClient(t, name, args...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var res []poolResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
		t.Fatalf("%s output %q: %v", name, out, err)
	}
	if len(res) != poolSize {
		t.Fatalf("%s reported %d connections, want %d", name, len(res), poolSize)
	}
	kv := map[string]string{}
	failed := 0
	for i, r := range res {
		want := fmt.Sprintf("%s %d", prefix, i)
		if r.Error != "" || r.Get != want {
			failed++
			if failed <= 3 {
				t.Errorf("%s connection %d: %+v, want get %q", name, i, r, want)
			}
			continue
		}
		kv[fmt.Sprintf("pool-%s-%d", short, i)] = want
	}
	if failed > 0 {
		t.Fatalf("%s: %d of %d connections of the pool failed", name, failed, poolSize)
	}
	return kv
}

const pylibmcPool = `
import json, sys, threading
import pylibmc
addr, user, password, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start = threading.Barrier(n)
res = [None] * n
def run(i):
    try:
        # Timeouts of 10 s as dalli's below: libmemcached's 5 s default
        # poll timeout is a latency bound a loaded test machine can miss.
        c = pylibmc.Client([addr], binary=True, username=user, password=password,
                           behaviors={"connect_timeout": 10000, "_poll_timeout": 10000})
        start.wait()
        key = "pool-py-%d" % i
        ok = c.set(key, "py %d" % i)
        got = c.get(key)
        res[i] = {"set": bool(ok), "get": got.decode() if isinstance(got, bytes) else got}
    except Exception as e:
        res[i] = {"error": repr(e)}
threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(res))
`

// TestAuthPoolColdPylibmc: 32 pylibmc clients (libmemcached, binary
// protocol, SASL PLAIN) in threads, their first command at the same time.
func TestAuthPoolColdPylibmc(t *testing.T) {
	if err := exec.Command("/usr/bin/python3", "-c", "import pylibmc").Run(); err != nil {
		t.Skipf("pylibmc not installed (make test installs python3-pylibmc): %v", err)
	}
	p := startProxy(t, testConfig{tail: poolTail(t)})
	kv := runPoolClient(t, "py", "py", "/usr/bin/python3", "-c", pylibmcPool, p.Addr, poolUser, poolPass, fmt.Sprint(poolSize))
	checkPoolData(t, p.Addr, kv)
}

// TestAuthPoolColdMemjs: 32 memjs clients opened at once.
func TestAuthPoolColdMemjs(t *testing.T) {
	script, _ := filepath.Abs("../testdata/memjs/pool.js")
	if _, err := os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "memjs")); err != nil {
		t.Fatalf("memjs not installed (make test runs scripts/deps.sh): %v", err)
	}
	p := startProxy(t, testConfig{tail: poolTail(t)})
	kv := runPoolClient(t, "js", "js", "node", script, p.Addr, poolUser, poolPass, fmt.Sprint(poolSize))
	checkPoolData(t, p.Addr, kv)
}

const dalliPool = `
require "dalli"
require "json"
addr, user, password, n = ARGV[0], ARGV[1], ARGV[2], ARGV[3].to_i
clients = (0...n).map { Dalli::Client.new(addr, username: user, password: password, socket_timeout: 10, socket_max_failures: 1) }
gate = Queue.new
res = Array.new(n)
threads = clients.each_with_index.map do |c, i|
  Thread.new do
    gate.pop
    begin
      key = "pool-rb-#{i}"
      ok = c.set(key, "rb #{i}", 0, raw: true)
      res[i] = {"set" => !!ok, "get" => c.get(key)}
    rescue => e
      res[i] = {"error" => "#{e.class}: #{e.message}"}
    end
  end
end
n.times { gate << true }
threads.each(&:join)
puts JSON.generate(res)
`

// TestAuthPoolColdDalli: 32 dalli clients (binary protocol, SASL PLAIN)
// in threads, released together.
func TestAuthPoolColdDalli(t *testing.T) {
	if err := exec.Command("ruby", "-e", `require "dalli"`).Run(); err != nil {
		t.Skipf("ruby with dalli not installed (make test installs ruby and ruby-dalli): %v", err)
	}
	p := startProxy(t, testConfig{tail: poolTail(t)})
	kv := runPoolClient(t, "rb", "rb", "ruby", "-e", dalliPool, p.Addr, poolUser, poolPass, fmt.Sprint(poolSize))
	checkPoolData(t, p.Addr, kv)
}
