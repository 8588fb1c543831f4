package ctl

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/proxy"
)

// Passwords of the real proxy's users.
const (
	adminPW  = "adm1n pass"
	oldPW    = "0ld-pass"
	ops256PW = "ops-256 pass"
	ops512PW = "ops-512 pass"
	alicePW  = "al1ce pass"
)

// scramCred returns the scram_sha256 or scram_sha512 value for pw, at the
// lowest iteration count (fast tests).
func scramCred(t *testing.T, h bucketcfg.SCRAMHash, pw string) string {
	t.Helper()
	v, err := bucketcfg.HashSCRAM(h, pw, bucketcfg.MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// realProxy is an in-process proxy in front of a real memcached, with a
// plaintext and a TLS listener.
type realProxy struct {
	addr, tlsAddr string
	ca            *testcerts.CA // signs the proxy's certificate and the clients'
	caFile        string
	dir           string
}

// startRealProxy starts a proxy whose users are: admin (every
// credential, admin privilege), old (password_hash only, admin), ops256
// (scram_sha256 only, admin), ops512 (scram_sha512 only, admin) and alice
// (bucket alice, no privilege). mutual makes the TLS listener require
// client certificates signed by the test CA, named by their CN.
func startRealProxy(t *testing.T, mutual bool) *realProxy {
	t.Helper()
	p := &realProxy{ca: testcerts.NewCA(t, "ctl test CA"), dir: t.TempDir()}
	p.caFile = filepath.Join(p.dir, "ca.pem")
	if err := os.WriteFile(p.caFile, p.ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := p.ca.Server(t).Write(t, p.dir, "server")
	tlsTable := fmt.Sprintf("[tls]\nlisten = %q\ncert_file = %q\nkey_file = %q\n", testmc.FreeAddr(t), certFile, keyFile)
	if mutual {
		tlsTable += fmt.Sprintf("client_ca_file = %q\n", p.caFile)
	}
	m := testmc.Start(t)
	p.addr = testmc.FreeAddr(t)
	cfgText := fmt.Sprintf(`
[proxy]
listen = %q
[upstream]
servers = [%q]
[throttle]
state_file = %q
[metrics]
listen = ""
%s
[[bucket]]
name = "default"
[[bucket]]
name = "alice"
[[user]]
name = "admin"
password_hash = %q
scram_sha256 = %q
scram_sha512 = %q
buckets = ["*"]
privileges = ["admin"]
[[user]]
name = "old"
password_hash = %q
buckets = ["*"]
privileges = ["admin"]
[[user]]
name = "ops256"
scram_sha256 = %q
buckets = ["*"]
privileges = ["admin"]
[[user]]
name = "ops512"
scram_sha512 = %q
buckets = ["*"]
privileges = ["admin"]
[[user]]
name = "alice"
password_hash = %q
buckets = ["alice"]
`, p.addr, m.Addr, filepath.Join(p.dir, "state.json"), tlsTable,
		testmc.PasswordHash(t, adminPW), scramCred(t, bucketcfg.SCRAMSHA256, adminPW), scramCred(t, bucketcfg.SCRAMSHA512, adminPW),
		testmc.PasswordHash(t, oldPW), scramCred(t, bucketcfg.SCRAMSHA256, ops256PW), scramCred(t, bucketcfg.SCRAMSHA512, ops512PW),
		testmc.PasswordHash(t, alicePW))
	cfg, err := bucketcfg.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: zerolog.Nop(), NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	testmc.Serve(t, srv)
	p.tlsAddr = srv.TLSAddr()
	if p.tlsAddr == "" {
		t.Fatal("no TLS listener")
	}
	return p
}

// clientCert writes a client certificate naming cn, signed by ca, and
// returns its files.
func clientCert(t *testing.T, ca *testcerts.CA, dir, cn string) (certFile, keyFile string) {
	t.Helper()
	return ca.Issue(t, testcerts.Leaf{CN: cn, Client: true}).Write(t, dir, "client-"+cn)
}

// from makes o dial from the local address ip: 127.0.0.1 and ::1 are the
// only loopback sources for proxy.plain_auth, so 127.0.0.2 is a remote
// client there (though ctl itself sees a loopback peer).
func from(o Options, ip string) Options {
	o.dialer = &net.Dialer{Timeout: time.Minute, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return o
}

// mustOK runs op with o and fails unless it succeeds with output
// containing want.
func mustOK(t *testing.T, what string, o Options, op op, want string) {
	t.Helper()
	var out bytes.Buffer
	if err := op(o, &out); err != nil || !strings.Contains(out.String(), want) {
		t.Fatalf("%s: error %v, output %q; want success with %q", what, err, out.String(), want)
	}
}

// mustFail runs op with o and fails unless it fails with one line
// containing each of want, showing none of the passwords and writing
// nothing.
func mustFail(t *testing.T, what string, o Options, op op, want ...string) {
	t.Helper()
	var out bytes.Buffer
	err := op(o, &out)
	if err == nil || out.Len() != 0 {
		t.Fatalf("%s: error %v, output %q; want an error and nothing", what, err, out.String())
	}
	msg := err.Error()
	t.Logf("%s: %s", what, msg)
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("%s: error %q, want it to contain %q", what, msg, w)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("%s: error %q is not one line", what, msg)
	}
	for _, pw := range []string{adminPW, oldPW, ops256PW, ops512PW, alicePW, "n0t-the-pw", o.Password} {
		if pw != "" && strings.Contains(msg, pw) {
			t.Errorf("%s: the error shows a password: %q", what, msg)
		}
	}
}

// TestCtlTLS: ctl over TLS verifies the proxy's certificate against --ca
// (by the IP address of --addr, or --server-name), authenticates over it
// (PLAIN, which the proxy allows over TLS even from a remote address),
// and refuses a proxy whose certificate another CA signed, or that names
// another host, with a message saying what to do.
func TestCtlTLS(t *testing.T) {
	p := startRealProxy(t, false)
	admin := Options{Addr: p.tlsAddr, User: "admin", Password: adminPW, CAFile: p.caFile, Timeout: 5 * time.Second}

	mustOK(t, "set-node over TLS", admin, setNode(`{"capacity": 12345}`), "ok")
	mustOK(t, "stats over TLS", admin, stats("throttle"), "12345")
	// From a "remote" address: over TLS, auto picks PLAIN, which
	// proxy.plain_auth allows there; old has a password_hash only.
	old := admin
	old.User, old.Password = "old", oldPW
	mustOK(t, "PLAIN over TLS from 127.0.0.2", from(old, "127.0.0.2"), setBucket("alice", `{"reserved": 7}`), "ok")
	named := admin
	named.ServerName = "localhost"
	mustOK(t, "--server-name localhost", named, stats(""), "uptime")

	otherCA := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(otherCA, testcerts.NewCA(t, "another CA").PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	wrongCA := admin
	wrongCA.CAFile = otherCA
	mustFail(t, "wrong CA", wrongCA, stats(""),
		"the proxy's certificate at "+p.tlsAddr+" is not trusted", "unknown authority", "no CA in "+otherCA+" signed it")
	mustFail(t, "wrong CA, top", wrongCA, top, "is not trusted")
	system := admin
	system.CAFile, system.TLS = "", true
	mustFail(t, "system roots", system, stats(""), "is not trusted", "give the CA that signed it with --ca FILE")
	wrongName := admin
	wrongName.ServerName = "proxy.example.com"
	mustFail(t, "wrong server name", wrongName, stats(""), "does not match", "proxy.example.com", "--server-name")
	missing := admin
	missing.CAFile = filepath.Join(t.TempDir(), "missing.pem")
	mustFail(t, "missing CA file", missing, stats(""), "cannot read the CA file")
}

// TestCtlClientCert: with a client certificate naming a [[user]] with the
// admin privilege, ctl administers the proxy with no user and no
// password; a certificate of a user without it gets "permission denied";
// a certificate naming no user, or none at all, is refused by the proxy,
// and the message says so.
func TestCtlClientCert(t *testing.T) {
	p := startRealProxy(t, true)
	dir := t.TempDir()
	base := Options{Addr: p.tlsAddr, CAFile: p.caFile, Timeout: 5 * time.Second}

	admin := base
	admin.CertFile, admin.KeyFile = clientCert(t, p.ca, dir, "admin")
	mustOK(t, "set-node as the admin certificate", admin, setNode(`{"capacity": 4242}`), "ok")
	mustOK(t, "set-bucket as the admin certificate", admin, setBucket("alice", `{"reserved": 3}`), "ok")
	mustOK(t, "stats as the admin certificate", admin, stats("throttle"), "4242")
	mustOK(t, "top as the admin certificate", admin, top, "alice")

	alice := base
	alice.CertFile, alice.KeyFile = clientCert(t, p.ca, dir, "alice")
	mustFail(t, "alice's certificate", alice, setNode(`{"capacity": 1}`),
		"permission denied: the user of the client certificate lacks the admin privilege")

	nobody := base
	nobody.CertFile, nobody.KeyFile = clientCert(t, p.ca, dir, "nobody")
	mustFail(t, "a certificate naming no user", nobody, stats(""),
		"the proxy at "+p.tlsAddr+" refused the TLS connection", "name a [[user]]")
	mustFail(t, "no certificate", base, stats(""),
		"refused the TLS connection", "give --cert FILE and --key FILE")
	noKey := admin
	noKey.KeyFile = ""
	mustFail(t, "certificate without key", noKey, stats(""), "a client certificate needs its key")
}

// TestCtlSCRAM: over cleartext from a remote address (where the proxy
// refuses PLAIN), ctl logs in with SCRAM-SHA512 by default, or the
// mechanism asked for, users with only one of the SCRAM credentials
// included; a wrong password, or a user without the credential, is
// refused with a message naming the mechanism and no password.
func TestCtlSCRAM(t *testing.T) {
	p := startRealProxy(t, false)
	remote := func(user, pw string, m Mech, src string) Options {
		return from(Options{Addr: p.addr, User: user, Password: pw, Mech: m, Timeout: 5 * time.Second}, src)
	}
	mustOK(t, "auto (SCRAM-SHA512) as admin", remote("admin", adminPW, "", "127.0.0.2"), setNode(`{"capacity": 777}`), "ok")
	mustOK(t, "scram-sha256 as admin", remote("admin", adminPW, MechSCRAMSHA256, "127.0.0.2"), stats("throttle"), "777")
	mustOK(t, "scram-sha256 as ops256", remote("ops256", ops256PW, MechSCRAMSHA256, "127.0.0.2"), setBucket("alice", `{"reserved": 9}`), "ok")
	mustOK(t, "scram-sha512 as ops512", remote("ops512", ops512PW, MechSCRAMSHA512, "127.0.0.2"), top, "alice")
	// Over loopback too, when asked for.
	mustOK(t, "scram-sha256 from 127.0.0.1", Options{Addr: p.addr, User: "ops256", Password: ops256PW, Mech: MechSCRAMSHA256}, stats(""), "uptime")

	// Failures, each from a source of its own: a wrong proof makes the
	// proxy slow down its source's next logins.
	mustFail(t, "wrong SCRAM password", remote("admin", "n0t-the-pw", MechSCRAMSHA256, "127.0.0.3"), setNode(`{"capacity": 1}`),
		"authentication failed for user admin with SCRAM-SHA256: a wrong password, or the user has no scram_sha256 credential")
	mustFail(t, "auto picks SCRAM-SHA512, which ops256 lacks", remote("ops256", ops256PW, MechAuto, "127.0.0.4"), stats(""),
		"authentication failed for user ops256 with SCRAM-SHA512", "no scram_sha512 credential")
	mustFail(t, "wrong SCRAM password, top", remote("admin", "n0t-the-pw", MechSCRAMSHA512, "127.0.0.5"), top,
		"authentication failed for user admin with SCRAM-SHA512")
}

// TestCtlPlainRefusedRemote: where proxy.plain_auth (default
// "tls-or-loopback") refuses PLAIN, asking for PLAIN is an error that
// says so, sent without the password; an old user with a password_hash
// only cannot log in there with SCRAM either, and is told why.
func TestCtlPlainRefusedRemote(t *testing.T) {
	p := startRealProxy(t, false)
	old := Options{Addr: p.addr, User: "old", Password: oldPW, Mech: MechPlain, Timeout: 5 * time.Second}
	mustFail(t, "PLAIN from 127.0.0.2", from(old, "127.0.0.2"), stats(""),
		"cannot authenticate user old: the proxy does not allow SASL PLAIN on this connection",
		`it offers "SCRAM-SHA512 SCRAM-SHA256"`, "use --tls", "the password was not sent")
	// The same from 127.0.0.1, and the default there: PLAIN, as before.
	mustOK(t, "PLAIN from 127.0.0.1", old, setNode(`{"capacity": 555}`), "ok")
	old.Mech = ""
	mustOK(t, "auto from 127.0.0.1", old, stats("throttle"), "555")
	mustFail(t, "auto from 127.0.0.2", from(old, "127.0.0.6"), stats(""),
		"authentication failed for user old with SCRAM-SHA512", "kvthrottle hash-password", "needs SASL PLAIN, over --tls")
}

// TestChooseMech: the mechanism auto picks, and the explicit choices
// checked against the proxy's list before any password is sent.
func TestChooseMech(t *testing.T) {
	all := []string{"SCRAM-SHA512", "SCRAM-SHA256", "PLAIN"}
	for _, tc := range []struct {
		m         Mech
		offered   []string
		protected bool
		want      string // "" an error
	}{
		{MechAuto, all, true, "PLAIN"},
		{"", all, true, "PLAIN"},
		{MechAuto, all, false, "SCRAM-SHA512"},
		{MechAuto, []string{"SCRAM-SHA512", "SCRAM-SHA256"}, true, "SCRAM-SHA512"},
		{MechAuto, []string{"SCRAM-SHA256", "PLAIN"}, false, "SCRAM-SHA256"},
		{MechAuto, []string{"PLAIN"}, true, "PLAIN"},
		{MechAuto, []string{"PLAIN"}, false, ""}, // never PLAIN in clear to another host
		{MechAuto, []string{"GSSAPI"}, true, ""},
		{MechPlain, []string{"PLAIN"}, false, "PLAIN"},
		{MechPlain, []string{"SCRAM-SHA512"}, true, ""},
		{MechSCRAMSHA256, all, true, "SCRAM-SHA256"},
		{MechSCRAMSHA512, []string{"PLAIN"}, true, ""},
	} {
		got, err := Options{Mech: tc.m}.chooseMech(tc.offered, tc.protected)
		if got != tc.want || (err == nil) != (tc.want != "") {
			t.Errorf("%q of %q (protected %v): %q, %v; want %q", tc.m, tc.offered, tc.protected, got, err, tc.want)
		}
	}
	for in, want := range map[string]Mech{"": MechAuto, "AUTO": MechAuto, "Scram-SHA512": MechSCRAMSHA512, "plain": MechPlain} {
		if got, err := ParseMech(in); got != want || err != nil {
			t.Errorf("ParseMech(%q) = %q, %v", in, got, err)
		}
	}
	if _, err := ParseMech("scram-md5"); err == nil || !strings.Contains(err.Error(), "auto, plain, scram-sha256, scram-sha512") {
		t.Errorf("ParseMech(scram-md5): %v", err)
	}
}

// TestCtlPlainToTLSListener: ctl without --tls to the proxy's [tls]
// listener, which answers with a TLS alert and closes, says so and
// suggests --tls, with or without a user, for every command.
func TestCtlPlainToTLSListener(t *testing.T) {
	p := startRealProxy(t, false)
	admin := Options{Addr: p.tlsAddr, User: "admin", Password: adminPW, Timeout: 5 * time.Second}
	hint := []string{p.tlsAddr + " answered in TLS", "add --tls"}
	mustFail(t, "stats as admin", admin, stats(""), hint...)
	mustFail(t, "set-node as admin", admin, setNode(`{"capacity": 1}`), hint...)
	mustFail(t, "top as admin", admin, top, hint...)
	anon := admin
	anon.User, anon.Password = "", ""
	mustFail(t, "stats without a user", anon, stats(""), hint...)
	mustFail(t, "top without a user", anon, top, hint...)
}

// TestCtlClosedBeforeAnswer: a plaintext server that closes the
// connection before it sends a byte gets a hint at --tls; one that closes
// after it began to answer, or TLS to a TLS listener, does not.
func TestCtlClosedBeforeAnswer(t *testing.T) {
	// reply is what the server writes after the first request's header,
	// before it closes.
	serve := func(reply []byte) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		t.Cleanup(func() { ln.Close(); <-done })
		go func() {
			defer close(done)
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				_, _ = io.ReadFull(c, make([]byte, 24))
				_, _ = c.Write(reply)
				c.Close()
			}
		}()
		return ln.Addr().String()
	}
	silent := serve(nil)
	for _, user := range []string{"admin", ""} {
		o := Options{Addr: silent, User: user, Password: adminPW, Timeout: 5 * time.Second}
		mustFail(t, "closed at once, user "+user, o, stats(""),
			silent+" closed the connection before answering", "if that is the proxy's [tls] listen address, add --tls")
	}
	half := serve([]byte{0x81, 0x20, 0, 0}) // half a response header
	for _, user := range []string{"admin", ""} {
		o := Options{Addr: half, User: user, Password: adminPW, Timeout: 5 * time.Second}
		var out bytes.Buffer
		err := Stats(o, "", &out)
		if err == nil || err.Error() != half+" closed the connection" {
			t.Errorf("closed mid-answer, user %q: %v; want %q", user, err, half+" closed the connection")
		}
	}
	p := startRealProxy(t, false)
	mustOK(t, "TLS to the TLS listener", Options{Addr: p.tlsAddr, User: "admin", Password: adminPW, CAFile: p.caFile}, stats(""), "uptime")
}
