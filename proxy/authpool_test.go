package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// Connection pools opened at once with the password cache cold (issue 27
// point 2): every connection of the pool logs in and its data lands in the
// tenant's bucket. Each test starts its own proxy, so the cache is cold.
// The pool's user has a bcrypt hash at the default cost (10, tens of
// milliseconds a check), as in production: what these tests are about is
// logins arriving while a check runs. Before the fix, all but 9 (one
// running, eight queued per source) of a pool got Etmpfail.

const (
	poolSize = 32
	poolUser = "pool"
	poolPass = "pool-pw"
)

// poolHash is the pool user's password hash, at bcrypt's default cost
// (lower under the race detector, which makes bcrypt many times slower).
var poolHash = sync.OnceValues(func() (string, error) {
	cost := bcrypt.DefaultCost
	if testmc.RaceEnabled {
		cost -= 2
	}
	h, err := bcrypt.GenerateFromPassword([]byte(poolPass), cost)
	return string(h), err
})

// poolTail: buckets default and pool, the pool user (its own bucket) and
// tenantTail's alice and bob with their cheap hashes.
func poolTail(t testing.TB) string {
	h, err := poolHash()
	if err != nil {
		t.Fatal(err)
	}
	return tenantTail(t) + fmt.Sprintf(`
[[bucket]]
name = %q
[[user]]
name = %q
password_hash = %q
buckets = [%q]
`, poolUser, poolUser, h, poolUser)
}

// checkPoolData checks that each key holds its value in the pool user's
// bucket, and that none is in the default bucket (what an unauthenticated
// connection sees).
func checkPoolData(t *testing.T, addr string, kv map[string]string) {
	t.Helper()
	owner := login(t, addr, poolUser)
	anon := dial(t, addr)
	for k, v := range kv {
		if r, err := owner.Get([]byte(k)); err != nil || r.Status() != mc.StatusSuccess || string(r.Value) != v {
			t.Errorf("key %s in the pool's bucket: %v %+v, want %q", k, err, r, v)
		}
		if r, err := anon.Get([]byte(k)); err != nil || r.Status() != mc.StatusKeyEnoent {
			t.Errorf("key %s in default_bucket: %v %+v, want a miss", k, err, r)
		}
	}
}

// authCount is kvthrottle_auth_total{mechanism,result} as srv counts it.
func authCount(srv *Server, mech, result string) uint64 {
	for _, a := range srv.AppendAuth(nil) {
		if a.Mechanism == mech && a.Result == result {
			return a.Count
		}
	}
	return 0
}

// TestAuthPoolColdBinary: 32 connections (the Go client) send SASL PLAIN
// at the same moment with the cache cold; all log in (one password check
// for all of them), store and read their keys in the pool's bucket, and
// kvthrottle_auth_total counts 32 successes and no refusal.
func TestAuthPoolColdBinary(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: poolTail(t)})
	conns := make([]*mcclient.Client, poolSize)
	for i := range conns {
		conns[i] = dial(t, p.Addr)
		conns[i].Timeout = clientPatience
	}
	auth := mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00" + poolUser + "\x00" + poolPass)}
	for _, c := range conns { // all sent before any answer is read
		c.Send(auth)
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	kv := map[string]string{}
	ok := 0
	for i, c := range conns {
		r, err := c.Read()
		if err != nil || r.Status() != mc.StatusSuccess {
			t.Errorf("connection %d: login %v %+v", i, err, r)
			continue
		}
		ok++
		k, v := fmt.Sprintf("pool-go-%d", i), fmt.Sprintf("value %d", i)
		if r, err := c.Set([]byte(k), []byte(v)); err != nil || r.Status() != mc.StatusSuccess {
			t.Errorf("connection %d: set %v %+v", i, err, r)
		}
		kv[k] = v
	}
	if ok != poolSize {
		t.Fatalf("%d of %d connections logged in", ok, poolSize)
	}
	checkPoolData(t, p.Addr, kv)
	if n := authCount(p.Server, "PLAIN", "success"); n < poolSize {
		t.Errorf("kvthrottle_auth_total{PLAIN,success} = %d, want >= %d", n, poolSize)
	}
	if n := authCount(p.Server, "PLAIN", "refused"); n != 0 {
		t.Errorf("kvthrottle_auth_total{PLAIN,refused} = %d, want 0", n)
	}
}

// TestAuthPoolColdText: 32 text-protocol connections authenticate at once
// with memcached's text authentication (`set <key> 0 0 <n>` carrying
// "<user> <password>"), as gomemcache-based applications do by hand: all
// get STORED, and their keys land in the pool's bucket.
func TestAuthPoolColdText(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: poolTail(t)})
	type textConn struct {
		c net.Conn
		r *bufio.Reader
	}
	conns := make([]textConn, poolSize)
	cred := poolUser + " " + poolPass
	for i := range conns {
		c, err := net.DialTimeout("tcp", p.Addr, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = textConn{c, bufio.NewReader(c)}
	}
	for _, tc := range conns {
		if _, err := fmt.Fprintf(tc.c, "set auth 0 0 %d\r\n%s\r\n", len(cred), cred); err != nil {
			t.Fatal(err)
		}
	}
	line := func(tc textConn) string {
		_ = tc.c.SetReadDeadline(time.Now().Add(clientPatience))
		l, err := tc.r.ReadString('\n')
		if err != nil {
			return err.Error()
		}
		return strings.TrimRight(l, "\r\n")
	}
	kv := map[string]string{}
	ok := 0
	for i, tc := range conns {
		if got := line(tc); got != "STORED" {
			t.Errorf("connection %d: text auth answered %q", i, got)
			continue
		}
		ok++
		k, v := fmt.Sprintf("pool-text-%d", i), fmt.Sprintf("text %d", i)
		fmt.Fprintf(tc.c, "set %s 0 0 %d\r\n%s\r\nget %s\r\n", k, len(v), v, k)
		want := []string{"STORED", "VALUE " + k + " 0 " + fmt.Sprint(len(v)), v, "END"}
		for _, w := range want {
			if got := line(tc); got != w {
				t.Errorf("connection %d: %q, want %q", i, got, w)
				break
			}
		}
		kv[k] = v
	}
	if ok != poolSize {
		t.Fatalf("%d of %d text connections authenticated", ok, poolSize)
	}
	owner := login(t, p.Addr, poolUser)
	for k, v := range kv {
		if r, err := owner.Get([]byte(k)); err != nil || string(r.Value) != v {
			t.Errorf("key %s in the pool's bucket: %v %+v", k, err, r)
		}
	}
	if n := authCount(p.Server, "text", "success"); n != poolSize {
		t.Errorf("kvthrottle_auth_total{text,success} = %d, want %d", n, poolSize)
	}
}

// TestAuthPoolTLS64: a pool of 64 TLS connections from one host, all
// connected before any handshake starts (as a pool opened at once is):
// every one completes its handshake, logs in with SASL PLAIN and stores
// its key in the pool's bucket. Before the fix, the connections beyond the
// per-source handshake bound (32) were closed at once. The engine's clock
// is a fake one that stands still: on the real clock, a machine loaded
// enough that no handshake stepped for tlsParkPatience closed the waiting
// half (as it should: TestTLSParkPatience), and the test failed by chance.
func TestAuthPoolTLS64(t *testing.T) {
	t.Parallel()
	const n = 2 * tlsMaxHandshakesPerSource
	s := startTLSProxyWith(t, false, testConfig{tail: poolTail(t), clock: throttle.NewFakeClock(0)})
	raw := dialMany(t, s.p.TLSAddr(), n)
	var wg sync.WaitGroup
	var handshakeFailures atomic.Int32
	errs := make([]error, n)
	for i, c := range raw {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tc := tls.Client(c, &tls.Config{RootCAs: s.ca.Pool(), ServerName: "localhost"})
			_ = tc.SetDeadline(time.Now().Add(clientPatience))
			if err := tc.Handshake(); err != nil {
				handshakeFailures.Add(1)
				errs[i] = fmt.Errorf("handshake: %w", err)
				return
			}
			cl := mcclient.New(tc)
			if err := cl.AuthPlainNoList(poolUser, poolPass); err != nil {
				errs[i] = fmt.Errorf("login: %w", err)
				return
			}
			k := fmt.Sprintf("pool-tls-%d", i)
			if r, err := cl.Set([]byte(k), []byte(k)); err != nil || r.Status() != mc.StatusSuccess {
				errs[i] = fmt.Errorf("set: %v %+v", err, r)
			}
		}()
	}
	wg.Wait()
	failed := 0
	for i, err := range errs {
		if err != nil {
			failed++
			if failed <= 3 {
				t.Errorf("connection %d: %v", i, err)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d TLS connections from one host failed, %d of them at the handshake", failed, n, handshakeFailures.Load())
	}
	kv := map[string]string{}
	for i := range n {
		k := fmt.Sprintf("pool-tls-%d", i)
		kv[k] = k
	}
	checkPoolData(t, s.p.Addr, kv)
}

// TestFailedAuthGetsEaccess: after a failed SASL login (a wrong password,
// or a mechanism the proxy does not offer) on a connection that could use
// default_bucket, data commands get Eaccess, never the default bucket's
// data, until a login succeeds; SelectBucket of the default bucket is
// refused too. kvthrottle_auth_total counts the failure.
func TestFailedAuthGetsEaccess(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	key := []byte("shared-name")
	if r, err := dial(t, p.Addr).Set(key, []byte("anonymous data")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("set in default: %s", r.Status())
	}
	for _, bad := range []mcclient.Request{
		{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00alice\x00wrong")},
		{Opcode: mc.OpSASLAuth, Key: []byte("CRAM-MD5"), Value: []byte("alice")},
	} {
		c := dial(t, p.Addr)
		if r, err := c.Do(bad); status(t, r, err) != mc.StatusAuthError {
			t.Fatalf("%s: %s, want AuthError", bad.Key, r.Status())
		}
		if r, err := c.Get(key); status(t, r, err) != mc.StatusEaccess {
			t.Errorf("%s: GET after the failed login: %s %q, want Eaccess", bad.Key, r.Status(), r.Value)
		}
		if r, err := c.Set([]byte("memjs-would-write"), []byte("x")); status(t, r, err) != mc.StatusEaccess {
			t.Errorf("%s: SET after the failed login: %s, want Eaccess", bad.Key, r.Status())
		}
		if r, err := c.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("default")}); status(t, r, err) != mc.StatusEaccess {
			t.Errorf("%s: select default after the failed login: %s, want Eaccess", bad.Key, r.Status())
		}
		if err := c.AuthPlainNoList("alice", "alice-pw"); err != nil {
			t.Fatalf("login after the failure: %v", err)
		}
		if r, err := c.Get(key); status(t, r, err) != mc.StatusKeyEnoent {
			t.Errorf("%s: GET in alice's bucket after logging in: %s %q, want a miss", bad.Key, r.Status(), r.Value)
		}
	}
	if r, err := dial(t, p.Addr).Get([]byte("memjs-would-write")); status(t, r, err) != mc.StatusKeyEnoent {
		t.Errorf("a refused client's SET reached default_bucket: %s", r.Status())
	}
	if n := authCount(p.Server, "PLAIN", "failure"); n != 1 {
		t.Errorf("kvthrottle_auth_total{PLAIN,failure} = %d, want 1", n)
	}
	if n := authCount(p.Server, "other", "invalid"); n != 1 {
		t.Errorf("kvthrottle_auth_total{other,invalid} = %d, want 1", n)
	}
}

// TestAuthRestartStorm: after a restart, 8 application hosts (127.0.0.2
// to 127.0.0.9) each open a pool of 24 connections of the same user at
// once: all 192 log in. Before the fix, each host got 9.
func TestAuthRestartStorm(t *testing.T) {
	t.Parallel()
	const hosts, per = 8, 24
	p := startProxy(t, testConfig{proxy: `plain_auth = "anywhere"`, tail: poolTail(t)})
	var conns []*mcclient.Client
	for h := range hosts {
		d := net.Dialer{Timeout: time.Minute, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+h))}}
		for range per {
			nc, err := d.Dial("tcp", p.Addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { nc.Close() })
			c := mcclient.New(nc)
			c.Timeout = clientPatience
			conns = append(conns, c)
		}
	}
	auth := mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00" + poolUser + "\x00" + poolPass)}
	for _, c := range conns {
		c.Send(auth)
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	ok := 0
	for _, c := range conns {
		if r, err := c.Read(); err == nil && r.Status() == mc.StatusSuccess {
			ok++
		}
	}
	if ok != hosts*per {
		t.Fatalf("%d of %d connections of %d hosts logged in", ok, hosts*per, hosts)
	}
}
