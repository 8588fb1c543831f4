package proxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

type testProxy struct {
	*Server
	Addr      string
	MC        *testmc.Server
	StatePath string
	stop      func(testing.TB) // shuts the proxy down; safe to call twice
}

// testConfig is a configuration file in parts: lines inside [proxy],
// [upstream] and [throttle], and a tail of [[bucket]] and [[user]] tables.
type testConfig struct {
	proxy, upstream, throttle string
	tail                      string // default: one bucket "default" with flush enabled
	loops                     int
	state                     *bucketcfg.State
	statePath                 string // default: in a temp dir
}

func (tc testConfig) render(listen string, servers []string, statePath string) string {
	quoted := make([]string, len(servers))
	for i, s := range servers {
		quoted[i] = fmt.Sprintf("%q", s)
	}
	tail := tc.tail
	if tail == "" {
		tail = "[[bucket]]\nname = \"default\"\nflush_enabled = true\n"
	}
	up := tc.upstream
	if !strings.Contains(up, "timeout") {
		up += "\ntimeout = \"2s\""
	}
	return fmt.Sprintf("[proxy]\nlisten = %q\n%s\n[upstream]\nservers = [%s]\n%s\n[throttle]\nstate_file = %q\n%s\n[metrics]\nlisten = \"\"\n%s",
		listen, tc.proxy, strings.Join(quoted, ", "), up, statePath, tc.throttle, tail)
}

// startProxy runs a proxy in front of a fresh memcached. It is shut down
// when the test ends.
func startProxy(t testing.TB, tc testConfig) *testProxy {
	t.Helper()
	return startProxyTo(t, testmc.Start(t), tc)
}

func startProxyTo(t testing.TB, m *testmc.Server, tc testConfig) *testProxy {
	t.Helper()
	statePath := tc.statePath
	if statePath == "" {
		statePath = filepath.Join(t.TempDir(), "state.json")
	}
	listen := testmc.FreeAddr(t)
	cfg, err := bucketcfg.Parse([]byte(tc.render(listen, []string{m.Addr}, statePath)))
	if err != nil {
		t.Fatalf("test config: %v", err)
	}
	st := tc.state
	if st == nil {
		if st, err = bucketcfg.LoadState(statePath); err != nil {
			t.Fatal(err)
		}
	}
	srv, err := New(Options{Config: cfg, State: st, EventLoops: tc.loops, Logger: testLogger(t), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return &testProxy{Server: srv, Addr: listen, MC: m, StatePath: statePath, stop: testmc.Serve(t, srv)}
}

func testLogger(t testing.TB) zerolog.Logger {
	if os.Getenv("KVTHROTTLE_TEST_LOG") != "" {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Logger()
	}
	return zerolog.Nop()
}

func dial(t testing.TB, addr string) *mcclient.Client {
	t.Helper()
	c, err := mcclient.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// eventually polls cond until it is true or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
