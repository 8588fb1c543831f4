package proxy

import (
	"bufio"
	"context"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// Real text clients after a failed get (issue 27): python-memcached
// (Debian's python3-memcache) reads a get's reply as one line when it is
// no VALUE, so an END sent after the error line was read as the reply to
// its next get, whose own reply went to the get after it: "get b" then
// returned a's value. Each client runs as a script driven line by line
// from the test (clientProc), so that the test stops memcached or moves
// the engine's clock between its calls, all on one connection of the
// client.

// clientProc is a client library in a script that reads one command a
// line on its standard input and prints one line for each.
type clientProc struct {
	in  io.WriteCloser
	out *bufio.Reader
}

// startClientProc runs name with args; it is killed when the test ends
// or after a minute, which ends a read it would leave hanging.
func startClientProc(t *testing.T, name string, args ...string) *clientProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	cmd := exec.CommandContext(ctx, name, args...)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Wait()
		cancel()
		if stderr.Len() > 0 {
			t.Logf("%s stderr:\n%s", name, stderr.String())
		}
	})
	return &clientProc{in: in, out: bufio.NewReader(out)}
}

// do sends one command and returns the line the script printed for it.
func (p *clientProc) do(t *testing.T, cmd string) string {
	t.Helper()
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		t.Fatalf("%s: %v", cmd, err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil {
		t.Fatalf("%s: %v (script ended)", cmd, err)
	}
	return strings.TrimSuffix(line, "\n")
}

// pythonMemcache is a python-memcached client of argv[1]: "set KEY VALUE",
// "setn KEY N" (N bytes), "get KEY"; it prints repr() of each result.
const pythonMemcache = `
import sys, memcache
mc = memcache.Client([sys.argv[1]], socket_timeout=30)
for line in sys.stdin:
    w = line.split()
    if w[0] == "set":
        r = mc.set(w[1], w[2])
    elif w[0] == "setn":
        r = mc.set(w[1], "x" * int(w[2]))
    else:
        r = mc.get(w[1])
    print(repr(r), flush=True)
`

// phpMemcache is the same client in PHP's Memcache class (Debian's
// php-memcache), printing var_export() of each result. A failed get is
// a server failure to it, whatever the framing (it closes the connection
// on any line that is no VALUE or END), so it reads memcached's framing
// and the old one alike; retry_interval 0 lets it connect again at its
// next call instead of after 15 s, and the tests show it does.
const phpMemcache = `
[$host, $port] = explode(':', $argv[1]);
$m = new Memcache();
$m->addServer($host, (int)$port, false, 1, 30, 0);
while (($l = fgets(STDIN)) !== false) {
	$w = explode(' ', trim($l));
	if ($w[0] === 'set') { $r = $m->set($w[1], $w[2]); }
	elseif ($w[0] === 'setn') { $r = $m->set($w[1], str_repeat('x', (int)$w[2])); }
	else { $r = @$m->get($w[1]); }
	echo var_export($r, true), "\n";
}
`

// textClient is one of the clients above.
type textClient struct {
	name          string
	start         func(t *testing.T, addr string) *clientProc
	stored, value func(v string) string // how it prints a set's success, a value
	failed        string                // how it prints a failed get
}

var textClients = []textClient{
	{
		name: "python-memcached",
		start: func(t *testing.T, addr string) *clientProc {
			if exec.Command("/usr/bin/python3", "-c", "import memcache").Run() != nil {
				t.Skip("python-memcached not installed (make test installs python3-memcache)")
			}
			return startClientProc(t, "/usr/bin/python3", "-c", pythonMemcache, addr)
		},
		stored: func(string) string { return "True" },
		value:  func(v string) string { return "'" + v + "'" },
		failed: "None",
	},
	{
		name: "php-memcache",
		start: func(t *testing.T, addr string) *clientProc {
			if exec.Command("php", "-r", "exit(class_exists('Memcache') ? 0 : 1);").Run() != nil {
				t.Skip("php-memcache not installed (make test installs php-memcache)")
			}
			return startClientProc(t, "php", "-r", phpMemcache, addr)
		},
		stored: func(string) string { return "true" },
		value:  func(v string) string { return "'" + v + "'" },
		failed: "false",
	},
}

// TestTextClientsAfterUpstreamTimeout: a get whose upstream is stopped
// (SIGSTOP; the proxy's 1 s upstream timeout fires) fails; once the
// upstream is back, every key reads its own value on the same client.
func TestTextClientsAfterUpstreamTimeout(t *testing.T) {
	t.Parallel()
	for _, tcl := range textClients {
		t.Run(tcl.name, func(t *testing.T) {
			// One loop: the probe below and the client share its upstream
			// connection.
			// 1 s: the live memcached answers the sets within it on a loaded machine.
			p := startProxy(t, testConfig{upstream: `timeout = "1s"`, loops: 1})
			cl := tcl.start(t, p.Addr)
			for _, kv := range [][2]string{{"a", "A"}, {"b", "B"}, {"c", "C"}} {
				if got := cl.do(t, "set "+kv[0]+" "+kv[1]); got != tcl.stored(kv[1]) {
					t.Fatalf("set %s: %s", kv[0], got)
				}
			}
			thaw := p.MC.Freeze(t)
			if got := cl.do(t, "get a"); got != tcl.failed {
				t.Fatalf("get a with memcached stopped: %s, want %s", got, tcl.failed)
			}
			thaw()
			waitUpstream(t, p.Addr)
			for _, kv := range [][2]string{{"b", "B"}, {"c", "C"}, {"a", "A"}} {
				if got := cl.do(t, "get "+kv[0]); got != tcl.value(kv[1]) {
					t.Errorf("get %s after the failure: %s, want %s", kv[0], got, tcl.value(kv[1]))
				}
			}
		})
	}
}

// waitUpstream waits until a get through the proxy at addr is answered
// by memcached again (its upstream connection re-dialled after a
// failure), on a connection of its own.
func waitUpstream(t *testing.T, addr string) {
	t.Helper()
	tc := dialText(t, addr)
	eventually(t, time.Minute, "the upstream to answer again", func() bool {
		return textBatch(t, tc, "get probe\r\nmn\r\n") == "END\r\nMN\r\n"
	})
}

// TestTextClientsAfterMaxHoldRefusal: a get that throttle.max_hold
// refuses (the engine's clock stands still after a 10-unit set spent a
// second of the bucket's limit) fails; once the clock moves on, every key
// reads its own value on the same client.
func TestTextClientsAfterMaxHoldRefusal(t *testing.T) {
	t.Parallel()
	for _, tcl := range textClients {
		t.Run(tcl.name, func(t *testing.T) {
			clock := throttle.NewFakeClock(time.Hour)
			p := startProxyClock(t, testConfig{
				throttle: "capacity = \"unlimited\"\nburst_ms = 0\nmax_hold = \"50ms\"",
				tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 10\n",
			}, clock)
			cl := tcl.start(t, p.Addr)
			for _, c := range []string{"set a A", "set b B", "setn big 40950"} {
				clock.Advance(10 * time.Second)
				if got := cl.do(t, c); got != tcl.stored("") {
					t.Fatalf("%s: %s", c, got)
				}
			}
			if got := cl.do(t, "get a"); got != tcl.failed {
				t.Fatalf("get a refused by max_hold: %s, want %s", got, tcl.failed)
			}
			for _, kv := range [][2]string{{"b", "B"}, {"a", "A"}} {
				clock.Advance(10 * time.Second)
				if got := cl.do(t, "get "+kv[0]); got != tcl.value(kv[1]) {
					t.Errorf("get %s after the refusal: %s, want %s", kv[0], got, tcl.value(kv[1]))
				}
			}
		})
	}
}
