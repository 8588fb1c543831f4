package testmc

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
)

// UpstreamTLSEnv is the environment variable that runs the tests with TLS
// between the proxy and memcached: set to "1", Start starts every
// memcached with TLS as StartTLS does (TLSOptions{}), and the proxy tests'
// harness sends its traffic to the TLS port (Server.TLSAddr), verified
// against the test CA (Server.CAFile). Clients of Server.Addr are not
// affected: it stays plaintext.
const UpstreamTLSEnv = "KVTHROTTLE_TEST_UPSTREAM_TLS"

// UpstreamTLS reports whether UpstreamTLSEnv is "1".
func UpstreamTLS() bool { return os.Getenv(UpstreamTLSEnv) == "1" }

// TLSOptions configure a memcached started with TLS (StartTLS).
type TLSOptions struct {
	// CA signs the server's certificate (and is written to
	// Server.CAFile); nil: the process's test CA (TestCA).
	CA *testcerts.CA
	// Cert, when not nil, is the server's certificate instead of the one
	// CA issues for 127.0.0.1 and localhost.
	Cert *testcerts.Issued
	// ClientCA, when not nil, makes memcached require a client
	// certificate signed by it (ssl_ca_cert, ssl_verify_mode=2:
	// "Require", the handshake fails without one).
	ClientCA *testcerts.CA
}

var testCA struct {
	once sync.Once
	ca   *testcerts.CA
}

// TestCA returns the CA the process's TLS memcached servers are issued
// their certificates by unless told otherwise (made at the first call).
func TestCA(t testing.TB) *testcerts.CA {
	t.Helper()
	testCA.once.Do(func() { testCA.ca = testcerts.NewCA(t, "kvthrottle test memcached CA") })
	if testCA.ca == nil {
		t.Fatal("testmc: no test CA (making it failed earlier)")
	}
	return testCA.ca
}

// StartTLS runs memcached with TLS (-Z) as Start does, listening on two
// loopback ports: Server.TLSAddr speaks TLS, with a certificate for
// 127.0.0.1 (see TLSOptions), and Server.Addr plaintext (memcached's
// "notls:" listener) for tests that talk to the server directly. The
// certificate files live in the test's temporary directory.
func StartTLS(t testing.TB, o TLSOptions, extraArgs ...string) *Server {
	t.Helper()
	ca := o.CA
	if ca == nil {
		ca = TestCA(t)
	}
	cert := o.Cert
	if cert == nil {
		c := ca.Server(t)
		cert = &c
	}
	// memcached's -o splits its options at commas, so the files' paths
	// must have none: t.TempDir() is named after the test, whose name may.
	dir, err := os.MkdirTemp("", "testmc-tls")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	certFile, keyFile := cert.Write(t, dir, "memcached")
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	opts := []string{"ssl_chain_cert=" + certFile, "ssl_key=" + keyFile}
	if o.ClientCA != nil {
		clientCAFile := filepath.Join(dir, "client-ca.pem")
		if err := os.WriteFile(clientCAFile, o.ClientCA.PEM, 0o600); err != nil {
			t.Fatal(err)
		}
		opts = append(opts, "ssl_ca_cert="+clientCAFile, "ssl_verify_mode=2")
	}
	s := &Server{Addr: FreeAddr(t), TLSAddr: FreeAddr(t), CAFile: caFile,
		args: append([]string{"-Z", "-o", strings.Join(opts, ",")}, extraArgs...)}
	startOrFail(t, s)
	tlsServers.Store(s.Addr, s)
	t.Cleanup(func() { tlsServers.Delete(s.Addr) })
	return s
}

// tlsServers maps the plaintext address of each running TLS server to it.
var tlsServers sync.Map

// TLSPeer returns the TLS address and CA file of the running TLS server
// (StartTLS) whose plaintext address is addr; ok is false when there is
// none. A harness that names servers by Addr uses it to point a proxy at
// their TLS ports instead.
func TLSPeer(addr string) (tlsAddr, caFile string, ok bool) {
	v, ok := tlsServers.Load(addr)
	if !ok {
		return "", "", false
	}
	s := v.(*Server)
	return s.TLSAddr, s.CAFile, true
}

// listenArgs are memcached's listener flags for s: one plaintext port,
// or with TLSAddr a plaintext and a TLS one.
func (s *Server) listenArgs() []string {
	_, port, _ := net.SplitHostPort(s.Addr)
	if s.TLSAddr == "" {
		return []string{"-l", "127.0.0.1", "-p", port}
	}
	return []string{"-l", "notls:" + s.Addr, "-l", s.TLSAddr}
}
