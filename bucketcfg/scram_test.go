package bucketcfg

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/xdg-go/scram"
)

// scramConversation runs a whole SCRAM exchange for user with password
// against cfg's credentials, and reports whether the server accepted the
// proof and the client the server's signature.
func scramConversation(t *testing.T, cfg *Config, h SCRAMHash, user, password string) (serverOK, clientOK bool) {
	t.Helper()
	srv, err := h.Func().NewServer(func(name string) (scram.StoredCredentials, error) {
		sc, _ := cfg.SCRAMCredentials(h, name)
		return sc, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := h.Func().NewClient(user, password, "")
	if err != nil {
		t.Fatal(err)
	}
	sconv, cconv := srv.NewConversation(), cl.NewConversation()
	c1, err := cconv.Step("")
	if err != nil {
		t.Fatal(err)
	}
	s1, err := sconv.Step(c1)
	if err != nil {
		t.Fatalf("server-first for %q: %v", user, err)
	}
	c2, err := cconv.Step(s1)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := sconv.Step(c2)
	if err != nil || !sconv.Valid() {
		return false, false
	}
	_, err = cconv.Step(s2)
	return true, err == nil && cconv.Valid()
}

func TestSCRAMCredentialsRoundTrip(t *testing.T) {
	v256, err := HashSCRAM(SCRAMSHA256, "secret", MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	v512, err := HashSCRAM(SCRAMSHA512, "secret", MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v256, "SCRAM-SHA-256$4096:") || !strings.HasPrefix(v512, "SCRAM-SHA-512$4096:") || strings.Contains(v256+v512, "secret") {
		t.Fatalf("credentials %q %q", v256, v512)
	}
	cfg := mustParse(t, `
[[bucket]]
name = "default"
[[user]]
name = "both"
password_hash = "`+fastHash(t)+`"
scram_sha256 = "`+v256+`"
scram_sha512 = "`+v512+`"
[[user]]
name = "scramonly"
scram_sha256 = "`+v256+`"
[[user]]
name = "plainonly"
password_hash = "`+fastHash(t)+`"
`)
	for _, c := range []struct {
		h              SCRAMHash
		user, password string
		ok             bool
	}{
		{SCRAMSHA256, "both", "secret", true},
		{SCRAMSHA512, "both", "secret", true},
		{SCRAMSHA256, "scramonly", "secret", true},
		{SCRAMSHA256, "both", "wrong", false},
		{SCRAMSHA512, "scramonly", "secret", false}, // no scram_sha512
		{SCRAMSHA256, "plainonly", "secret", false}, // no SCRAM credential
		{SCRAMSHA256, "nobody", "secret", false},
	} {
		srvOK, clOK := scramConversation(t, cfg, c.h, c.user, c.password)
		if srvOK != c.ok || clOK != c.ok {
			t.Errorf("%s %s/%s: server accepted %v, client accepted %v; want %v", c.h, c.user, c.password, srvOK, clOK, c.ok)
		}
		_, u := cfg.SCRAMCredentials(c.h, c.user)
		if hasCred := c.user != "nobody" && c.user != "plainonly" && !(c.user == "scramonly" && c.h == SCRAMSHA512); (u != nil) != hasCred {
			t.Errorf("SCRAMCredentials(%s, %s) user = %v", c.h, c.user, u)
		}
	}
	// A SCRAM-only user cannot use PLAIN, even with the right password.
	if _, err := cfg.Authenticate("scramonly", "secret"); !errors.Is(err, ErrAuthFailed) {
		t.Errorf("PLAIN for a user without password_hash: %v, want ErrAuthFailed", err)
	}
	if u := cfg.User("both"); !u.HasPassword() || !u.HasSCRAM(SCRAMSHA256) || !u.HasSCRAM(SCRAMSHA512) || cfg.User("scramonly").HasPassword() {
		t.Error("HasPassword/HasSCRAM disagree with the file")
	}
	if !cfg.User("both").SameSCRAM(cfg.User("scramonly"), SCRAMSHA256) || cfg.User("both").SameSCRAM(cfg.User("scramonly"), SCRAMSHA512) {
		t.Error("SameSCRAM")
	}
}

// A user without a credential, or an unknown one, gets a decoy that looks
// like a real credential: a stable salt per name, the users' usual
// iteration count, keys of the right size.
func TestSCRAMDecoy(t *testing.T) {
	v, err := HashSCRAM(SCRAMSHA512, "secret", 5000)
	if err != nil {
		t.Fatal(err)
	}
	cfg := mustParse(t, "[[bucket]]\nname=\"default\"\n[[user]]\nname=\"u\"\nscram_sha512=\""+v+"\"\n")
	a, u1 := cfg.SCRAMCredentials(SCRAMSHA512, "mallory")
	b, u2 := cfg.SCRAMCredentials(SCRAMSHA512, "mallory")
	c, _ := cfg.SCRAMCredentials(SCRAMSHA512, "eve")
	d, _ := cfg.SCRAMCredentials(SCRAMSHA256, "mallory")
	if u1 != nil || u2 != nil {
		t.Fatal("decoy with a user")
	}
	if a.Salt != b.Salt || a.Salt == c.Salt || a.Salt == d.Salt || len(a.Salt) != scramSaltBytes {
		t.Errorf("decoy salts: not stable per name and hash")
	}
	if a.Iters != 5000 || d.Iters != DefaultSCRAMIterations {
		t.Errorf("decoy iterations %d, %d; want the users' 5000 and the default", a.Iters, d.Iters)
	}
	if len(a.StoredKey) != 64 || len(d.StoredKey) != 32 || bytes.Equal(a.StoredKey, b.StoredKey) {
		t.Errorf("decoy keys: wrong sizes or not random")
	}
}

// decoyUsers returns [[user]] tables: a with a password_hash and both
// SCRAM credentials, b with scram512 only; reversed lists b first.
func decoyUsers(hash, s256, s512 string, reversed bool) string {
	a := "[[user]]\nname=\"a\"\npassword_hash=\"" + hash + "\"\nscram_sha256=\"" + s256 + "\"\nscram_sha512=\"" + s512 + "\"\n"
	b := "[[user]]\nname=\"b\"\nscram_sha512=\"" + s512 + "\"\n"
	if reversed {
		return b + a
	}
	return a + b
}

// decoyChildEnv names the file of the configuration a child process of
// TestSCRAMDecoyAcrossRestart loads (see there).
const decoyChildEnv = "KVTHROTTLE_TEST_DECOY_CONFIG"

// TestSCRAMDecoyStable: the decoy salts depend on the users' credentials
// only: a configuration loaded again with the same users (in another
// order, with other buckets: a restart, or a reload that keeps the users)
// gives an unknown name the same salt, while a change of a secret part of
// a credential (StoredKey, which never leaves the proxy; the salt and the
// iterations, which anyone may ask for, kept) changes it, so it cannot be
// computed from what the proxy discloses. Real users get their own
// credentials, untouched.
func TestSCRAMDecoyStable(t *testing.T) {
	s256, err := HashSCRAM(SCRAMSHA256, "secret", MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	s512, err := HashSCRAM(SCRAMSHA512, "secret", 5000)
	if err != nil {
		t.Fatal(err)
	}
	other256, err := HashSCRAM(SCRAMSHA256, "other", MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	// s256 with other256's keys: the same public factors, other secrets.
	factors, _, _ := strings.Cut(s256[strings.Index(s256, "$")+1:], "$")
	_, otherKeys, _ := strings.Cut(other256[strings.Index(other256, "$")+1:], "$")
	rekeyed := "SCRAM-SHA-256$" + factors + "$" + otherKeys

	first := mustParse(t, "[[bucket]]\nname=\"default\"\n"+decoyUsers(fastHash(t), s256, s512, false))
	again := mustParse(t, "[[bucket]]\nname=\"default\"\n[[bucket]]\nname=\"x\"\n"+decoyUsers(fastHash(t), s256, s512, true))
	changed := mustParse(t, "[[bucket]]\nname=\"default\"\n"+decoyUsers(fastHash(t), rekeyed, s512, false))
	for _, h := range []SCRAMHash{SCRAMSHA256, SCRAMSHA512} {
		d1, u1 := first.SCRAMCredentials(h, "mallory")
		d2, u2 := again.SCRAMCredentials(h, "mallory")
		d3, _ := changed.SCRAMCredentials(h, "mallory")
		if u1 != nil || u2 != nil {
			t.Fatalf("%s: a decoy with a user", h)
		}
		if d1.Salt != d2.Salt || d1.Iters != d2.Iters {
			t.Errorf("%s: the same users loaded again give mallory another decoy (salt equal %v, iterations %d, %d)", h, d1.Salt == d2.Salt, d1.Iters, d2.Iters)
		}
		if d1.Salt == d3.Salt {
			t.Errorf("%s: a StoredKey changed, mallory's decoy salt did not: it does not depend on the secret keys", h)
		}
		// Real users: the salt and iterations of their credentials.
		for _, cfg := range []*Config{first, again, changed} {
			r, u := cfg.SCRAMCredentials(h, "a")
			want, _ := parseSCRAM(h, map[SCRAMHash]string{SCRAMSHA256: s256, SCRAMSHA512: s512}[h])
			if u == nil || r.Salt != string(want.salt) || r.Iters != want.iters {
				t.Errorf("%s: user a gets salt %x, %d iterations, user %v; want its own %x, %d", h, r.Salt, r.Iters, u, want.salt, want.iters)
			}
		}
	}
	// b has no SCRAM-SHA-256 credential: a decoy, stable, of its name.
	b1, u := first.SCRAMCredentials(SCRAMSHA256, "b")
	b2, _ := again.SCRAMCredentials(SCRAMSHA256, "b")
	m, _ := first.SCRAMCredentials(SCRAMSHA256, "mallory")
	if u != nil || b1.Salt != b2.Salt || b1.Salt == m.Salt {
		t.Errorf("user b without scram_sha256: user %v, decoy salt stable %v, distinct from mallory's %v", u, b1.Salt == b2.Salt, b1.Salt != m.Salt)
	}
	// No users: a constant key, the same for every such configuration.
	e1, _ := mustParse(t, "[[bucket]]\nname=\"default\"\n").SCRAMCredentials(SCRAMSHA512, "mallory")
	e2, _ := mustParse(t, "[[bucket]]\nname=\"other\"\n[proxy]\ndefault_bucket=\"other\"\n").SCRAMCredentials(SCRAMSHA512, "mallory")
	if e1.Salt != e2.Salt || len(e1.Salt) != scramSaltBytes {
		t.Error("without users, decoy salts differ between configurations")
	}
}

// TestSCRAMDecoyAcrossRestart: a new process that loads the same
// configuration gives an unknown name the same decoy salt, as a real
// user's salt stays the same: comparing salts before and after a restart
// does not tell which names exist. The test runs itself as the child.
func TestSCRAMDecoyAcrossRestart(t *testing.T) {
	if path := os.Getenv(decoyChildEnv); path != "" {
		cfg, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := cfg.SCRAMCredentials(SCRAMSHA512, "mallory")
		fmt.Printf("decoy=%s\n", base64.StdEncoding.EncodeToString([]byte(d.Salt)))
		return
	}
	s256, err := HashSCRAM(SCRAMSHA256, "secret", MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	s512, err := HashSCRAM(SCRAMSHA512, "secret", MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kvthrottle.toml")
	if err := os.WriteFile(path, []byte("[[bucket]]\nname=\"default\"\n"+decoyUsers(fastHash(t), s256, s512, false)), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := cfg.SCRAMCredentials(SCRAMSHA512, "mallory")
	want := "decoy=" + base64.StdEncoding.EncodeToString([]byte(d.Salt))
	cmd := exec.Command(os.Args[0], "-test.run=^TestSCRAMDecoyAcrossRestart$", "-test.count=1")
	cmd.Env = append(os.Environ(), decoyChildEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), want+"\n") {
		t.Errorf("another process gives mallory another decoy salt: it printed\n%s\nthis one has %s", out, want)
	}
}

func TestSCRAMConfigErrors(t *testing.T) {
	good, err := HashSCRAM(SCRAMSHA256, "secret", MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	_, keys, _ := strings.Cut(strings.TrimPrefix(good, "SCRAM-SHA-256$4096:"), "$")
	user := func(lines string) string { return "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"u\"\n" + lines }
	for _, c := range []struct{ name, doc, want string }{
		{"wrong hash", user(`scram_sha512 = "` + good + `"`), `user "u": scram_sha512: not a SCRAM-SHA-512 credential`},
		{"plain text", user(`scram_sha256 = "hunter2"`), `user "u": scram_sha256: not a SCRAM-SHA-256 credential`},
		{"few iterations", user(`scram_sha256 = "` + strings.Replace(good, "$4096:", "$1000:", 1) + `"`), `user "u": scram_sha256: 1000 iterations: must be from 4096`},
		{"iterations not a number", user(`scram_sha256 = "` + strings.Replace(good, "$4096:", "$many:", 1) + `"`), "iteration count is not a number"},
		{"short salt", user(`scram_sha256 = "SCRAM-SHA-256$4096:c2FsdA==$` + keys + `"`), "the salt is 4 bytes"},
		{"short key", user(`scram_sha256 = "` + good[:len(good)-8] + `"`), "ServerKey is not 32 bytes"},
		{"no credential", user(`buckets = ["default"]`), `user "u": password_hash: missing`},
		{"plain_auth", "[proxy]\nplain_auth = \"sometimes\"\n", `proxy.plain_auth: unknown value "sometimes"`},
	} {
		_, err := Parse([]byte(c.doc))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want %q", c.name, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), keys[:20]) || strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%s: error quotes the credential: %v", c.name, err)
		}
	}
	for _, v := range []string{"tls-or-loopback", "tls-only", "anywhere"} {
		if cfg := mustParse(t, "[proxy]\nplain_auth = \""+v+"\"\n"); string(cfg.Proxy.PlainAuth) != v {
			t.Errorf("plain_auth %q parsed as %q", v, cfg.Proxy.PlainAuth)
		}
	}
	if _, err := HashSCRAM(SCRAMSHA256, "", DefaultSCRAMIterations); err == nil {
		t.Error("HashSCRAM accepted an empty password")
	}
	if _, err := HashSCRAM(SCRAMSHA256, "secret", 100); err == nil {
		t.Error("HashSCRAM accepted 100 iterations")
	}
}
