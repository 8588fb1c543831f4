package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/ctl"
	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/proxy"
)

// startRealProxy runs an in-process proxy in front of a real memcached
// with users admin (admin privilege, password admin-pw) and alice (bucket
// alice, password alice-pw).
func startRealProxy(t *testing.T) string {
	t.Helper()
	m := testmc.Start(t)
	listen := testmc.FreeAddr(t)
	cfgText := fmt.Sprintf(`
[proxy]
listen = %q
[upstream]
servers = [%q]
[throttle]
capacity = 20000
state_file = %q
[metrics]
listen = ""
[[bucket]]
name = "default"
[[bucket]]
name = "alice"
hard_limit = 3000
[[user]]
name = "admin"
password_hash = %q
buckets = ["*"]
privileges = ["admin"]
[[user]]
name = "alice"
password_hash = %q
buckets = ["alice"]
`, listen, m.Addr, filepath.Join(t.TempDir(), "state.json"), testmc.PasswordHash(t, "admin-pw"), testmc.PasswordHash(t, "alice-pw"))
	cfg, err := bucketcfg.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: zerolog.Nop(), NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	testmc.Serve(t, srv)
	return listen
}

// ctlRun runs `kvthrottle ctl args...` with stdin as its standard input
// and returns its exit code and outputs.
func ctlRun(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(append([]string{"ctl"}, args...), strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// realCtl runs `kvthrottle ctl` against addr as user, the password in a
// --password-file.
func realCtl(t *testing.T, addr, user, pw string, args ...string) (int, string, string) {
	t.Helper()
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return ctlRun(t, "", append([]string{"--addr", addr, "--user", user, "--password-file", pwFile}, args...)...)
}

// TestCtlAgainstProxy runs every ctl sub-command against a real proxy:
// flags, password sources, standard input and exit codes wired to the ctl
// package.
func TestCtlAgainstProxy(t *testing.T) {
	t.Setenv(ctl.PasswordEnv, "")
	addr := startRealProxy(t)

	if code, out, errs := realCtl(t, addr, "admin", "admin-pw", "set-node", `{"capacity":15000}`); code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("set-node: %d %q %q", code, out, errs)
	}
	if code, out, errs := realCtl(t, addr, "admin", "admin-pw", "set-bucket", "alice", `{"reserved":100,"hard_limit":2000}`); code != 0 || !strings.Contains(out, "ok") {
		t.Fatalf("set-bucket: %d %q %q", code, out, errs)
	}
	code, out, errs := realCtl(t, addr, "admin", "admin-pw", "stats", "throttle")
	if code != 0 || !strings.Contains(out, "15000") || !strings.Contains(out, "alice") || !strings.Contains(out, "2000") {
		t.Fatalf("stats throttle: %d %q %q", code, out, errs)
	}
	if code, out, errs := realCtl(t, addr, "admin", "admin-pw", "stats"); code != 0 || !strings.Contains(out, "uptime") {
		t.Fatalf("stats: %d %q %q", code, out, errs)
	}
	t.Setenv("COLUMNS", "80")
	code, out, errs = realCtl(t, addr, "admin", "admin-pw", "top", "--iterations", "2", "--interval", "50ms")
	if code != 0 || !strings.Contains(out, "alice") || !strings.Contains(out, "default") {
		t.Fatalf("top: %d %q %q", code, out, errs)
	}

	// The password from the environment; flags after the command, and the
	// JSON on standard input.
	t.Setenv(ctl.PasswordEnv, "admin-pw")
	code, out, errs = ctlRun(t, ` {"reserved": 5, "hard_limit": 10}`+"\n", "set-bucket", "alice", "-", "--addr", addr, "--user", "admin")
	if code != 0 || !strings.HasPrefix(out, "ok\n") || errs != "" {
		t.Fatalf("set-bucket from stdin: %d %q %q", code, out, errs)
	}
	if code, out, errs := ctlRun(t, "", "--addr", addr, "--user", "admin", "stats", "throttle"); code != 0 || !strings.Contains(strings.Join(strings.Fields(out), " "), "alice 5 10 ") {
		t.Fatalf("stats throttle after set-bucket from stdin: %d %q %q", code, out, errs)
	}
	t.Setenv(ctl.PasswordEnv, "")

	// Errors, each with its message.
	for _, tc := range []struct {
		user, pw string
		args     []string
		want     string
	}{
		{"alice", "alice-pw", []string{"set-node", `{"capacity":1}`}, "permission denied"},
		{"admin", "admin-pw", []string{"set-bucket", "alice", `{"reserved":"lots"}`}, "invalid request"},
		{"admin", "admin-pw", []string{"set-bucket", "nope", `{"reserved":1,"hard_limit":2}`}, "unknown bucket nope"},
		{"admin", "wrong", []string{"stats"}, "authentication failed"},
	} {
		code, _, errs := realCtl(t, addr, tc.user, tc.pw, tc.args...)
		if code != 1 || !strings.HasPrefix(errs, "kvthrottle ctl: ") || !strings.Contains(errs, tc.want) || strings.Count(errs, "\n") != 1 {
			t.Errorf("%v as %s: exit %d stderr %q, want 1 and one line with %q", tc.args, tc.user, code, errs, tc.want)
		}
		if strings.Contains(errs, tc.pw) && tc.pw != "" {
			t.Errorf("%v: stderr shows the password", tc.args)
		}
	}
}

func TestCtlUsage(t *testing.T) {
	t.Setenv(ctl.PasswordEnv, "")
	cases := []struct {
		args []string
		want string
	}{
		{nil, "missing command"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"set-node"}, "usage: set-node JSON"},
		{[]string{"set-bucket", "web"}, "usage: set-bucket NAME JSON"},
		{[]string{"stats", "a", "b"}, "usage: stats [GROUP]"},
		{[]string{"top", "x"}, "top takes no arguments"},
		{[]string{"--iterations", "2", "stats"}, "--iterations applies to top only"},
		{[]string{"--bogus", "stats"}, "flag provided but not defined: -bogus"},
		{[]string{"--password-file", "x", "stats"}, "--password-file needs --user"},
		{[]string{"--user", "admin", "stats"}, "--user admin needs a password"},
		{[]string{"top", "--interval", "0s"}, "--interval must be positive"},
		{[]string{"set-node", "-"}, "set-node: empty JSON"},
		{[]string{"--user", "u", "--sasl-mech", "scram-md5", "stats"}, `--sasl-mech: unknown SASL mechanism "scram-md5"`},
		{[]string{"--sasl-mech", "plain", "stats"}, "--sasl-mech needs --user"},
		{[]string{"--cert", "c.pem", "stats"}, "--cert and --key go together"},
		{[]string{"--key", "c.key", "stats"}, "--cert and --key go together"},
		{[]string{"--cert", "c.pem", "--key", "c.key", "--user", "admin", "stats"}, "with --cert, leave out --user"},
	}
	for _, tc := range cases {
		code, out, errs := ctlRun(t, "", tc.args...)
		if code != 2 || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: code %d, stdout %q, stderr %q; want 2 and %q", tc.args, code, out, errs, tc.want)
		}
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, out, _ := ctlRun(t, "", args...)
		if code != 0 || !strings.Contains(out, "set-bucket NAME JSON") {
			t.Errorf("%q: code %d, stdout %q", args, code, out)
		}
	}
}

// TestCtlNoPasswordFlag: --password is not a flag, and its value is not
// echoed.
func TestCtlNoPasswordFlag(t *testing.T) {
	for _, args := range [][]string{
		{"--addr", "127.0.0.1:1", "--user", "admin", "--password", "hunter2", "stats"},
		{"--addr", "127.0.0.1:1", "--user", "admin", "-password=hunter2", "stats"},
		{"stats", "--password=hunter2"},
	} {
		code, out, errs := ctlRun(t, "", args...)
		if code != 2 || !strings.Contains(errs, "there is no --password flag") || strings.Contains(errs+out, "hunter2") {
			t.Errorf("%q: code %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
}

// TestCtlTLSFlags: --ca, --cert, --key, --tls, --server-name and
// --sasl-mech reach the proxy: a client certificate administers a mutual
// TLS proxy with no user or password (--ca implying --tls), and
// --sasl-mech picks SCRAM for a user that has no password_hash.
func TestCtlTLSFlags(t *testing.T) {
	t.Setenv(ctl.PasswordEnv, "")
	m := testmc.Start(t)
	dir := t.TempDir()
	ca := testcerts.NewCA(t, "ctl flags CA")
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	srvCert, srvKey := ca.Server(t).Write(t, dir, "server")
	cert, key := ca.Issue(t, testcerts.Leaf{CN: "admin", Client: true}).Write(t, dir, "admin")
	scram512, err := bucketcfg.HashSCRAM(bucketcfg.SCRAMSHA512, "scram-pw", bucketcfg.MinSCRAMIterations)
	if err != nil {
		t.Fatal(err)
	}
	listen, tlsListen := testmc.FreeAddr(t), testmc.FreeAddr(t)
	cfg, err := bucketcfg.Parse([]byte(fmt.Sprintf(`
[proxy]
listen = %q
[upstream]
servers = [%q]
[throttle]
state_file = %q
[metrics]
listen = ""
[tls]
listen = %q
cert_file = %q
key_file = %q
client_ca_file = %q
[[bucket]]
name = "default"
[[user]]
name = "admin"
password_hash = %q
buckets = ["*"]
privileges = ["admin"]
[[user]]
name = "scrammer"
scram_sha512 = %q
buckets = ["*"]
privileges = ["admin"]
`, listen, m.Addr, filepath.Join(dir, "state.json"), tlsListen, srvCert, srvKey, caFile, testmc.PasswordHash(t, "admin-pw"), scram512)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: zerolog.Nop(), NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	testmc.Serve(t, srv)

	if code, out, errs := ctlRun(t, "", "--addr", tlsListen, "--ca", caFile, "--cert", cert, "--key", key, "set-node", `{"capacity":4321}`); code != 0 || out != "ok\n" {
		t.Fatalf("set-node with a client certificate: %d %q %q", code, out, errs)
	}
	if code, out, errs := ctlRun(t, "", "--tls", "--addr", tlsListen, "--ca", caFile, "--server-name", "localhost", "--cert", cert, "--key", key, "stats", "throttle"); code != 0 || !strings.Contains(out, "4321") {
		t.Fatalf("stats throttle with a client certificate: %d %q %q", code, out, errs)
	}
	if code, out, errs := ctlRun(t, "", "--addr", tlsListen, "--ca", caFile, "stats"); code != 1 || !strings.Contains(errs, "give --cert FILE and --key FILE") {
		t.Fatalf("no client certificate: %d %q %q", code, out, errs)
	}
	if code, out, errs := realCtl(t, listen, "scrammer", "scram-pw", "--sasl-mech", "scram-sha512", "stats", "throttle"); code != 0 || !strings.Contains(out, "4321") {
		t.Fatalf("--sasl-mech scram-sha512: %d %q %q", code, out, errs)
	}
	if code, out, errs := realCtl(t, listen, "scrammer", "scram-pw", "--sasl-mech", "plain", "stats"); code != 1 || !strings.Contains(errs, "authentication failed for user scrammer") || strings.Contains(errs, "scram-pw") {
		t.Fatalf("--sasl-mech plain for a SCRAM-only user: %d %q %q", code, out, errs)
	}
}
