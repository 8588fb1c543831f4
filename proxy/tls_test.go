package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestTLSBinary runs binary commands over TLS with no client certificate:
// the connection gets the default bucket, SASL works as on proxy.listen,
// a 1 MiB value and pipelined quiet gets come through whole.
func TestTLSBinary(t *testing.T) {
	st := statusFn(t)
	s := startTLSProxy(t, false, "")
	c := s.client(t, nil)

	if st := st(c.Set([]byte("k"), []byte("v1"))); st != mc.StatusSuccess {
		t.Fatalf("SET over TLS: %v", st)
	}
	r, err := c.Get([]byte("k"))
	if err != nil || r.Status() != mc.StatusSuccess || string(r.Value) != "v1" {
		t.Fatalf("GET over TLS: %v %+v", err, r)
	}
	// The same key, through the plaintext listener (the same bucket).
	r, err = dial(t, s.p.Addr).Get([]byte("k"))
	if err != nil || string(r.Value) != "v1" {
		t.Fatalf("GET over plaintext: %v %+v", err, r)
	}

	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	big = big[:len(big)-512]                               // under memcached's item size with the key
	if st := st(c.Set([]byte("big"), big)); st != mc.StatusSuccess {
		t.Fatalf("SET 1 MiB: %v", st)
	}
	r, err = c.Get([]byte("big"))
	if err != nil || !bytes.Equal(r.Value, big) {
		t.Fatalf("GET 1 MiB: %v, %d bytes", err, len(r.Value))
	}

	if st := st(c.Incr([]byte("n"), 5, 10)); st != mc.StatusSuccess {
		t.Fatalf("INCR: %v", st)
	}
	if st := st(c.Delete([]byte("k"))); st != mc.StatusSuccess {
		t.Fatalf("DELETE: %v", st)
	}
	r, err = c.Do(mcclient.Request{Opcode: mc.OpVersion})
	if err != nil || r.Status() != mc.StatusSuccess || len(r.Value) == 0 {
		t.Fatalf("VERSION: %v %+v", err, r)
	}

	// Pipelined quiet gets: hits answer, misses say nothing, NOOP ends.
	for i := 0; i < 100; i++ {
		if i%2 == 0 {
			c.Send(mcclient.Request{Opcode: mc.OpSetQ, Extras: mcclient.SetExtras(0, 0), Key: fmt.Appendf(nil, "q%d", i), Value: fmt.Appendf(nil, "v%d", i)})
		}
	}
	for i := 0; i < 100; i++ {
		c.Send(mcclient.Request{Opcode: mc.OpGetKQ, Key: fmt.Appendf(nil, "q%d", i)})
	}
	c.Send(mcclient.Request{Opcode: mc.OpNoop})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	hits := 0
	for {
		r, err := c.Read()
		if err != nil {
			t.Fatalf("pipelined quiet gets: %v", err)
		}
		if r.Opcode == mc.OpNoop {
			break
		}
		if r.Opcode != mc.OpGetKQ || string(r.Value) != "v"+strings.TrimPrefix(string(r.Key), "q") {
			t.Fatalf("unexpected response %+v", r)
		}
		hits++
	}
	if hits != 50 {
		t.Fatalf("%d hits, want 50", hits)
	}

	// SASL over TLS, as on proxy.listen: bob lands in his bucket.
	if err := c.AuthPlain("bob", "bob-pw"); err != nil {
		t.Fatalf("SASL PLAIN over TLS: %v", err)
	}
	if st := st(c.Set([]byte("bk"), []byte("bob's"))); st != mc.StatusSuccess {
		t.Fatalf("SET as bob: %v", st)
	}
	r, err = login(t, s.p.Addr, "bob").Get([]byte("bk"))
	if err != nil || string(r.Value) != "bob's" {
		t.Fatalf("bob over plaintext: %v %+v", err, r)
	}
}

// TestTLSText: a text-protocol client over TLS.
func TestTLSText(t *testing.T) {
	s := startTLSProxy(t, false, "")
	c, err := s.dialTLS(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(clientPatience))
	br := bufio.NewReader(c)
	for _, x := range []struct{ send, want string }{
		{"set tk 5 0 5\r\nhello\r\n", "STORED\r\n"},
		{"get tk\r\n", "VALUE tk 5 5\r\nhello\r\nEND\r\n"},
		{"mg tk v\r\n", "VA 5\r\nhello\r\n"},
		{"delete tk\r\n", "DELETED\r\n"},
		{"get tk\r\n", "END\r\n"},
	} {
		if _, err := io.WriteString(c, x.send); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(x.want))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != x.want {
			t.Fatalf("%q: got %q (%v), want %q", x.send, got, err, x.want)
		}
	}
	if _, err := io.WriteString(c, "version\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "VERSION ") {
		t.Fatalf("version: %q %v", line, err)
	}
}

// TestTLSCertUser: with client_ca_file, a client whose certificate names
// bob is bob from its first byte, without SASL (and authentication is
// otherwise required): what it writes is bob's, readable by bob over
// plaintext SASL and not by alice.
func TestTLSCertUser(t *testing.T) {
	st := statusFn(t)
	s := startTLSProxy(t, true, `default_bucket = ""`)
	c := s.client(t, s.clientCert(t, "bob"))
	if st := st(c.Set([]byte("mine"), []byte("bob's value"))); st != mc.StatusSuccess {
		t.Fatalf("SET as certificate user bob: %v", st)
	}
	r, err := login(t, s.p.Addr, "bob").Get([]byte("mine"))
	if err != nil || string(r.Value) != "bob's value" {
		t.Fatalf("bob over plaintext: %v %+v", err, r)
	}
	r, err = login(t, s.p.Addr, "alice").Get([]byte("mine"))
	if err != nil || r.Status() != mc.StatusKeyEnoent {
		t.Fatalf("alice sees bob's key: %v %+v", err, r)
	}
	// A refused SASL AUTH leaves the connection its certificate's user.
	if err := c.AuthPlain("alice", "wrong"); err == nil {
		t.Fatal("wrong password accepted")
	}
	r, err = c.Get([]byte("mine"))
	if err != nil || string(r.Value) != "bob's value" {
		t.Fatalf("after a refused SASL AUTH: %v %+v", err, r)
	}
	// Its address is the client's, not the socketpair's.
	if got, want := remotes(s.p.Server), c.Conn().LocalAddr().String(); !strings.Contains(got, want) {
		t.Fatalf("session remotes %q, want one %q", got, want)
	}
}

// remotes lists the remote addresses of the proxy's open sessions.
func remotes(srv *Server) string {
	var out []string
	srv.eachLoop(func(lp *loop) {
		done := make(chan struct{})
		_ = lp.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
			for ss := range lp.sessions {
				out = append(out, ss.remote)
			}
			close(done)
			return nil
		}))
		<-done
	})
	return strings.Join(out, " ")
}

// TestTLSRefusedCertificates: with client_ca_file, a certificate naming no
// user, one signed by another CA, an expired one, and none at all are
// refused at the handshake; no session opens.
func TestTLSRefusedCertificates(t *testing.T) {
	s := startTLSProxy(t, true, "")
	other := testcerts.NewCA(t, "another CA")
	otherCert := other.Issue(t, testcerts.Leaf{CN: "bob", Client: true}).TLS(t)
	expired := s.ca.Issue(t, testcerts.Leaf{CN: "bob", Client: true,
		NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-24 * time.Hour)}).TLS(t)
	cases := []struct {
		name string
		cert *tls.Certificate
	}{
		{"unknown user", s.clientCert(t, "mallory")},
		{"another CA", &otherCert},
		{"expired", &expired},
		{"no certificate", nil},
	}
	for _, x := range cases {
		t.Run(x.name, func(t *testing.T) {
			before := s.p.tls.failures.Load()
			// With TLS 1.3 the client's handshake ends before the server
			// has checked its certificate: the refusal comes as an alert
			// on the first read.
			c, err := s.dialTLS(t, x.cert)
			if err == nil {
				cl := mcclient.New(c)
				_, err = cl.Do(mcclient.Request{Opcode: mc.OpVersion})
			}
			if err == nil {
				t.Fatal("served")
			}
			eventually(t, time.Minute, "the failure counted", func() bool { return s.p.tls.failures.Load() == before+1 })
		})
	}
	if n := s.p.Connections(); n != 0 {
		t.Fatalf("%d sessions opened", n)
	}
	// A good one still gets in.
	c := s.client(t, s.clientCert(t, "alice"))
	if _, err := c.Do(mcclient.Request{Opcode: mc.OpVersion}); err != nil {
		t.Fatal(err)
	}
}

// TestTLSReload: SIGHUP's Reload serves a new certificate to new
// connections while an open one keeps working; a bad certificate is
// refused, naming the key, and the one in force stays.
func TestTLSReload(t *testing.T) {
	st := statusFn(t)
	s := startTLSProxy(t, false, "")
	old := s.client(t, nil)
	if st := st(old.Set([]byte("k"), []byte("v"))); st != mc.StatusSuccess {
		t.Fatal(st)
	}
	serial := func(c *mcclient.Client) string {
		return c.Conn().(*tls.Conn).ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	oldSerial := serial(old)

	// Rotate to a new certificate.
	s.ca.Server(t).Write(t, s.dir, "server")
	reload := func() error {
		cfg, err := bucketcfg.Parse([]byte(s.tc.render(s.p.Addr, []string{s.p.MC.Addr}, s.p.StatePath)))
		if err != nil {
			t.Fatal(err)
		}
		return s.p.Reload(cfg)
	}
	if err := reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	fresh := s.client(t, nil)
	newSerial := serial(fresh)
	if newSerial == oldSerial {
		t.Fatal("a new connection got the old certificate")
	}
	for _, c := range []*mcclient.Client{old, fresh} {
		r, err := c.Get([]byte("k"))
		if err != nil || string(r.Value) != "v" {
			t.Fatalf("GET after the reload: %v %+v", err, r)
		}
	}

	// A bad certificate: the reload is refused, the certificate in force
	// stays.
	if err := os.WriteFile(s.certFile, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := reload()
	if err == nil || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Fatalf("reload with a bad certificate: %v", err)
	}
	if got := serial(s.client(t, nil)); got != newSerial {
		t.Fatal("the certificate in force changed after a refused reload")
	}
	if r, err := old.Get([]byte("k")); err != nil || string(r.Value) != "v" {
		t.Fatalf("old connection after a refused reload: %v %+v", err, r)
	}
}

// TestTLSHandshakeSourceLimit: one source may have only so many
// handshakes in progress; more connections are closed at once, and a
// client gets in again once they end.
func TestTLSHandshakeSourceLimit(t *testing.T) {
	s := startTLSProxy(t, false, "")
	var silent []net.Conn
	for i := 0; i < tlsMaxHandshakesPerSource; i++ {
		c, err := net.Dial("tcp", s.p.TLSAddr())
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	eventually(t, time.Minute, "the silent handshakes in progress", func() bool {
		s.p.tls.mu.Lock()
		defer s.p.tls.mu.Unlock()
		return s.p.tls.sources["127.0.0.1"] == tlsMaxHandshakesPerSource
	})
	extra, err := net.Dial("tcp", s.p.TLSAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	_ = extra.SetReadDeadline(time.Now().Add(clientPatience))
	if _, err := extra.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("connection beyond the source's handshakes: read %v, want EOF", err)
	}
	for _, c := range silent {
		c.Close()
	}
	eventually(t, time.Minute, "handshakes ended", func() bool {
		s.p.tls.mu.Lock()
		defer s.p.tls.mu.Unlock()
		return len(s.p.tls.sources) == 0
	})
	if _, err := s.client(t, nil).Do(mcclient.Request{Opcode: mc.OpVersion}); err != nil {
		t.Fatal(err)
	}
}

// TestTLSShutdown: shutting down with TLS connections open (idle,
// authenticated by certificate, mid-handshake) ends every goroutine of
// the TLS listener and its bridges.
func TestTLSShutdown(t *testing.T) {
	s := startTLSProxy(t, true, "")
	for i := 0; i < 5; i++ {
		c := s.client(t, s.clientCert(t, "bob"))
		if _, err := c.Do(mcclient.Request{Opcode: mc.OpVersion}); err != nil {
			t.Fatal(err)
		}
	}
	half, err := net.Dial("tcp", s.p.TLSAddr()) // never says hello
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	eventually(t, time.Minute, "sessions open", func() bool { return s.p.Connections() == 5 })
	if n := tlsGoroutines(); n == 0 {
		t.Fatal("no TLS goroutines found while serving: the check below would prove nothing")
	}
	s.p.stop(t)
	eventually(t, time.Minute, "TLS goroutines gone", func() bool { return tlsGoroutines() == 0 })
}

// tlsGoroutines counts the goroutines running TLS listener or bridge code.
func tlsGoroutines() int {
	count := 0
	for _, g := range goroutineStacks() {
		if strings.Contains(g, "connbridge.") || strings.Contains(g, "proxy.(*tlsFront)") {
			count++
		}
	}
	return count
}

// TestTLSOpenSSL: openssl s_client, an independent TLS client, gets an
// answer to a text command.
func TestTLSOpenSSL(t *testing.T) {
	openssl, err := exec.LookPath("openssl")
	if err != nil {
		t.Fatal("openssl not installed (make test installs it: scripts/deps.sh)")
	}
	s := startTLSProxy(t, false, "")
	caFile := filepath.Join(s.dir, "ca.pem")
	if err := os.WriteFile(caFile, s.ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, openssl, "s_client", "-connect", s.p.TLSAddr(), "-servername", "localhost",
		"-CAfile", caFile, "-verify_return_error", "-quiet")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if _, err := io.WriteString(in, "version\r\n"); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "VERSION ") {
		t.Fatalf("openssl s_client: %q %v; stderr: %s", line, err, stderr.String())
	}
}

// TestTLSAllowsPlain: a connection through the TLS listener counts as TLS
// for proxy.plain_auth: under "tls-only" SASL PLAIN succeeds over TLS and
// is refused on the plaintext listener (loopback too).
func TestTLSAllowsPlain(t *testing.T) {
	s := startTLSProxy(t, false, `plain_auth = "tls-only"`)
	if err := s.client(t, nil).AuthPlain("bob", "bob-pw"); err != nil {
		t.Fatalf("SASL PLAIN over TLS under tls-only: %v", err)
	}
	plain, err := mcclient.Dial(s.p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	// mcclient asks for the mechanisms first, and PLAIN is not offered.
	if err := plain.AuthPlain("bob", "bob-pw"); err == nil || !strings.Contains(err.Error(), "does not offer SASL PLAIN") {
		t.Fatalf("SASL PLAIN in clear under tls-only: %v, want it refused", err)
	}
}

// TestMemcapableOverTLS runs libmemcached's conformance suites, binary and
// ascii, over TLS: memccapable speaks plain TCP to a tunnel in the test,
// which opens a TLS connection to the proxy's TLS listener for each of its
// connections (crypto/tls as the client). Every test must pass, as over
// proxy.listen.
func TestMemcapableOverTLS(t *testing.T) {
	s := startTLSProxyTail(t, false, "", "[[bucket]]\nname = \"default\"\nflush_enabled = true\n")
	tunnel, handshakes := tlsTunnel(t, s.p.TLSAddr(), &tls.Config{RootCAs: s.ca.Pool(), ServerName: "localhost"})
	runMemccapable(t, tunnel, "-b", 27)
	runMemccapable(t, tunnel, "-a", 17)
	if n := handshakes.Load(); n < 2 {
		t.Fatalf("%d TLS connections, want one per memccapable connection", n)
	}
}

// tlsTunnel listens on a free loopback port and forwards each connection
// it accepts to addr over TLS (conf). It returns the address to connect
// to, and the count of TLS connections it has made; the listener and every
// forwarded connection close when the test ends.
func tlsTunnel(t *testing.T, addr string, conf *tls.Config) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	handshakes := new(atomic.Int64)
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			plain, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer plain.Close()
				d := &net.Dialer{Timeout: time.Minute}
				sec, err := tls.DialWithDialer(d, "tcp", addr, conf)
				if err != nil {
					t.Errorf("tunnel: %v", err)
					return
				}
				defer sec.Close()
				handshakes.Add(1)
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(sec, plain); done <- struct{}{} }()
				go func() { _, _ = io.Copy(plain, sec); done <- struct{}{} }()
				<-done // either side ended: close both, which ends the other copy
				plain.Close()
				sec.Close()
				<-done
			}()
		}
	}()
	return ln.Addr().String(), handshakes
}

// heldConn is a client TCP connection whose writes, once it has read
// anything (the server's first flight), are held until release: the
// client's last handshake flight and what it writes next then arrive in
// one segment.
type heldConn struct {
	net.Conn
	mu   sync.Mutex
	read bool
	held []byte
}

func (h *heldConn) Read(p []byte) (int, error) {
	n, err := h.Conn.Read(p)
	h.mu.Lock()
	h.read = h.read || n > 0
	h.mu.Unlock()
	return n, err
}

func (h *heldConn) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.read {
		h.held = append(h.held, p...)
		return len(p), nil
	}
	return h.Conn.Write(p)
}

func (h *heldConn) release() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.read = false
	_, err := h.Conn.Write(h.held)
	h.held = nil
	return err
}

// TestTLSRequestWithHandshake: a request that arrives with the end of the
// handshake, which the handshake goroutine reads along with it, is
// answered although no more bytes come (the loop decrypts what the
// *tls.Conn holds when it takes the connection). TLS 1.3, where the
// client's Finished is its last word before its requests, with and
// without a client certificate. (In TLS 1.2 the server's Finished comes
// last, so its handshake is over before a request can arrive.)
func TestTLSRequestWithHandshake(t *testing.T) {
	for _, mutual := range []bool{false, true} {
		s := startTLSProxy(t, mutual, "")
		var cert *tls.Certificate
		if mutual {
			cert = s.clientCert(t, "alice")
		}
		for _, ver := range []uint16{tls.VersionTLS13} {
			raw, err := net.DialTimeout("tcp", s.p.TLSAddr(), time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { raw.Close() })
			h := &heldConn{Conn: raw}
			conf := &tls.Config{RootCAs: s.ca.Pool(), ServerName: "localhost", MinVersion: ver, MaxVersion: ver}
			if cert != nil {
				conf.Certificates = []tls.Certificate{*cert}
			}
			tc := tls.Client(h, conf)
			if err := tc.Handshake(); err != nil {
				t.Fatalf("mutual %v, version %x: handshake: %v", mutual, ver, err)
			}
			c := mcclient.New(tc)
			c.Send(mcclient.Request{Opcode: mc.OpVersion})
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := h.release(); err != nil {
				t.Fatal(err)
			}
			_ = raw.SetReadDeadline(time.Now().Add(clientPatience))
			r, err := c.Read()
			if err != nil || r.Opcode != mc.OpVersion || r.Status() != mc.StatusSuccess {
				t.Fatalf("mutual %v, version %x: request sent with the handshake's end: %v %+v", mutual, ver, err, r)
			}
		}
	}
}

// TestTLSBadRecord: a record that does not decrypt gets an alert and the
// connection closes; a client that says close_notify is closed too; the
// proxy goes on serving other TLS clients.
func TestTLSBadRecord(t *testing.T) {
	s := startTLSProxy(t, false, "")
	good := s.client(t, nil)
	for _, ver := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		raw, err := net.DialTimeout("tcp", s.p.TLSAddr(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { raw.Close() })
		tc := tls.Client(raw, &tls.Config{RootCAs: s.ca.Pool(), ServerName: "localhost", MinVersion: ver, MaxVersion: ver})
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		// An application-data record whose ciphertext is garbage.
		rec := append([]byte{23, 3, 3, 0, 64}, bytes.Repeat([]byte{0xA5}, 64)...)
		if _, err := raw.Write(rec); err != nil {
			t.Fatal(err)
		}
		_ = raw.SetReadDeadline(time.Now().Add(clientPatience))
		got, err := io.ReadAll(raw) // an alert record, then the close
		if err != nil {
			t.Fatalf("version %x: after a bad record: %v (want the connection closed)", ver, err)
		}
		// An alert: in TLS 1.3 it is encrypted, in an application-data
		// record of its own.
		if len(got) < 1 || got[0] != 21 && (ver != tls.VersionTLS13 || got[0] != 23 || len(got) > 5+2+1+16) {
			t.Fatalf("version %x: after a bad record got %x, want an alert then EOF", ver, got)
		}
	}
	// close_notify: the proxy closes its side too.
	c, err := s.dialTLS(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(clientPatience))
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("after close_notify: %v (want EOF)", err)
	}
	if r, err := good.Do(mcclient.Request{Opcode: mc.OpVersion}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("another TLS client after the bad ones: %v %+v", err, r)
	}
	eventually(t, time.Minute, "the closed connections to be gone", func() bool { return s.p.Connections() == 1 })
}

// TestTLSCertUserReloadDuringHandshake: a reload that takes a bucket away
// from a certificate's user while the user's handshake is in progress
// (after the certificate was verified) applies to that connection too:
// the session logs in as the user is configured when it opens, not as
// they were when the certificate was checked.
func TestTLSCertUserReloadDuringHandshake(t *testing.T) {
	h := hashes(t)
	tail := func(aliceBuckets string) string {
		return fmt.Sprintf("[[bucket]]\nname = \"alice\"\n[[bucket]]\nname = \"bob\"\n"+
			"[[user]]\nname = \"alice\"\npassword_hash = %q\nbuckets = [%s]\n", h["alice"], aliceBuckets)
	}
	s := startTLSProxyTail(t, true, "default_bucket = \"\"", tail(`"alice", "bob"`))
	verified, proceed := make(chan struct{}), make(chan struct{})
	hook := func() {
		close(verified)
		<-proceed
	}
	testHookTLSVerified.Store(&hook)
	var once sync.Once
	release := func() { once.Do(func() { close(proceed) }) }
	// Registered after startTLSProxy's cleanups, so run before them: a
	// failing test does not leave the handshake waiting, which would keep
	// the proxy from shutting down.
	t.Cleanup(func() {
		testHookTLSVerified.Store(nil)
		release()
	})

	type dialed struct {
		c   *tls.Conn
		err error
	}
	done := make(chan dialed, 1)
	go func() {
		c, err := s.dialTLS(t, s.clientCert(t, "alice"))
		done <- dialed{c, err}
	}()
	select {
	case <-verified:
	case <-time.After(5 * time.Second):
		t.Fatal("the certificate was not verified")
	}
	testHookTLSVerified.Store(nil)
	// alice loses bucket bob while her handshake is in progress.
	s.tc.tail = strings.Replace(s.tc.tail, tail(`"alice", "bob"`), tail(`"alice"`), 1)
	cfg, err := bucketcfg.Parse([]byte(s.tc.render(s.p.Addr, []string{s.p.MC.Addr}, s.p.StatePath)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.p.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	release()
	d := <-done
	if d.err != nil {
		t.Fatalf("handshake: %v", d.err)
	}
	c := mcclient.New(d.c)
	r, err := c.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("bob")})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status() == mc.StatusSuccess {
		t.Fatal("SelectBucket bob succeeded for a user whose access to it a reload removed during the handshake")
	}
	r, err = c.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("alice")})
	if err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("SelectBucket alice: %v %+v", err, r)
	}
}

// TestTLSSilentSourcesDoNotBlockHandshakes: eight sources holding every
// handshake slot with connections that never say hello do not keep a
// ninth source's client waiting: it evicts the oldest of the busiest
// source's handshakes and completes with the engine's (fake) clock
// standing still, not at the silent handshakes' timeout nor after the
// second a slot's taker waits before evicting another.
func TestTLSSilentSourcesDoNotBlockHandshakes(t *testing.T) {
	clock := throttle.NewFakeClock(0)
	s := startTLSProxyWith(t, false, testConfig{tail: tenantTail(t), clock: clock})
	per := tlsMaxHandshakesPerSource
	sources := tlsMaxHandshakes / per
	for i := 0; i < sources; i++ {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+i))}, Timeout: 5 * time.Second}
		for j := 0; j < per; j++ {
			c, err := d.Dial("tcp", s.p.TLSAddr())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
		}
	}
	eventually(t, time.Minute, "every handshake slot to be taken", func() bool { return handshakesInProgress(s.p.Server) == tlsMaxHandshakes })
	c, err := s.dialTLS(t, nil)
	if err != nil {
		t.Fatalf("TLS dial while silent connections hold every slot: %v", err)
	}
	if r, err := mcclient.New(c).Do(mcclient.Request{Opcode: mc.OpVersion}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("VERSION: %v %+v", err, r)
	}
	if now := clock.Now(); now != 0 {
		t.Fatalf("test bug: the clock moved to %v", now)
	}
	if n := s.p.tls.evicted.Load(); n != 1 {
		t.Fatalf("%d handshakes evicted, want 1", n)
	}
}

// TestTLSSCRAM: SASL SCRAM-SHA256 and SCRAM-SHA512 over TLS (a Go TLS
// client with mcclient's SCRAM, which checks the server's signature),
// landing in the user's bucket; a wrong password is refused.
func TestTLSSCRAM(t *testing.T) {
	s := startTLSProxyTail(t, false, "", scramTail(t))
	for _, mech := range []string{mcclient.MechSCRAMSHA256, mcclient.MechSCRAMSHA512} {
		c := s.client(t, nil)
		if err := c.AuthSCRAM(mech, "alice", "alice-pw"); err != nil {
			t.Fatalf("%s over TLS: %v", mech, err)
		}
		if r, err := c.Set([]byte("k"), []byte(mech)); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("SET after %s: %v %+v", mech, err, r)
		}
		// alice's bucket, seen from the plaintext listener as alice.
		p := dial(t, s.p.Addr)
		if err := p.AuthPlain("alice", "alice-pw"); err != nil {
			t.Fatal(err)
		}
		if r, err := p.Get([]byte("k")); err != nil || string(r.Value) != mech {
			t.Fatalf("GET in alice's bucket: %v %+v", err, r)
		}
		if err := s.client(t, nil).AuthSCRAM(mech, "alice", "wrong"); err == nil {
			t.Fatalf("%s with a wrong password over TLS succeeded", mech)
		}
	}
}

// TestTLSEvictOne: making room never ends the handshake that needs the
// room, whatever the map order (every source at one handshake is the
// case where it could), and ends a silent handshake (no hello yet) of the
// busiest source before one whose client has spoken.
func TestTLSEvictOne(t *testing.T) {
	s := startTLSProxy(t, false, "")
	f := s.p.tls
	entry := func(src string, hello bool) *hsEntry {
		e := &hsEntry{src: src}
		e.ctx, e.cancel = context.WithCancel(context.Background())
		e.hello.Store(hello)
		return e
	}
	for round := 0; round < 300; round++ {
		self := entry("new", false)
		f.mu.Lock()
		f.active = map[string][]*hsEntry{"new": {self}}
		others := make([]*hsEntry, 0, 64)
		for i := 0; i < 64; i++ {
			e := entry(fmt.Sprintf("s%d", i), false)
			others = append(others, e)
			f.active[e.src] = []*hsEntry{e}
		}
		f.mu.Unlock()
		if !f.evictOne(self) {
			t.Fatal("nothing evicted")
		}
		if self.ctx.Err() != nil {
			t.Fatalf("round %d: the new handshake evicted itself", round)
		}
		n := 0
		for _, e := range others {
			if e.ctx.Err() != nil {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("round %d: %d handshakes ended, want 1", round, n)
		}
	}
	self := entry("new", false)
	spoke, silent := entry("busy", true), entry("busy", false)
	f.mu.Lock()
	f.active = map[string][]*hsEntry{"new": {self}, "busy": {spoke, silent}, "other": {entry("other", false)}}
	f.mu.Unlock()
	f.evictOne(self)
	if silent.ctx.Err() == nil || spoke.ctx.Err() != nil {
		t.Fatal("evicted a handshake whose client had spoken before a silent one of the same source")
	}
	f.mu.Lock()
	f.active = map[string][]*hsEntry{}
	f.mu.Unlock()
}

// TestTLSHandshakeOffLoop: a handshake whose computing takes long (held
// here in its hello callback) does not hold up the event loop: a client
// of the only loop gets its answers while the handshake is still held.
// (Run on a loop, the handshake would stall every connection of that loop
// until it ended, and the SETs would be answered only after the hook let
// it go.)
func TestTLSHandshakeOffLoop(t *testing.T) {
	s := startTLSProxyWith(t, false, testConfig{loops: 1, tail: "[[bucket]]\nname = \"default\"\n"})
	tenant := dial(t, s.p.Addr)
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var left atomic.Bool // the hook has let the handshake go
	hook := func() {
		once.Do(func() { close(entered) })
		select {
		case <-proceed:
		case <-time.After(10 * time.Second):
		}
		left.Store(true)
	}
	testHookTLSHello.Store(&hook)
	var released sync.Once
	release := func() { released.Do(func() { close(proceed) }) }
	t.Cleanup(func() {
		testHookTLSHello.Store(nil)
		release()
	})
	dialed := make(chan error, 1)
	go func() {
		_, err := s.dialTLS(t, nil)
		dialed <- err
	}()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the handshake did not start")
	}
	for i := 0; i < 50; i++ {
		if r, err := tenant.Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("SET while a handshake computes: %v %+v", err, r)
		}
	}
	if left.Load() {
		t.Fatal("the 50 SETs were answered only once the held handshake was let go")
	}
	testHookTLSHello.Store(nil)
	release()
	if err := <-dialed; err != nil {
		t.Fatalf("the held handshake: %v", err)
	}
}
