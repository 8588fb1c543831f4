package proxy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// upstreamTLSLines is the [upstream.tls] of a proxy verifying m by caFile.
func upstreamTLSLines(caFile string, extra ...string) string {
	return fmt.Sprintf("enabled = true\nca_file = %q\n%s", caFile, strings.Join(extra, "\n"))
}

// Binary and text traffic through the proxy to a memcached that speaks
// only TLS on the port the proxy is given (memcached -Z): a 1 MB value
// both ways, a pipeline of quiet gets, meta commands (their own upstream
// connection, the text sibling, over TLS too), STAT, and the VERSION the
// health probe read over TLS.
func TestUpstreamTLSTraffic(t *testing.T) {
	t.Parallel()
	m := testmc.StartTLS(t, testmc.TLSOptions{})
	p := startProxyTo(t, m, testConfig{throttle: `capacity = "unlimited"`, upstreamTLS: upstreamTLSLines(m.CAFile)})
	c := dial(t, p.Addr)

	big := bytes.Repeat([]byte("0123456789abcdef"), 1000*1000/16)
	if r, err := c.Set([]byte("big"), big); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set 1 MB: %v %+v", err, r)
	}
	if r, err := c.Get([]byte("big")); err != nil || r.Status() != mc.StatusSuccess || !bytes.Equal(r.Value, big) {
		t.Fatalf("get 1 MB: %v, status %v, %d bytes equal %v", err, r.Status(), len(r.Value), r != nil && bytes.Equal(r.Value, big))
	}

	const n = 200
	for i := 0; i < n; i += 2 { // every other key present
		if r, err := c.Set([]byte(fmt.Sprintf("q%d", i)), []byte(fmt.Sprintf("v%d", i))); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("set q%d: %v %+v", i, err, r)
		}
	}
	want := map[uint32]string{}
	for i := 0; i < n; i++ {
		o := c.Send(mcclient.Request{Opcode: mc.OpGetQ, Key: []byte(fmt.Sprintf("q%d", i))})
		if i%2 == 0 {
			want[o] = fmt.Sprintf("v%d", i)
		}
	}
	noop := c.Send(mcclient.Request{Opcode: mc.OpNoop})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := c.Read()
		if err != nil {
			t.Fatalf("pipelined quiet gets: %v", err)
		}
		if r.Opaque == noop {
			break
		}
		if w, ok := want[r.Opaque]; !ok || string(r.Value) != w {
			t.Fatalf("quiet get opaque %d: %q, want %q (present %v)", r.Opaque, r.Value, w, ok)
		}
		delete(want, r.Opaque)
	}
	if len(want) != 0 {
		t.Fatalf("%d quiet gets of present keys unanswered", len(want))
	}

	stats, err := c.Stats("")
	if err != nil || len(stats) == 0 {
		t.Fatalf("STAT: %v, %d stats", err, len(stats))
	}
	r, err := c.Do(mcclient.Request{Opcode: mc.OpVersion})
	if err != nil || r.Status() != mc.StatusSuccess || !strings.HasPrefix(string(r.Value), "1.") {
		t.Fatalf("VERSION (read by the TLS health probe): %v %+v", err, r)
	}

	tc := dialText(t, p.Addr)
	if got := textDo(t, tc, "ms mkey 5 T0\r\nhello\r\nmg mkey v\r\nmg q2 v\r\nmn\r\n", "MN\r\n"); got != "HD\r\nVA 5\r\nhello\r\nVA 2\r\nv2\r\nMN\r\n" {
		t.Fatalf("meta over upstream TLS: %q", got)
	}
	if got := textDo(t, tc, "get big\r\n", "END\r\n"); !strings.HasPrefix(got, "VALUE big 0 1000000\r\n") || len(got) != len("VALUE big 0 1000000\r\n")+1000000+len("\r\nEND\r\n") {
		t.Fatalf("text get of the 1 MB value: %d bytes, starting %.40q", len(got), got)
	}
}

// A server whose certificate does not verify is down: clients get the
// upstream-unavailable error, and the log says why (the handshake, and
// what failed in it). Wrong CA, and a server name the certificate does
// not carry; the right server_name works.
func TestUpstreamTLSVerificationFailure(t *testing.T) {
	t.Parallel()
	m := testmc.StartTLS(t, testmc.TLSOptions{})
	otherCA := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(otherCA, testcerts.NewCA(t, "some other CA").PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, lines, why string }{
		{"wrong CA", upstreamTLSLines(otherCA), "certificate signed by unknown authority"},
		{"wrong server name", upstreamTLSLines(m.CAFile, `server_name = "memcached.example"`), "not memcached.example"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var log lockedBuffer
			p := startProxyTo(t, m, testConfig{upstreamTLS: c.lines, log: &log})
			cl := dial(t, p.Addr)
			r, err := cl.Get([]byte("k"))
			if err != nil || r.Status() != mc.StatusEtmpfail || !strings.Contains(string(r.Value), "upstream unavailable") {
				t.Fatalf("get: %v %+v, want Etmpfail \"upstream unavailable\"", err, r)
			}
			eventually(t, 30*time.Second, "the log to say the handshake failed and why", func() bool {
				s := log.String()
				return strings.Contains(s, "tls handshake") && strings.Contains(s, c.why) && strings.Contains(s, m.TLSAddr)
			})
		})
	}
	t.Run("right server name", func(t *testing.T) {
		p := startProxyTo(t, m, testConfig{upstreamTLS: upstreamTLSLines(m.CAFile, `server_name = "localhost"`)})
		if r, err := dial(t, p.Addr).Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("set: %v %+v", err, r)
		}
	})
}

// A memcached that requires a client certificate (ssl_verify_mode=2):
// the proxy with cert_file and key_file gets through, without them it is
// refused at the handshake.
func TestUpstreamTLSClientCertificate(t *testing.T) {
	t.Parallel()
	clientCA := testcerts.NewCA(t, "memcached client CA")
	m := testmc.StartTLS(t, testmc.TLSOptions{ClientCA: clientCA})
	certFile, keyFile := clientCA.Issue(t, testcerts.Leaf{CN: "kvthrottle", Client: true}).Write(t, t.TempDir(), "client")

	p := startProxyTo(t, m, testConfig{upstreamTLS: upstreamTLSLines(m.CAFile, fmt.Sprintf("cert_file = %q\nkey_file = %q", certFile, keyFile))})
	c := dial(t, p.Addr)
	if r, err := c.Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set with a client certificate: %v %+v", err, r)
	}
	if r, err := c.Get([]byte("k")); err != nil || string(r.Value) != "v" {
		t.Fatalf("get with a client certificate: %v %+v", err, r)
	}
	// The meta sibling's dial checks its acceptance with an mn.
	if got := textDo(t, dialText(t, p.Addr), "mg k v\r\nmn\r\n", "MN\r\n"); got != "VA 1\r\nv\r\nMN\r\n" {
		t.Fatalf("meta with a client certificate: %q", got)
	}

	var log lockedBuffer
	p = startProxyTo(t, m, testConfig{upstreamTLS: upstreamTLSLines(m.CAFile), log: &log})
	if r, err := dial(t, p.Addr).Get([]byte("k")); err != nil || r.Status() != mc.StatusEtmpfail {
		t.Fatalf("get without a client certificate: %v %+v, want Etmpfail", err, r)
	}
	// memcached refuses the missing certificate after TLS 1.3's
	// handshake has completed on the client's side: the dial's round
	// trip reads its alert, reported as the handshake's failure.
	defer func() {
		if t.Failed() {
			t.Log(log.String())
		}
	}()
	eventually(t, 30*time.Second, "the log to report the refused handshake", func() bool {
		s := log.String()
		return strings.Contains(s, "tls handshake: server refused the connection") && strings.Contains(s, "certificate required")
	})
	if strings.Contains(log.String(), "PRIVATE KEY") {
		t.Fatal("key material in the log")
	}
}

// memcached killed and restarted under TLS: the proxy reconnects (new
// handshakes) and traffic resumes.
func TestUpstreamTLSReconnect(t *testing.T) {
	t.Parallel()
	m := testmc.StartTLS(t, testmc.TLSOptions{})
	p := startProxyTo(t, m, testConfig{upstreamTLS: upstreamTLSLines(m.CAFile)})
	c := dial(t, p.Addr)
	if r, err := c.Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set: %v %+v", err, r)
	}
	m.Stop()
	if r, err := c.Get([]byte("k")); err != nil || r.Status() != mc.StatusEtmpfail {
		t.Fatalf("get while memcached is down: %v %+v, want Etmpfail", err, r)
	}
	m.Restart(t)
	eventually(t, 30*time.Second, "a set through a new TLS connection", func() bool {
		r, err := c.Set([]byte("k"), []byte("again"))
		return err == nil && r.Status() == mc.StatusSuccess
	})
	if r, err := c.Get([]byte("k")); err != nil || string(r.Value) != "again" {
		t.Fatalf("get after the restart: %v %+v", err, r)
	}
}

// A reload reads [upstream.tls]'s files again for the connections opened
// after it (here: the CA file now holds the server's CA, so the
// connections that failed to verify succeed); turning TLS off is refused.
func TestUpstreamTLSReload(t *testing.T) {
	t.Parallel()
	m := testmc.StartTLS(t, testmc.TLSOptions{})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, testcerts.NewCA(t, "not the server's").PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	tc := testConfig{upstreamTLS: upstreamTLSLines(caFile)}
	p := startProxyTo(t, m, tc)
	c := dial(t, p.Addr)
	if r, err := c.Get([]byte("k")); err != nil || r.Status() != mc.StatusEtmpfail {
		t.Fatalf("get with the wrong CA: %v %+v, want Etmpfail", err, r)
	}
	reload := func(tc testConfig) error {
		cfg, err := bucketcfg.Parse([]byte(tc.render(p.Addr, []string{m.TLSAddr}, p.StatePath)))
		if err != nil {
			t.Fatal(err)
		}
		return p.Reload(cfg)
	}
	off := tc
	off.upstreamTLS = "enabled = false\n"
	if err := reload(off); err == nil || !strings.Contains(err.Error(), "upstream.tls.enabled changed") {
		t.Fatalf("reload turning upstream TLS off: %v, want refused", err)
	}
	ca, err := os.ReadFile(m.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, ca, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := reload(tc); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a set verified with the reloaded CA", func() bool {
		r, err := c.Set([]byte("k"), []byte("v"))
		return err == nil && r.Status() == mc.StatusSuccess
	})
}

// memcached 1.6.18 with TLS leaves input in OpenSSL's buffer when its
// read takes part of a TLS record (deep pipelines of values; the bytes
// after a value it refuses as too large) and waits for its socket: the
// proxy nudges a TLS connection whose server went quiet (upstream.nudge)
// so that those requests are answered, not timed out.
func TestUpstreamTLSDeepPipelines(t *testing.T) {
	t.Parallel()
	m := testmc.StartTLS(t, testmc.TLSOptions{})
	// A generous upstream timeout: on a loaded machine (the race detector,
	// other tests) a deep pipeline over TLS can take longer than the
	// harness's 2 s to be answered; what is checked is that every request
	// is answered, which without the nudge none past the stall is.
	p := startProxyTo(t, m, testConfig{throttle: `capacity = "unlimited"`, upstream: `timeout = "30s"`, upstreamTLS: upstreamTLSLines(m.CAFile)})
	c := dial(t, p.Addr)
	for round := 0; round < 5; round++ {
		want := map[uint32]bool{}
		for i := 0; i < 400; i++ {
			key := []byte(fmt.Sprintf("p%d", i%7))
			if i%3 == 0 {
				want[c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: key, Value: bytes.Repeat([]byte{'a' + byte(i%26)}, 1+i*7%3000)})] = true
			} else {
				want[c.Send(mcclient.Request{Opcode: mc.OpGetK, Key: key})] = true
			}
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		for len(want) > 0 {
			r, err := c.Read()
			if err != nil {
				t.Fatal(err)
			}
			if s := r.Status(); s != mc.StatusSuccess && s != mc.StatusKeyEnoent {
				t.Fatalf("round %d: status %v %q (%d answers missing)", round, s, r.Value, len(want))
			}
			delete(want, r.Opaque)
		}
	}
	// A value over memcached's item size, then a get, in one write.
	tc := dialText(t, p.Addr)
	big := strings.Repeat("x", 1100*1000)
	if got := textDo(t, tc, "set big 0 0 1100000\r\n"+big+"\r\nget p1\r\n", "END\r\n"); !strings.HasPrefix(got, "SERVER_ERROR") || strings.Contains(got, "upstream") {
		t.Fatalf("oversized set then get: %.200q", got)
	}
}
