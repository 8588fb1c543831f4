package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/proxy"
)

// startRealProxy runs an in-process proxy in front of a real memcached
// with users admin (admin privilege) and alice (bucket alice).
func startRealProxy(t *testing.T) string {
	t.Helper()
	m := testmc.Start(t)
	hash := func(pw string) string {
		h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		return string(h)
	}
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
`, listen, m.Addr, filepath.Join(t.TempDir(), "state.json"), hash("admin-pw"), hash("alice-pw"))
	cfg, err := bucketcfg.Parse([]byte(cfgText))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(proxy.Options{Config: cfg, Logger: zerolog.Nop(), NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	<-srv.Started()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	})
	return listen
}

func realCtl(t *testing.T, addr, user, pw string, args ...string) (int, string, string) {
	t.Helper()
	pwFile := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pwFile, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	full := append([]string{"--addr", addr, "--user", user, "--password-file", pwFile}, args...)
	var out, errb bytes.Buffer
	code := cmdCtl(full, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

// TestCtlAgainstProxy runs every ctl sub-command against a real proxy.
func TestCtlAgainstProxy(t *testing.T) {
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
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v as %s: exit %d stderr %q, want 1 and %q", tc.args, tc.user, code, errs, tc.want)
		}
		if strings.Contains(errs, tc.pw) && tc.pw != "" {
			t.Errorf("%v: stderr shows the password", tc.args)
		}
	}
}
