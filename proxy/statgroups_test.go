package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// Stats groups as clients meet them (issue 27): a group memcached does not
// know gets memcached's own answer, byte for byte; a group a tenant may not
// see is an empty group; either way the client goes on at once on the
// same connection, and clients whose stats reader would wait for an END
// that does not come (python-memcached, php-memcache) no longer do.

// textUntilVersion sends cmd then "version\r\n" on a new text connection to
// addr and returns every byte up to and including the VERSION line: the
// answer to cmd, and proof that the connection is still in step.
func textUntilVersion(t *testing.T, addr, cmd string) string {
	t.Helper()
	c := dialDeadline(t, addr)
	if _, err := io.WriteString(c, cmd+"version\r\n"); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var out strings.Builder
	for {
		line, err := r.ReadString('\n')
		out.WriteString(line)
		if err != nil || strings.HasPrefix(line, "VERSION ") {
			return out.String()
		}
	}
}

// binaryExchange sends a binary STAT group then a NOOP to addr and returns
// the raw answers, up to and including the NOOP's.
func binaryExchange(t *testing.T, addr, group string) []byte {
	t.Helper()
	c := dialDeadline(t, addr)
	req := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpStat, Opaque: 7}, nil, nil, []byte(group), nil)
	req = mc.AppendFrame(req, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpNoop, Opaque: 8}, nil, nil, nil, nil)
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	var out []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil || bytes.Contains(out, []byte{byte(mc.MagicResponse), byte(mc.OpNoop)}) {
			return out
		}
	}
}

// TestStatsGroupsAsMemcached: through the proxy, a tenant's stats group
// memcached does not know is answered byte for byte as a fresh memcached
// answers it (text: ERROR; binary: KeyEnoent "Not found"), as is an
// admin's; a group of memcached's a tenant may not see answers as a fresh
// memcached with nothing in it does (END; the terminator alone); the next
// command is answered in step.
func TestStatsGroupsAsMemcached(t *testing.T) {
	t.Parallel()
	ref := testmc.Start(t) // memcached itself, empty
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	eventually(t, time.Minute, "memcached's version known", func() bool { return p.pool.Version() != nil })
	for _, g := range []string{"malloc", "nosuchgroup", "proxy", "items", "items extra", "sizes_x"} {
		cmd := "stats " + g + "\r\n"
		want, got := textUntilVersion(t, ref.Addr, cmd), textUntilVersion(t, p.Addr, cmd)
		if got != want {
			t.Errorf("%q: proxy answers %q, memcached %q", cmd, got, want)
		}
	}
	for _, g := range []string{"malloc", "nosuchgroup", "conns", "items"} {
		want, got := binaryExchange(t, ref.Addr, g), binaryExchange(t, p.Addr, g)
		if !bytes.Equal(got, want) {
			t.Errorf("binary STAT %q: proxy answers %q, memcached %q", g, got, want)
		}
	}
	// An admin's unknown group goes to memcached, whose binary answer
	// becomes its text one.
	pa := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tenantTail(t)})
	eventually(t, time.Minute, "memcached's version known", func() bool { return pa.pool.Version() != nil })
	auth := "set a 0 0 14\r\nadmin admin-pw\r\n"
	want := "STORED\r\n" + textUntilVersion(t, ref.Addr, "stats malloc\r\n")
	if got := textUntilVersion(t, pa.Addr, auth+"stats malloc\r\n"); got != want {
		t.Errorf("admin stats malloc: proxy answers %q, want %q", got, want)
	}
}

// debianPython returns Debian's python3 when it has module, else skips.
func debianPython(t *testing.T, module, pkg string) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import "+module).Run() == nil {
			return py
		}
	}
	t.Skipf("python3 with %s not installed (make test installs %s)", module, pkg)
	return ""
}

// pyMemcacheStats asks python-memcached (socket_timeout 10 s: a stats
// read waiting for a missing END times out and marks the server dead, so
// the set and get after it fail; a timeout of 1 s marked it dead under a
// loaded machine's slowness alone) for one stats group, then sets and
// gets a key.
const pyMemcacheStats = `
import sys, memcache
mc = memcache.Client([sys.argv[1]], socket_timeout=10, dead_retry=30)
try:
    print(repr([d for _, d in mc.get_stats(sys.argv[2])]))
except Exception as e:
    print(type(e).__name__)
print(mc.set('pyk', 'pyv'), repr(mc.get('pyk')))
`

// TestPythonMemcachedStatsGroups: python-memcached's get_stats of a group
// a tenant may not see returns an empty group and the connection serves
// the next get; of a group memcached does not know, it does what it does
// against memcached (its parser raises IndexError on ERROR), and the next
// get works. The same script runs against a fresh memcached for reference.
func TestPythonMemcachedStatsGroups(t *testing.T) {
	t.Parallel()
	py := debianPython(t, "memcache", "python3-memcache")
	ref := testmc.Start(t)
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	for _, x := range []struct{ group, want string }{
		{"items", "[{}]\nTrue 'pyv'"},
		{"slabs", ""}, // memcached's shows its (empty) slabs; the proxy's, none
		{"malloc", "IndexError\nTrue 'pyv'"},
	} {
		got, err := runClient(t, py, "-c", pyMemcacheStats, p.Addr, x.group)
		if err != nil {
			t.Fatalf("python-memcached stats %s: %v\n%s", x.group, err, got)
		}
		want := x.want
		if want == "" {
			want = "[{}]\nTrue 'pyv'"
		} else if ref, err := runClient(t, py, "-c", pyMemcacheStats, ref.Addr, x.group); err != nil || strings.TrimSpace(ref) != want {
			t.Fatalf("against memcached, stats %s: %v %q, want %q", x.group, err, ref, want)
		}
		if strings.TrimSpace(got) != want {
			t.Errorf("python-memcached stats %s: %q, want %q", x.group, got, want)
		}
	}
}

// phpMemcacheStats asks php-memcache (timeout 10 s) for one stats group,
// with getStats and getExtendedStats, then sets and gets a key.
const phpMemcacheStats = `
$m = new Memcache();
$m->addServer($argv[1], (int)$argv[2], false, 1, 10);
var_export($m->getStats($argv[3])); echo "\n";
var_export(array_values($m->getExtendedStats($argv[3]))); echo "\n";
var_export($m->set('phpk', 'phpv')); echo "\n";
var_export($m->get('phpk')); echo "\n";
`

// TestPhpMemcacheStatsGroups: php-memcache's getStats and getExtendedStats
// of a group a tenant may not see return false at once, as for a group
// memcached has nothing in, and the following set and get work; of a
// group memcached does not know, php-memcache does exactly what it does
// against memcached (false, and the server failed for the commands after
// it, as php-memcache treats memcached's ERROR).
func TestPhpMemcacheStatsGroups(t *testing.T) {
	t.Parallel()
	if exec.Command("php", "-r", `exit(class_exists("Memcache") ? 0 : 1);`).Run() != nil {
		t.Skip("php with php-memcache not installed (make test installs php-cli php-memcache)")
	}
	ref := testmc.Start(t)
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	run := func(addr, group string) string {
		t.Helper()
		host, port, _ := net.SplitHostPort(addr)
		out, err := runClient(t, "php", "-d", "display_errors=stderr", "-r", phpMemcacheStats, host, port, group)
		if err != nil {
			t.Fatalf("php-memcache stats %s: %v\n%s", group, err, out)
		}
		return strings.TrimSpace(out)
	}
	for _, x := range []struct{ group, want string }{
		{"items", "false\narray (\n  0 => false,\n)\ntrue\n'phpv'"},
		{"malloc", ""}, // as against memcached
	} {
		want := run(ref.Addr, x.group)
		if x.want != "" && want != x.want {
			t.Fatalf("against memcached, stats %s: %q, want %q", x.group, want, x.want)
		}
		if got := run(p.Addr, x.group); got != want {
			t.Errorf("php-memcache stats %s: %q, want %q (memcached's)", x.group, got, want)
		}
	}
}

// TestGeneralStatsCounters: a tenant's general stats carry memcached's
// counters for its own bucket (cmd_get, get_hits, get_misses, cmd_set,
// delete_hits ..., curr_connections), counted over binary and text
// commands alike and shown alike to both; their version is VERSION's
// answer on both protocols. An admin's general stats are memcached's.
func TestGeneralStatsCounters(t *testing.T) {
	t.Parallel()
	l := testmc.FreeAddr(t)
	tail := tenantTail(t) + fmt.Sprintf("[[listener]]\nlisten = %q\nbucket = \"alice\"\n", l)
	p := startProxy(t, testConfig{tail: tail})
	eventually(t, time.Minute, "memcached's version known", func() bool { return p.pool.Version() != nil })
	b := login(t, p.Addr, "alice")
	st := statusFn(t)
	if st(b.Set([]byte("k1"), []byte("v"))) != mc.StatusSuccess || st(b.Get([]byte("k1"))) != mc.StatusSuccess ||
		st(b.Get([]byte("nope"))) != mc.StatusKeyEnoent {
		t.Fatal("binary commands failed")
	}
	tc := dialText(t, l)
	if _, err := io.WriteString(tc.c, "set k2 0 0 1 noreply\r\nx\r\nget k1 k2 k3\r\ndelete k2 noreply\r\ndelete k2\r\ntouch k1 0\r\n"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"VALUE k1 0 1\r\n", "v\r\n", "VALUE k2 0 1\r\n", "x\r\n", "END\r\n", "NOT_FOUND\r\n", "TOUCHED\r\n"} {
		if line := tc.line(t); line != want {
			t.Fatalf("text commands: %q, want %q", line, want)
		}
	}
	want := map[string]string{
		"cmd_get": "5", "get_hits": "3", "get_misses": "2", "cmd_set": "2",
		"delete_hits": "1", "delete_misses": "1", "cmd_touch": "1", "touch_hits": "1",
		"curr_connections": "2", "bucket": "alice", "user": "alice",
		"version": string(p.pool.Version()), "kvthrottle_version": "test",
	}
	kv, err := b.Stats("")
	if err != nil {
		t.Fatal(err)
	}
	r, err := b.Do(mcclient.Request{Opcode: mc.OpVersion})
	if err != nil || string(r.Value) != want["version"] {
		t.Fatalf("VERSION: %v %q, want %q", err, r.Value, want["version"])
	}
	for k, v := range want {
		if got := statValue(kv, k); got != v {
			t.Errorf("binary STAT %s = %q, want %q", k, got, v)
		}
	}
	if _, err := io.WriteString(tc.c, "stats\r\nversion\r\n"); err != nil {
		t.Fatal(err)
	}
	text := map[string]string{}
	for line := tc.line(t); line != "END\r\n"; line = tc.line(t) {
		f := strings.SplitN(strings.TrimSuffix(line, "\r\n"), " ", 3)
		if len(f) != 3 || f[0] != "STAT" {
			t.Fatalf("text stats line %q", line)
		}
		text[f[1]] = f[2]
	}
	delete(want, "user") // the listener's connection has no user
	for k, v := range want {
		if text[k] != v {
			t.Errorf("text stats %s = %q, want %q", k, text[k], v)
		}
	}
	if line := tc.line(t); line != "VERSION "+want["version"]+"\r\n" {
		t.Errorf("text version %q, want the stats' version %q", line, want["version"])
	}
	// An admin sees memcached's own general stats.
	kv, err = login(t, p.Addr, "admin").Stats("")
	if err != nil || statValue(kv, "curr_items") == "" || statValue(kv, "version") != want["version"] || statValue(kv, "bucket") != "" {
		t.Errorf("admin STAT: %v %q, want memcached's", err, kv)
	}
}
