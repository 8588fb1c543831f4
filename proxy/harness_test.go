package proxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

type testProxy struct {
	*Server
	Addr string
	MC   *testmc.Server
	// Upstream is the address the proxy dials: MC.Addr, or MC.TLSAddr
	// with upstream TLS on.
	Upstream  string
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
	// upstreamTLS: lines inside [upstream.tls]; set, startProxyTo sends
	// the proxy to the server's TLSAddr. With KVTHROTTLE_TEST_UPSTREAM_TLS=1
	// (testmc.UpstreamTLSEnv) and none given, TLS verified by the test CA.
	upstreamTLS string
	log         io.Writer      // the proxy's log (default: testLogger's)
	clock       throttle.Clock // the throttle engine's clock (default: the real one)
}

func (tc testConfig) render(listen string, servers []string, statePath string) string {
	tail := tc.tail
	if tail == "" {
		tail = "[[bucket]]\nname = \"default\"\nflush_enabled = true\n"
	}
	up := tc.upstream
	if tc.upstreamTLS == "" && testmc.UpstreamTLS() {
		servers, tc.upstreamTLS = tlsServers(servers)
	}
	if !strings.Contains(up, "timeout") {
		up += "\ntimeout = \"2s\""
	}
	if tc.upstreamTLS != "" {
		up += "\n[upstream.tls]\n" + tc.upstreamTLS
	}
	quoted := make([]string, len(servers))
	for i, s := range servers {
		quoted[i] = fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("[proxy]\nlisten = %q\n%s\n[upstream]\nservers = [%s]\n%s\n[throttle]\nstate_file = %q\n%s\n[metrics]\nlisten = \"\"\n%s",
		listen, tc.proxy, strings.Join(quoted, ", "), up, statePath, tc.throttle, tail)
}

// tlsServers is servers with every test memcached started with TLS
// named by its TLS address, and the [upstream.tls] lines that verify
// them (KVTHROTTLE_TEST_UPSTREAM_TLS=1); servers unchanged and "" when
// one of them has no TLS port.
func tlsServers(servers []string) ([]string, string) {
	out := make([]string, len(servers))
	caFile := ""
	for i, s := range servers {
		tlsAddr, ca, ok := testmc.TLSPeer(s)
		if !ok {
			return servers, ""
		}
		out[i], caFile = tlsAddr, ca // one CA signs them all (testmc.TestCA)
	}
	return out, fmt.Sprintf("enabled = true\nca_file = %q\n", caFile)
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
	server := m.Addr // with KVTHROTTLE_TEST_UPSTREAM_TLS=1, render names its TLS port
	if tc.upstreamTLS != "" {
		server = m.TLSAddr
	}
	cfg, err := bucketcfg.Parse([]byte(tc.render(listen, []string{server}, statePath)))
	if err != nil {
		t.Fatalf("test config: %v", err)
	}
	st := tc.state
	if st == nil {
		if st, err = bucketcfg.LoadState(statePath); err != nil {
			t.Fatal(err)
		}
	}
	log := testLogger(t)
	if tc.log != nil {
		log = zerolog.New(tc.log)
	}
	srv, err := New(Options{Config: cfg, State: st, EventLoops: tc.loops, Logger: log, Version: "test", Clock: tc.clock})
	if err != nil {
		t.Fatal(err)
	}
	checkPauseMoves(t, srv)
	return &testProxy{Server: srv, Addr: listen, MC: m, Upstream: cfg.Upstream.Servers[0], StatePath: statePath, stop: testmc.Serve(t, srv)}
}

// checkPauseMoves makes the test fail if a session of srv attempted an
// illegal pause transition (state.go) by the time srv has stopped: every
// test through the proxy checks the transition table against real traffic.
// Call it before the proxy is started (cleanups run last first).
func checkPauseMoves(t testing.TB, srv *Server) {
	t.Cleanup(func() {
		if n := srv.badPauseMoves.Load(); n > 0 {
			t.Errorf("%d illegal session pause transitions were refused (see state.go's pauseMoves)", n)
		}
	})
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

// eventually is testmc.Eventually.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testmc.Eventually(t, d, what, cond)
}

// hashes returns the password hashes of the test users, each user's
// password being its name and "-pw" (cheap hashes, the same on every call).
func hashes(t testing.TB) map[string]string {
	h := map[string]string{}
	for _, u := range []string{"admin", "alice", "bob", "limited", "free"} {
		h[u] = testmc.PasswordHash(t, u+"-pw")
	}
	return h
}

// tenantTail is a bucket and user layout: default, alice (flush
// enabled), bob, and users admin (all buckets, admin + unthrottled), alice
// and bob (their own bucket each).
func tenantTail(t testing.TB) string {
	h := hashes(t)
	return fmt.Sprintf(`
[[bucket]]
name = "default"
[[bucket]]
name = "alice"
flush_enabled = true
[[bucket]]
name = "bob"
[[user]]
name = "admin"
password_hash = %q
buckets = ["*"]
privileges = ["admin", "unthrottled"]
[[user]]
name = "alice"
password_hash = %q
buckets = ["alice"]
[[user]]
name = "bob"
password_hash = %q
buckets = ["bob"]
`, h["admin"], h["alice"], h["bob"])
}

func login(t testing.TB, addr, user string) *mcclient.Client {
	t.Helper()
	c := dial(t, addr)
	r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00" + user + "\x00" + user + "-pw")})
	if err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("login %s: %v %+v", user, err, r)
	}
	return c
}

func status(t testing.TB, r *mcclient.Response, err error) mc.Status {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return r.Status()
}

func adminDo(t testing.TB, c *mcclient.Client, op mc.Opcode, key, body string) *mcclient.Response {
	t.Helper()
	r, err := c.Do(mcclient.Request{Opcode: op, Key: []byte(key), Value: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func hello(t testing.TB, c *mcclient.Client, features ...mc.Feature) {
	t.Helper()
	var v []byte
	for _, f := range features {
		v = append(v, byte(f>>8), byte(f))
	}
	r, err := c.Do(mcclient.Request{Opcode: mc.OpHello, Key: []byte("test"), Value: v})
	if err != nil || r.Status() != mc.StatusSuccess || !bytes.Equal(r.Value, v) {
		t.Fatalf("HELLO %v: %v %+v", features, err, r)
	}
}

// pipelineGets keeps depth GETs of key in flight on c until stop is
// closed, and reports the arrival time of each hit. At stop it closes c
// (without waiting for the GETs still held by the throttle) and returns;
// errors before stop fail t.
func pipelineGets(t testing.TB, c *mcclient.Client, key string, depth int, stop <-chan struct{}, arrived func(time.Time)) {
	timedGets(t, c, key, depth, stop, func(_, got time.Time) { arrived(got) })
}

// timedGets is pipelineGets reporting when each GET was sent and when it
// was answered (a connection's answers come in the order of its requests).
func timedGets(t testing.TB, c *mcclient.Client, key string, depth int, stop <-chan struct{}, answered func(sent, got time.Time)) {
	sent := make(chan time.Time, depth) // a slot taken before a GET is sent
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
		case <-done:
		}
		c.Close() // ends the Read below
	}()
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-done:
				return
			case sent <- time.Now():
			}
			c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte(key)})
			if err := c.Flush(); err != nil {
				return // closed: Read reports what matters
			}
		}
	}()
	for {
		r, err := c.Read()
		select {
		case <-stop:
			return
		default:
		}
		if err != nil {
			t.Errorf("read: %v", err)
			return
		}
		if r.Status() != mc.StatusSuccess {
			t.Errorf("GET %s: status %v %q", key, r.Status(), r.Value)
			return
		}
		answered(<-sent, time.Now())
	}
}

func startTwoServerProxy(t *testing.T, upstreamExtra string) (*testProxy, *testmc.Server, *testmc.Server) {
	a, b := testmc.Start(t), testmc.Start(t)
	statePath := t.TempDir() + "/state.json"
	listen := testmc.FreeAddr(t)
	tc := testConfig{upstream: upstreamExtra, throttle: `capacity = "unlimited"`}
	cfg, err := bucketcfg.Parse([]byte(tc.render(listen, []string{a.Addr, b.Addr}, statePath)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Config: cfg, Logger: testLogger(t), HealthInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	checkPauseMoves(t, srv)
	p := &testProxy{Server: srv, Addr: listen, MC: a, Upstream: cfg.Upstream.Servers[0], StatePath: statePath, stop: testmc.Serve(t, srv)}
	return p, a, b
}

func limitedTail(t testing.TB) string {
	h := hashes(t)
	return fmt.Sprintf(`
[[bucket]]
name = "default"
[[bucket]]
name = "limited"
hard_limit = 2000
[[bucket]]
name = "free"
[[user]]
name = "limited"
password_hash = %q
buckets = ["limited"]
[[user]]
name = "free"
password_hash = %q
buckets = ["free"]
`, h["limited"], h["free"])
}

func runMixed(addr string, ci, ops int) error {
	c, err := mcclient.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	counter := []byte(fmt.Sprintf("c%d-counter", ci))
	var count uint64
	for i := 0; i < ops; i++ {
		key := []byte(fmt.Sprintf("c%d-k%d", ci, i%10))
		val := []byte(fmt.Sprintf("client %d value %d %s", ci, i, bytes.Repeat([]byte{'x'}, i%200)))
		switch i % 4 {
		case 0:
			if r, err := c.Set(key, val); err != nil || r.Status() != mc.StatusSuccess {
				return fmt.Errorf("client %d set %d: %v %v", ci, i, err, r)
			}
			r, err := c.Get(key)
			if err != nil || r.Status() != mc.StatusSuccess || !bytes.Equal(r.Value, val) {
				return fmt.Errorf("client %d get %d: got %q want %q (%v)", ci, i, r.Value, val, err)
			}
		case 1:
			r, err := c.Incr(counter, 1, 1)
			if err != nil || r.Status() != mc.StatusSuccess {
				return fmt.Errorf("client %d incr: %v %v", ci, err, r)
			}
			count++
			if got := binary.BigEndian.Uint64(r.Value); got != count {
				return fmt.Errorf("client %d incr: counter %d, want %d", ci, got, count)
			}
		case 2:
			if r, err := c.Delete(key); err != nil || (r.Status() != mc.StatusSuccess && r.Status() != mc.StatusKeyEnoent) {
				return fmt.Errorf("client %d delete: %v %v", ci, err, r)
			}
			if r, err := c.Get(key); err != nil || r.Status() != mc.StatusKeyEnoent {
				return fmt.Errorf("client %d get after delete: %v %v", ci, err, r)
			}
		case 3:
			// A pipelined pair: SET then GETK, answered in order.
			c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(uint32(ci), 0), Key: key, Value: val})
			c.Send(mcclient.Request{Opcode: mc.OpGetK, Key: key})
			if err := c.Flush(); err != nil {
				return err
			}
			r1, err1 := c.Read()
			r2, err2 := c.Read()
			if err1 != nil || err2 != nil || r1.Opcode != mc.OpSet || r2.Opcode != mc.OpGetK ||
				!bytes.Equal(r2.Key, key) || !bytes.Equal(r2.Value, val) || binary.BigEndian.Uint32(r2.Extras) != uint32(ci) {
				return fmt.Errorf("client %d pipelined set/getk: %v %v %+v %+v", ci, err1, err2, r1, r2)
			}
		}
	}
	return nil
}

// readStatus reads one response from conn within d.
func readStatus(t testing.TB, conn net.Conn, d time.Duration) (mc.Header, error) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	var hb [mc.HeaderLen]byte
	if _, err := io.ReadFull(conn, hb[:]); err != nil {
		return mc.Header{}, err
	}
	h, _ := mc.ParseHeader(hb[:])
	if _, err := io.CopyN(io.Discard, conn, int64(h.BodyLen)); err != nil {
		return h, err
	}
	return h, nil
}
