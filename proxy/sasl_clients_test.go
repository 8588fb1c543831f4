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

// Independent clients with SASL PLAIN through the proxy: libmemcached's
// memccp/memccat and Node's memjs. Each user lands in the bucket named
// like it, and cannot see the other's data.

func TestLibmemcachedSASLClients(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"memccp", "memccat"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (make test installs libmemcached-tools): %v", tool, err)
		}
	}
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	dir := t.TempDir()
	file := filepath.Join(dir, "greeting.txt")
	if err := os.WriteFile(file, []byte("hello from alice\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	servers := "--servers=" + p.Addr
	run := func(tool, user, pw string, args ...string) (string, error) {
		all := append([]string{servers, "--binary", "--username=" + user, "--password=" + pw}, args...)
		return runLibmemcached(t, tool, all...)
	}
	if out, err := run("memccp", "alice", "alice-pw", file); err != nil {
		t.Fatalf("memccp as alice: %v\n%s", err, out)
	}
	out, err := run("memccat", "alice", "alice-pw", "greeting.txt")
	if err != nil || !strings.Contains(out, "hello from alice") {
		t.Fatalf("memccat as alice: %v\n%s", err, out)
	}
	// Bob's bucket does not have alice's key.
	if out, err := run("memccat", "bob", "bob-pw", "greeting.txt"); err == nil && strings.Contains(out, "hello from alice") {
		t.Fatalf("bob read alice's key:\n%s", out)
	}
	// A wrong password is refused.
	if out, err := run("memccat", "alice", "wrong", "greeting.txt"); err == nil && strings.Contains(out, "hello from alice") {
		t.Fatalf("wrong password accepted:\n%s", out)
	}
}

func TestMemjsSASLClient(t *testing.T) {
	t.Parallel()
	script, _ := filepath.Abs("../testdata/memjs/roundtrip.js")
	if _, err := os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "memjs")); err != nil {
		t.Fatalf("memjs not installed (make test runs scripts/deps.sh): %v", err)
	}
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	node := func(args ...string) (map[string]any, error) {
		// The script exits non-zero on a failed command; its last line
		// (memjs logs before it) says what happened.
		out, _ := exec.Command("node", append([]string{script, p.Addr}, args...)...).Output()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var res map[string]any
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
			return nil, fmt.Errorf("memjs output %q: %w", out, err)
		}
		return res, nil
	}
	res, err := node("alice", "alice-pw", "js-key", "js-value")
	if err != nil || res["value"] != "js-value" {
		t.Fatalf("memjs as alice: %v %v", res, err)
	}
	res, err = node("bob", "bob-pw", "js-key")
	if err != nil || res["value"] != nil {
		t.Fatalf("memjs as bob sees alice's key: %v %v", res, err)
	}
	res, err = node("alice", "wrong-pw", "js-key")
	if err != nil || res["error"] == nil {
		t.Fatalf("memjs with a wrong password: %v %v, want an error", res, err)
	}
	// And the value is really in alice's bucket for other clients too.
	c := login(t, p.Addr, "alice")
	if r, err := c.Get([]byte("js-key")); err != nil || string(r.Value) != "js-value" {
		t.Fatalf("alice via Go client: %v %+v", err, r)
	}
}
