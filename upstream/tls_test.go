package upstream

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// LoadTLSConfig's errors name the key and file at fault, and never what a
// key file holds.
func TestLoadTLSConfigErrors(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("SECRET-KEY-MATERIAL\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ca := testcerts.NewCA(t, "ca")
	certFile, _ := ca.Issue(t, testcerts.Leaf{CN: "c", Client: true}).Write(t, dir, "client")
	for _, c := range []struct {
		name string
		f    TLSFiles
		want string
	}{
		{"missing CA", TLSFiles{CAFile: filepath.Join(dir, "nope.pem")}, "upstream.tls.ca_file: open "},
		{"CA not PEM", TLSFiles{CAFile: junk}, "upstream.tls.ca_file: " + junk + ": no PEM certificate"},
		{"bad key", TLSFiles{CertFile: certFile, KeyFile: junk}, "upstream.tls.cert_file " + certFile + " / upstream.tls.key_file " + junk},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadTLSConfig(c.f)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
			if strings.Contains(err.Error(), "SECRET") {
				t.Fatalf("error shows the file's content: %v", err)
			}
		})
	}
}

func loadTestTLS(t *testing.T, f TLSFiles) *dialer {
	t.Helper()
	conf, err := LoadTLSConfig(f)
	if err != nil {
		t.Fatal(err)
	}
	d := newDialer(conf)
	t.Cleanup(d.close)
	return d
}

// A TLS dial hands back the plaintext side of a bridge to memcached -Z;
// the dialer tracks the bridge until it ends, close ends the bridges
// still open and waits for them, and refuses later TLS dials.
func TestDialerTLSBridges(t *testing.T) {
	m := testmc.StartTLS(t, testmc.TLSOptions{})
	d := loadTestTLS(t, TLSFiles{CAFile: m.CAFile})
	version := binary.AppendFrame(nil, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpVersion}, nil, nil, nil, nil)

	nc, b, err := d.dial(m.TLSAddr, 2*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Write(version); err != nil {
		t.Fatal(err)
	}
	var resp [binary.HeaderLen]byte
	if _, err := io.ReadFull(nc, resp[:]); err != nil {
		t.Fatalf("VERSION through the bridge: %v", err)
	}
	if h, _ := binary.ParseHeader(resp[:]); h.Opcode != binary.OpVersion || h.Status() != binary.StatusSuccess {
		t.Fatalf("VERSION through the bridge: %+v", h)
	}

	// A bridge whose loop side closes ends by itself.
	nc2, b2, err := d.dial(m.TLSAddr, 2*time.Second, true)
	if err != nil {
		t.Fatal(err)
	}
	if n := d.openBridges(); n != 2 {
		t.Fatalf("%d bridges tracked, want 2", n)
	}
	nc2.Close()
	select {
	case <-b2.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a bridge whose loop side closed did not end")
	}
	eventually(t, time.Minute, "the ended bridge to be forgotten", func() bool { return d.openBridges() == 1 })

	d.close()
	select {
	case <-b.Done():
	default:
		t.Fatal("close returned with a bridge still running")
	}
	if n := d.openBridges(); n != 0 {
		t.Fatalf("%d bridges tracked after close, want 0", n)
	}
	if _, _, err := d.dial(m.TLSAddr, time.Second, false); err != errPoolClosed {
		t.Fatalf("dial after close: %v, want %v", err, errPoolClosed)
	}
}

// Verification is on by default: the server's certificate must chain to
// the CA and carry the server name (by default the address's host).
func TestDialerTLSVerifies(t *testing.T) {
	m := testmc.StartTLS(t, testmc.TLSOptions{})
	otherCA := filepath.Join(t.TempDir(), "other.pem")
	if err := os.WriteFile(otherCA, testcerts.NewCA(t, "other").PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		f    TLSFiles
		want string
	}{
		{"wrong CA", TLSFiles{CAFile: otherCA}, "certificate signed by unknown authority"},
		{"system roots", TLSFiles{}, "certificate signed by unknown authority"},
		{"wrong name", TLSFiles{CAFile: m.CAFile, ServerName: "mc.example"}, "mc.example"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := loadTestTLS(t, c.f)
			_, _, err := d.dial(m.TLSAddr, 2*time.Second, false)
			if err == nil || !strings.Contains(err.Error(), "tls handshake: ") || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("dial: %v, want a tls handshake error saying %q", err, c.want)
			}
			if _, _, err := probe(d, m.TLSAddr, time.Second, true); err == nil || !strings.Contains(err.Error(), "tls handshake") {
				t.Fatalf("probe: %v, want a tls handshake error", err)
			}
			if n := d.openBridges(); n != 0 {
				t.Fatalf("%d bridges after failed dials", n)
			}
		})
	}
}

// The prober speaks TLS to a TLS pool's servers (memcached -Z refuses
// plaintext on its TLS port): it finds the server up and reads its
// VERSION. SetTLSConfig replaces the configuration of a TLS pool and
// refuses to turn TLS on or off.
func TestPoolTLSProbesAndSetTLSConfig(t *testing.T) {
	m := testmc.StartTLS(t, testmc.TLSOptions{})
	conf, err := LoadTLSConfig(TLSFiles{CAFile: m.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	p := newTestPool(t, PoolConfig{Servers: []string{m.TLSAddr}}, PoolOptions{TLS: conf, ProbeInterval: 20 * time.Millisecond})
	p.Start()
	eventually(t, time.Minute, "the TLS probe to find the server up", func() bool { return stateOf(p, m.TLSAddr).Up })
	if v := string(p.Version()); !strings.HasPrefix(v, "1.") {
		t.Fatalf("VERSION over TLS: %q", v)
	}
	if err := p.SetTLSConfig(nil); err == nil {
		t.Fatal("SetTLSConfig(nil) on a TLS pool: no error")
	}
	conf2 := conf.Clone()
	if err := p.SetTLSConfig(conf2); err != nil || p.dialer.conf.Load() != conf2 {
		t.Fatalf("SetTLSConfig: %v", err)
	}
	plain := newTestPool(t, PoolConfig{Servers: []string{m.Addr}}, PoolOptions{})
	if err := plain.SetTLSConfig(conf); err == nil || plain.dialer.tlsOn() {
		t.Fatal("SetTLSConfig turned TLS on for a plain pool")
	}
}
