package proxy

import (
	"bufio"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// Outside review of the too-large refusal (issue 28, rule 4): findings
// written as tests that fail while the finding stands.

// TestTooLargeMixedItemSizes: two memcached servers behind the proxy, one
// of 1 KiB items and one of the default 1 MiB. A 2000-byte set of a key
// whose server is the 1 MiB one is stored by that server when sent to it
// directly, so memcached would not refuse it; through the proxy it must be
// stored too, and its old value must not be unlinked. (The proxy refuses
// every write over the smallest limit of all servers, whatever server the
// key lives on: a heterogeneous pool, or a rolling restart that changes
// -I, loses writes the key's own server accepts, and the SET unlinks the
// value there.)
func TestTooLargeMixedItemSizes(t *testing.T) {
	t.Parallel()
	p, _, big := startMixedItems(t, "")
	via := dialText(t, p.Addr)
	key := keyOnServer(t, via, big, "mixed") // a key that lives on the 1 MiB server
	v := strings.Repeat("y", 2000)
	got := textDo(t, via, fmt.Sprintf("set %s 0 0 2000\r\n%s\r\nget %s\r\n", key, v, key), "END\r\n")
	want := fmt.Sprintf("STORED\r\nVALUE %s 0 2000\r\n%s\r\nEND\r\n", key, v)
	if got != want {
		t.Errorf("2000-byte set of %s (on the 1 MiB server) through the proxy:\n%.120q\nwant what its server answers:\n%.120q", key, got, want)
	}
}

// TestTooLargeOverTLS: a TLS client of a bucket hard-limited to 500
// units/s sets a key, then writes 300 KB under it (too large for 1 KiB
// items) and reads it back in the same write: it gets memcached's
// refusal, the key is gone, and the commands after the value are answered
// in step (the value is dropped paced from the TLS session's buffer).
func TestTooLargeOverTLS(t *testing.T) {
	t.Parallel()
	s := &tlsSetup{ca: testcerts.NewCA(t, "kvthrottle test CA"), dir: t.TempDir()}
	s.certFile, s.keyFile = s.ca.Server(t).Write(t, s.dir, "server")
	tc := testConfig{throttle: `capacity = "unlimited"`, tail: "[[bucket]]\nname = \"default\"\nhard_limit = 500\n" +
		fmt.Sprintf("\n[tls]\nlisten = %q\ncert_file = %q\nkey_file = %q\n", testmc.FreeAddr(t), s.certFile, s.keyFile)}
	s.p = startProxyTo(t, testmc.Start(t, smallItems...), tc)
	eventually(t, 5*time.Second, "memcached's item size known", func() bool { return s.p.pool.ItemSizeMax() == 1024 })
	c, err := s.dialTLS(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	tc2 := &textConn{c: c, r: bufio.NewReader(c)}
	for _, size := range []int{2000, 300 << 10} {
		in := fmt.Sprintf("set tk 0 0 3\r\nold\r\nset tk 0 0 %d\r\n%s\r\nget tk\r\nmn\r\n", size, strings.Repeat("z", size))
		go func() { _, _ = io.WriteString(c, in) }()
		var out strings.Builder
		for !strings.HasSuffix(out.String(), "MN\r\n") {
			l, err := tc2.r.ReadString('\n')
			out.WriteString(l)
			if err != nil {
				t.Fatalf("%d bytes over TLS: %v after %q", size, err, out.String())
			}
		}
		if want := "STORED\r\nSERVER_ERROR object too large for cache\r\nEND\r\nMN\r\n"; out.String() != want {
			t.Errorf("%d bytes over TLS: %q, want %q", size, out.String(), want)
		}
	}
}
