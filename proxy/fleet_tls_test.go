package proxy

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// TestFleetOverTLS: a fleet whose redis_url is rediss:// with the test's
// own CA (tls_ca_file) and a client certificate (the server wants one),
// against a real redis-server's TLS port: both instances reach the store
// (STAT fleet:store_up true) and an admin change made through one is in
// force on the other a period later. A third instance whose tls_ca_file
// names another CA refuses the server's certificate: its store is down.
// On fake clocks.
func TestFleetOverTLS(t *testing.T) {
	t.Parallel()
	clientCA, other := testcerts.NewCA(t, "redis clients"), testcerts.NewCA(t, "another CA")
	r := testmc.StartRedisTLS(t, testmc.RedisTLSOptions{ClientCA: clientCA})
	dir := t.TempDir()
	certFile, keyFile := clientCA.Issue(t, testcerts.Leaf{CN: "kvthrottle", Client: true}).Write(t, dir, "client")
	otherCA := filepath.Join(dir, "other-ca.pem")
	writeTestFile(t, otherCA, other.PEM)
	certs := "&tls_cert_file=" + certFile + "&tls_key_file=" + keyFile

	f := &fleetTest{t: t, mc: testmc.Start(t), url: r.TLSURL() + "?tls_ca_file=" + r.CAFile + certs,
		period: "500ms", tail: "[[bucket]]\nname = \"b\"\nhard_limit = 3000\n" + fleetUsers(t)}
	f.fakeTime()
	for i := range 2 {
		f.start(i, `default_bucket = "b"`)
	}
	f.url = r.TLSURL() + "?tls_ca_file=" + otherCA + certs
	f.start(2, `default_bucket = "b"`)
	f.pass(500 * time.Millisecond)
	for i, p := range f.insts {
		if fs := fleetStats(t, p); fs == nil || fs.StoreUp != (i < 2) {
			t.Errorf("instance %d: fleet stats %+v, want store_up %v", i, fs, i < 2)
		}
	}
	fleetAdmin(t, f.insts[1], mc.OpSetBucketThrottleProperties, "b", `{"reserved": 0, "hard_limit": 1200}`)
	f.pass(500 * time.Millisecond)
	if got := statHardLimit(t, f.insts[0], "b"); got != "1200" {
		t.Errorf("instance 0: hard_limit %s a period after the change made through instance 1, want 1200", got)
	}
}

func writeTestFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
