package testmc

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
)

// RedisTLSOptions configure a redis-server started with TLS
// (StartRedisTLS).
type RedisTLSOptions struct {
	// CA issues the server's certificate, for 127.0.0.1 and localhost;
	// nil: the process's test CA (TestCA).
	CA *testcerts.CA
	// ClientCA, when not nil, makes the server require a client
	// certificate signed by it (tls-auth-clients yes, Redis's default);
	// otherwise it asks for none (tls-auth-clients no).
	ClientCA *testcerts.CA
}

// StartRedisTLS runs redis-server as StartRedis does, with a TLS port
// besides its plaintext one (Redis.TLSAddr, Redis.TLSURL): its certificate
// is issued by o.CA, whose certificate is written to Redis.CAFile. The
// plaintext port (Redis.Addr) stays for the test's own checks. The test
// fails if redis-server was built without TLS.
func StartRedisTLS(t testing.TB, o RedisTLSOptions) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found in PATH (make test installs it: Debian package redis-server): %v", err)
	}
	ca := o.CA
	if ca == nil {
		ca = TestCA(t)
	}
	r := &Redis{Addr: FreeAddr(t), TLSAddr: FreeAddr(t), dir: t.TempDir()}
	certFile, keyFile := ca.Server(t).Write(t, r.dir, "redis")
	r.CAFile = filepath.Join(r.dir, "ca.pem")
	if err := os.WriteFile(r.CAFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	clientCAFile, auth := r.CAFile, "no"
	if o.ClientCA != nil {
		clientCAFile, auth = filepath.Join(r.dir, "client-ca.pem"), "yes"
		if err := os.WriteFile(clientCAFile, o.ClientCA.PEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, port := splitAddr(r.TLSAddr)
	r.args = []string{"--tls-port", port, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", clientCAFile, "--tls-auth-clients", auth}
	t.Cleanup(r.Stop)
	r.start(t)
	if err := WaitListening(r.TLSAddr, time.Minute); err != nil { // liveness
		t.Fatalf("redis-server's TLS port %s: %v (output: %s)", r.TLSAddr, err, r.Output())
	}
	return r
}

// TLSURL returns the server's TLS address as a go-redis URL for database
// 0: "rediss://127.0.0.1:PORT/0" (StartRedisTLS only).
func (r *Redis) TLSURL() string { return "rediss://" + r.TLSAddr + "/0" }
