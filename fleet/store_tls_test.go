package fleet

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// TestStoreTLS: a store at rediss:// against a real redis-server's TLS
// port whose certificate the test's own CA issued, and which wants a
// client certificate (Redis's default, tls-auth-clients yes). The server's
// certificate is verified by default: with the system's roots, or a CA
// file of another CA, every call fails, saying the certificate is not
// signed by a CA of tls_ca_file; with the right CA but no client
// certificate, saying the store wants one; with both, the store works.
func TestStoreTLS(t *testing.T) {
	ca, clientCA, other := testmc.TestCA(t), testcerts.NewCA(t, "redis clients"), testcerts.NewCA(t, "another CA")
	r := testmc.StartRedisTLS(t, testmc.RedisTLSOptions{CA: ca, ClientCA: clientCA})
	dir := t.TempDir()
	certFile, keyFile := clientCA.Issue(t, testcerts.Leaf{CN: "kvthrottle", Client: true}).Write(t, dir, "client")
	otherCA := filepath.Join(dir, "other-ca.pem")
	certs := "&tls_cert_file=" + certFile + "&tls_key_file=" + keyFile

	// Each load is bounded for liveness only: 20 s to dial and load (the
	// defaults, a period's fraction, timed out beside a CPU hog before
	// the TLS error could come).
	load := func(url string) error {
		t.Helper()
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		st, err := OpenStore(url+sep+"dial_timeout=20s", "tls")
		if err != nil {
			t.Fatalf("OpenStore(%s): %v", url, err)
		}
		defer st.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, _, _, err = st.Load(ctx)
		return err
	}
	writeFile(t, otherCA, other.PEM)
	for _, c := range []struct{ what, url, want string }{
		{"the system's roots", r.TLSURL() + "?" + certs[1:], "x509: certificate signed by unknown authority (the store's certificate is not signed by a CA of redis_url's tls_ca_file"},
		{"another CA", r.TLSURL() + "?tls_ca_file=" + otherCA + certs, "x509: certificate signed by unknown authority (the store's certificate is not signed by a CA of redis_url's tls_ca_file"},
		{"no client certificate", r.TLSURL() + "?tls_ca_file=" + r.CAFile, "(the store wants a client certificate: redis_url's tls_cert_file and tls_key_file)"},
		{"plaintext to the TLS port", "redis://" + r.TLSAddr + "/0", "fleet: load state:"},
	} {
		err := load(c.url)
		for try := 0; try < 3 && err != nil && errors.Is(err, syscall.ECONNRESET); try++ {
			// Without a client certificate, TLS 1.3 completes the
			// handshake and the server's alert follows; a loaded machine
			// may have the server close before the command is written,
			// and the write's reset carries no alert to explain (a gap
			// of the hint, noted in issue 29): ask again.
			t.Logf("%s: %v; again", c.what, err)
			err = load(c.url)
		}
		t.Logf("%s: %v", c.what, err)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Load: %v, want an error with %q", c.what, err, c.want)
		}
		if err != nil && strings.Count(err.Error(), "(the store") > 1 {
			t.Errorf("%s: Load: %v, says what to check more than once", c.what, err)
		}
	}
	if err := load(r.TLSURL() + "?tls_ca_file=" + r.CAFile + certs); err != nil {
		t.Fatalf("the right CA and a client certificate: Load: %v", err)
	}
	st, err := OpenStore(r.TLSURL()+"?tls_ca_file="+r.CAFile+certs+"&dial_timeout=30s", "tls")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := ctx5(t)
	if _, seeded, err := st.Seed(ctx, []byte(`{"version":1}`)); err != nil || !seeded {
		t.Fatalf("Seed over TLS: seeded %v, %v", seeded, err)
	}
	// The document is in the server (read over its plaintext port).
	if out, err := testmc.Cli(r.Addr, "hget", "{kvthrottle:tls}:config", "state"); err != nil || out != `{"version":1}` {
		t.Fatalf("the seeded document in the server: %q %v", out, err)
	}
}

// TestStoreTLSParams: tls_ca_file, tls_cert_file and tls_key_file are
// refused with redis:// (they would be ignored: no TLS), as relative
// paths, one of the client pair without the other, and files that hold
// no certificate; the errors name the parameter.
func TestStoreTLSParams(t *testing.T) {
	dir := t.TempDir()
	notPEM := filepath.Join(dir, "empty.pem")
	writeFile(t, notPEM, []byte("not a certificate\n"))
	for url, want := range map[string]string{
		"redis://127.0.0.1:6379/0?tls_ca_file=/etc/ca.pem":                     "need rediss://",
		"rediss://127.0.0.1:6379/0?tls_ca_file=ca.pem":                         `tls_ca_file "ca.pem" is not an absolute path`,
		"rediss://127.0.0.1:6379/0?tls_cert_file=/etc/c.pem":                   "tls_cert_file and tls_key_file go together",
		"rediss://127.0.0.1:6379/0?tls_ca_file=" + notPEM:                      "tls_ca_file: " + notPEM + ": no PEM certificate in it",
		"rediss://127.0.0.1:6379/0?tls_ca_file=" + dir + "/missing.pem":        "tls_ca_file: open " + dir + "/missing.pem",
		"rediss://127.0.0.1:6379?addr=127.0.0.1:6380&tls_ca_file=" + notPEM:    "no PEM certificate in it",
		"rediss://127.0.0.1:6379?master_name=m&tls_key_file=/k&tls_cert_file=": "tls_cert_file and tls_key_file go together",
	} {
		st, err := OpenStore(url, "tls")
		if err == nil {
			st.Close()
			t.Errorf("OpenStore(%s) accepted", url)
			continue
		}
		if !strings.Contains(err.Error(), want) {
			t.Errorf("OpenStore(%s): %v, want %q", url, err, want)
		}
	}
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// redis_url's dial_timeout bounds the connection to the store (the test
// above asks for 20 s beside a CPU hog); without it, defaultDialTimeout.
func TestStoreDialTimeout(t *testing.T) {
	for _, c := range []struct {
		url  string
		want time.Duration
	}{
		{"redis://127.0.0.1:1/0", defaultDialTimeout},
		{"redis://127.0.0.1:1/0?dial_timeout=20s", 20 * time.Second},
		{"redis://127.0.0.1:1?addr=127.0.0.1:2&dial_timeout=20s", 20 * time.Second},
	} {
		st, err := OpenStore(c.url, "t")
		if err != nil {
			t.Fatalf("OpenStore(%s): %v", c.url, err)
		}
		var got time.Duration
		switch rdb := st.rdb.(type) {
		case *redis.Client:
			got = rdb.Options().DialTimeout
		case *redis.ClusterClient:
			got = rdb.Options().DialTimeout
		}
		st.Close()
		if got != c.want {
			t.Errorf("%s: dial timeout %v, want %v", c.url, got, c.want)
		}
	}
}
