package proxy

// Test helpers for the TLS listener: a proxy with certificates to talk to
// it (tlsSetup, startTLSProxy*), and what TLS tests look at (handshakes
// in progress, connections closed, a log written from several goroutines).

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// tlsSetup is a proxy with a TLS listener, and the certificates to talk
// to it.
type tlsSetup struct {
	p        *testProxy
	tc       testConfig
	ca       *testcerts.CA // signs the server's and the clients' certificates
	dir      string
	certFile string // the server's, rewritten by rotation tests
	keyFile  string
}

// clientCert issues a client certificate with common name cn.
func (s *tlsSetup) clientCert(t *testing.T, cn string) *tls.Certificate {
	c := s.ca.Issue(t, testcerts.Leaf{CN: cn, Client: true}).TLS(t)
	return &c
}

// dialTLS connects over TLS (presenting cert when not nil) and completes
// the handshake.
func (s *tlsSetup) dialTLS(t testing.TB, cert *tls.Certificate) (*tls.Conn, error) {
	t.Helper()
	conf := &tls.Config{RootCAs: s.ca.Pool(), ServerName: "localhost"}
	if cert != nil {
		conf.Certificates = []tls.Certificate{*cert}
	}
	d := &net.Dialer{Timeout: time.Minute} // liveness: the handshake included
	c, err := tls.DialWithDialer(d, "tcp", s.p.TLSAddr(), conf)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c, nil
}

// client is a binary client of s's TLS listener (presenting cert when not
// nil).
func (s *tlsSetup) client(t *testing.T, cert *tls.Certificate) *mcclient.Client {
	t.Helper()
	c, err := s.dialTLS(t, cert)
	if err != nil {
		t.Fatalf("TLS dial: %v", err)
	}
	return mcclient.New(c)
}

// goroutineStacks returns the stack of every goroutine, one per element.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// handshakesInProgress counts the TLS handshakes srv is running.
func handshakesInProgress(srv *Server) int {
	srv.tls.mu.Lock()
	defer srv.tls.mu.Unlock()
	n := 0
	for _, k := range srv.tls.sources {
		n += k
	}
	return n
}

// startTLSProxy starts a proxy with tenantTail's users and a [tls] table;
// mutual requires client certificates signed by the test CA. proxy holds
// lines for [proxy].
func startTLSProxy(t testing.TB, mutual bool, proxy string) *tlsSetup {
	t.Helper()
	return startTLSProxyTail(t, mutual, proxy, tenantTail(t))
}

// startTLSProxyTail is startTLSProxy with tail's buckets and users.
func startTLSProxyTail(t testing.TB, mutual bool, proxy, tail string) *tlsSetup {
	t.Helper()
	return startTLSProxyWith(t, mutual, testConfig{proxy: proxy, tail: tail})
}

// startTLSProxyWith is startTLSProxy with tc, to which it adds the [tls]
// table, with tlsLines in it.
func startTLSProxyWith(t testing.TB, mutual bool, tc testConfig, tlsLines ...string) *tlsSetup {
	t.Helper()
	s := &tlsSetup{ca: testcerts.NewCA(t, "kvthrottle test CA"), dir: t.TempDir()}
	s.certFile, s.keyFile = s.ca.Server(t).Write(t, s.dir, "server")
	tlsTable := fmt.Sprintf("\n[tls]\nlisten = %q\ncert_file = %q\nkey_file = %q\n", testmc.FreeAddr(t), s.certFile, s.keyFile)
	if mutual {
		caFile := filepath.Join(s.dir, "clients-ca.pem")
		if err := os.WriteFile(caFile, s.ca.PEM, 0o600); err != nil {
			t.Fatal(err)
		}
		tlsTable += fmt.Sprintf("client_ca_file = %q\n", caFile)
	}
	for _, l := range tlsLines {
		tlsTable += l + "\n"
	}
	tc.tail += tlsTable
	s.tc = tc
	s.p = startProxy(t, s.tc)
	if s.p.TLSAddr() == "" {
		t.Fatal("no TLS listener")
	}
	return s
}

// startTLSProxyClock is startTLSProxy (no client certificates) on a fake
// engine clock reading 0.
func startTLSProxyClock(t *testing.T) (*tlsSetup, *throttle.FakeClock) {
	t.Helper()
	clock := throttle.NewFakeClock(0)
	return startTLSProxyWith(t, false, testConfig{tail: tenantTail(t), clock: clock}), clock
}

// lockedBuffer is a log sink safe for the proxy's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// waitClosed waits up to d for the proxy to close conn (EOF or reset),
// discarding anything it sends first.
func waitClosed(t testing.TB, conn net.Conn, d time.Duration) {
	t.Helper()
	if err := closedWithin(conn, d); err != nil {
		t.Fatal(err)
	}
}
