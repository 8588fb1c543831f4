package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// Credentials of the fake proxy's users.
const (
	fakeAdminPW  = "s3cret adm!n"
	fakeViewerPW = "v1ewer-pw"
)

// fakeProxy is a small binary-protocol server standing in for the proxy:
// SASL PLAIN with an admin and a non-admin user, the throttle admin opcodes
// and the STAT groups "" and "throttle". With plain set it answers like a
// memcached server that knows none of that (0x81).
type fakeProxy struct {
	addr  string
	plain bool
	ln    net.Listener
	wg    sync.WaitGroup

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	requests  []fakeRequest // admin requests received
	statCalls int           // STAT throttle requests answered
}

type fakeRequest struct {
	op         mc.Opcode
	key, value string
}

var fakeUsers = map[string]struct {
	password string
	admin    bool
}{
	"admin":  {fakeAdminPW, true},
	"viewer": {fakeViewerPW, false},
}

// startFake starts a fake proxy on a loopback port; it stops when the test
// ends.
func startFake(t *testing.T, plain bool) *fakeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeProxy{addr: ln.Addr().String(), plain: plain, ln: ln, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns[c] = struct{}{}
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.serve(c)
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *fakeProxy) adminRequests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeRequest(nil), f.requests...)
}

func (f *fakeProxy) serve(c net.Conn) {
	r := bufio.NewReader(c)
	admin := false
	for {
		var hb [mc.HeaderLen]byte
		if _, err := io.ReadFull(r, hb[:]); err != nil {
			return
		}
		h, _ := mc.ParseHeader(hb[:])
		if h.Validate(1<<20) != nil || h.Magic != mc.MagicRequest {
			return
		}
		body := make([]byte, h.BodyLen)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		key := string(body[h.ExtLen : int(h.ExtLen)+int(h.KeyLen)])
		value := string(body[int(h.ExtLen)+int(h.KeyLen):])
		var out []byte
		reply := func(st mc.Status, k, v string) {
			out = mc.AppendResponse(out, &h, st, nil, []byte(k), []byte(v))
		}
		fail := func(st mc.Status, reason string) { out = mc.AppendError(out, &h, st, reason) }

		switch op := h.Opcode; {
		case op == mc.OpStat && key == "":
			for _, kv := range [][2]string{{"pid", "4242"}, {"uptime", "17"}, {"version", "1.6.21-fake"}, {"curr_connections", "3"}} {
				reply(mc.StatusSuccess, kv[0], kv[1])
			}
			reply(mc.StatusSuccess, "", "")
		case f.plain:
			fail(mc.StatusUnknownCommand, "Unknown command")
		case op == mc.OpSASLListMechs:
			reply(mc.StatusSuccess, "", "SCRAM-SHA512 PLAIN")
		case op == mc.OpSASLAuth:
			parts := strings.Split(value, "\x00")
			u, ok := fakeUsers[parts[min(1, len(parts)-1)]]
			if key != "PLAIN" || len(parts) != 3 || parts[0] != "" || !ok || u.password != parts[2] {
				fail(mc.StatusAuthError, "Auth failure")
				break
			}
			admin = u.admin
			reply(mc.StatusSuccess, "", "Authenticated")
		case op == mc.OpSetBucketThrottleProperties || op == mc.OpSetNodeThrottleProperties:
			f.mu.Lock()
			f.requests = append(f.requests, fakeRequest{op, key, value})
			f.mu.Unlock()
			switch {
			case !admin:
				fail(mc.StatusEaccess, "no admin privilege")
			case strings.Contains(value, "bad"):
				fail(mc.StatusEinval, `reserved: must be a non-negative integer or "unlimited", got "bad"`)
			case op == mc.OpSetBucketThrottleProperties && key == "nope":
				fail(mc.StatusKeyEnoent, "no such bucket")
			case op == mc.OpSetBucketThrottleProperties && key == "busy":
				fail(mc.StatusEtmpfail, "cannot write the state file: disk full")
			case op == mc.OpSetBucketThrottleProperties:
				reply(mc.StatusSuccess, "", `{"reserved":100,"hard_limit":"unlimited"}`)
			default:
				reply(mc.StatusSuccess, "", "")
			}
		case op == mc.OpStat && key == "throttle":
			f.mu.Lock()
			f.statCalls++
			n := f.statCalls
			f.mu.Unlock()
			for _, kv := range fakeThrottleStats(n) {
				reply(mc.StatusSuccess, kv[0], kv[1])
			}
			reply(mc.StatusSuccess, "", "")
		case op == mc.OpStat && key == "secret":
			fail(mc.StatusEaccess, "stats group secret needs the admin privilege")
		case op == mc.OpStat:
			fail(mc.StatusKeyEnoent, "")
		default:
			fail(mc.StatusUnknownCommand, "Unknown command")
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// fakeThrottleStats is the STAT throttle answer number n: two buckets, the
// busier one listed last, web's throttled_total growing by 50 a call.
func fakeThrottleStats(n int) [][2]string {
	kv := [][2]string{{"node:capacity", "25000"}, {"node:free_pool", "15000"}}
	add := func(b string, fields ...string) {
		for i := 0; i < len(fields); i += 2 {
			kv = append(kv, [2]string{"bucket:" + b + ":" + fields[i], fields[i+1]})
		}
	}
	add("analytics-batch-nightly",
		"reserved", "0", "hard_limit", "unlimited", "units_per_sec", "2100",
		"units_total", "123456789012", "read_units_total", "123456000000", "write_units_total", "789012",
		"commands_total", "98765432", "throttled_total", "0", "rejected_total", "0",
		"held_sessions", "0", "connections", "12")
	add("web",
		"reserved", "10000", "hard_limit", "20000", "units_per_sec", "14500",
		"units_total", "5400000", "read_units_total", "5000000", "write_units_total", "400000",
		"commands_total", "5300000", "throttled_total", fmt.Sprint(1000+50*n), "rejected_total", "7",
		"held_sessions", "3", "connections", "250")
	return kv
}

// ctl runs `kvthrottle ctl args...` and returns its exit code and outputs.
func ctl(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := cmdCtl(args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

// passwordFile writes pw (and a newline) to a private file.
func passwordFile(t *testing.T, pw string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCtlSetNode(t *testing.T) {
	t.Setenv(passwordEnv, "")
	f := startFake(t, false)
	body := `{"capacity": 30000, "default_throttle_reserved_units": 0, "default_throttle_hard_limit": "unlimited"}`
	code, out, errs := ctl(t, "", "--addr", f.addr, "--user", "admin", "--password-file", passwordFile(t, fakeAdminPW), "set-node", body)
	if code != 0 || out != "ok\n" || errs != "" {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out, errs)
	}
	reqs := f.adminRequests()
	if len(reqs) != 1 || reqs[0] != (fakeRequest{mc.OpSetNodeThrottleProperties, "", body}) {
		t.Fatalf("server got %+v", reqs)
	}
}

func TestCtlSetBucket(t *testing.T) {
	t.Setenv(passwordEnv, fakeAdminPW)
	f := startFake(t, false)
	code, out, errs := ctl(t, "", "--addr", f.addr, "--user", "admin", "set-bucket", "web", `{"reserved": 100}`)
	if code != 0 || out != "ok\n{\"reserved\":100,\"hard_limit\":\"unlimited\"}\n" || errs != "" {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out, errs)
	}
	// Flags after the command, and the JSON on standard input.
	code, out, errs = ctl(t, ` {"reserved": 5, "hard_limit": 10}`+"\n", "set-bucket", "web", "-", "--addr", f.addr, "--user", "admin")
	if code != 0 || !strings.HasPrefix(out, "ok\n") {
		t.Fatalf("code %d, stdout %q, stderr %q", code, out, errs)
	}
	reqs := f.adminRequests()
	want := []fakeRequest{
		{mc.OpSetBucketThrottleProperties, "web", `{"reserved": 100}`},
		{mc.OpSetBucketThrottleProperties, "web", `{"reserved": 5, "hard_limit": 10}`},
	}
	if fmt.Sprint(reqs) != fmt.Sprint(want) {
		t.Fatalf("server got %+v, want %+v", reqs, want)
	}
}

func TestCtlPasswordSources(t *testing.T) {
	f := startFake(t, false)
	set := []string{"set-bucket", "web", `{}`}
	// From the environment.
	t.Setenv(passwordEnv, fakeViewerPW)
	if code, _, errs := ctl(t, "", "--addr", f.addr, "--user", "viewer", "stats"); code != 0 {
		t.Fatalf("env password: code %d, stderr %q", code, errs)
	}
	// The file wins over the environment.
	t.Setenv(passwordEnv, "wrong")
	if code, _, errs := ctl(t, "", append([]string{"--addr", f.addr, "--user", "admin", "--password-file", passwordFile(t, fakeAdminPW)}, set...)...); code != 0 {
		t.Fatalf("file password: code %d, stderr %q", code, errs)
	}
	// CRLF line end and a second line are not part of the password.
	p := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(p, []byte(fakeAdminPW+"\r\nnot this\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := ctl(t, "", append([]string{"--addr", f.addr, "--user", "admin", "--password-file", p}, set...)...); code != 0 {
		t.Fatalf("CRLF password file: code %d, stderr %q", code, errs)
	}
	// The wrong one from the environment is used without a file.
	code, _, errs := ctl(t, "", append([]string{"--addr", f.addr, "--user", "admin"}, set...)...)
	if code != 1 || errs != "kvthrottle ctl: authentication failed for user admin\n" {
		t.Fatalf("wrong env password: code %d, stderr %q", code, errs)
	}
	// No password at all.
	t.Setenv(passwordEnv, "")
	code, _, errs = ctl(t, "", append([]string{"--addr", f.addr, "--user", "admin"}, set...)...)
	if code != 2 || !strings.Contains(errs, "--user admin needs a password") {
		t.Fatalf("no password: code %d, stderr %q", code, errs)
	}
	// Unreadable and empty files.
	code, _, errs = ctl(t, "", append([]string{"--addr", f.addr, "--user", "admin", "--password-file", filepath.Join(t.TempDir(), "missing")}, set...)...)
	if code != 2 || !strings.Contains(errs, "cannot read the password file") {
		t.Fatalf("missing file: code %d, stderr %q", code, errs)
	}
	code, _, errs = ctl(t, "", append([]string{"--addr", f.addr, "--user", "admin", "--password-file", passwordFile(t, "")}, set...)...)
	if code != 2 || !strings.Contains(errs, "is empty") {
		t.Fatalf("empty file: code %d, stderr %q", code, errs)
	}
	// --password is not a flag, and its value is not echoed.
	for _, args := range [][]string{
		{"--addr", f.addr, "--user", "admin", "--password", "hunter2", "stats"},
		{"--addr", f.addr, "--user", "admin", "-password=hunter2", "stats"},
		{"stats", "--password=hunter2"},
	} {
		code, out, errs := ctl(t, "", args...)
		if code != 2 || !strings.Contains(errs, "there is no --password flag") || strings.Contains(errs+out, "hunter2") {
			t.Errorf("%q: code %d, stdout %q, stderr %q", args, code, out, errs)
		}
	}
	if len(f.adminRequests()) != 2 {
		t.Errorf("admin requests: %+v", f.adminRequests())
	}
}

func TestCtlErrors(t *testing.T) {
	t.Setenv(passwordEnv, "")
	f := startFake(t, false)
	plain := startFake(t, true)
	adminPW := passwordFile(t, fakeAdminPW)
	viewerPW := passwordFile(t, fakeViewerPW)
	badPW := passwordFile(t, "guess")
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	asAdmin := []string{"--addr", f.addr, "--user", "admin", "--password-file", adminPW}
	asViewer := []string{"--addr", f.addr, "--user", "viewer", "--password-file", viewerPW}
	cases := []struct {
		name string
		args []string
		want string // the whole of stderr after "kvthrottle ctl: "
	}{
		{"bad password", []string{"--addr", f.addr, "--user", "admin", "--password-file", badPW, "stats"},
			"authentication failed for user admin"},
		{"unknown user", []string{"--addr", f.addr, "--user", "mallory", "--password-file", badPW, "set-node", "{}"},
			"authentication failed for user mallory"},
		{"set-bucket non-admin", append(asViewer, "set-bucket", "web", `{"reserved":1}`),
			"permission denied: user viewer lacks the admin privilege"},
		{"set-node non-admin", append(asViewer, "set-node", `{"capacity":1}`),
			"permission denied: user viewer lacks the admin privilege"},
		{"set-node anonymous", []string{"--addr", f.addr, "set-node", `{"capacity":1}`},
			"permission denied: set-node needs a user with the admin privilege (give --user U)"},
		{"stats access", append(asViewer, "stats", "secret"),
			"access denied: stats group secret needs the admin privilege"},
		{"einval node", append(asAdmin, "set-node", `{"capacity":"bad"}`),
			`invalid request: reserved: must be a non-negative integer or "unlimited", got "bad"`},
		{"einval bucket", append(asAdmin, "set-bucket", "web", `{"reserved":"bad"}`),
			`invalid request: reserved: must be a non-negative integer or "unlimited", got "bad"`},
		{"unknown bucket", append(asAdmin, "set-bucket", "nope", `{"reserved":1}`),
			"unknown bucket nope"},
		{"unknown stats group", append(asAdmin, "stats", "nosuch"),
			"unknown stats group nosuch"},
		{"tmpfail", append(asAdmin, "set-bucket", "busy", `{"reserved":1}`),
			"proxy temporarily unavailable: cannot write the state file: disk full"},
		{"not a proxy", []string{"--addr", plain.addr, "set-node", `{"capacity":1}`},
			"the server does not support this command (is it a kvthrottle proxy?)"},
		{"not a proxy, sasl", []string{"--addr", plain.addr, "--user", "admin", "--password-file", adminPW, "stats"},
			"the server does not support this command (is it a kvthrottle proxy?)"},
		{"not a proxy, top", []string{"--addr", plain.addr, "top", "--iterations", "1"},
			"the server does not support this command (is it a kvthrottle proxy?)"},
		{"connection refused", []string{"--addr", closedAddr, "stats"},
			"cannot connect to " + closedAddr + ": "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errs := ctl(t, "", tc.args...)
			if code != 1 || out != "" {
				t.Errorf("code %d, stdout %q; want 1 and nothing", code, out)
			}
			if !strings.HasPrefix(errs, "kvthrottle ctl: "+tc.want) || strings.Count(errs, "\n") != 1 || !strings.HasSuffix(errs, "\n") {
				t.Errorf("stderr %q, want one line starting with %q", errs, "kvthrottle ctl: "+tc.want)
			}
			for _, pw := range []string{fakeAdminPW, fakeViewerPW, "guess"} {
				if strings.Contains(errs, pw) {
					t.Errorf("stderr shows a password: %q", errs)
				}
			}
		})
	}
}

func TestCtlUsage(t *testing.T) {
	t.Setenv(passwordEnv, "")
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
	}
	for _, tc := range cases {
		code, out, errs := ctl(t, "", tc.args...)
		if code != 2 || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: code %d, stdout %q, stderr %q; want 2 and %q", tc.args, code, out, errs, tc.want)
		}
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, out, _ := ctl(t, "", args...)
		if code != 0 || !strings.Contains(out, "set-bucket NAME JSON") {
			t.Errorf("%q: code %d, stdout %q", args, code, out)
		}
	}
}

func TestCtlStats(t *testing.T) {
	t.Setenv(passwordEnv, "")
	f := startFake(t, false)
	code, out, errs := ctl(t, "", "--addr", f.addr, "stats")
	want := "" +
		"pid              4242\n" +
		"uptime           17\n" +
		"version          1.6.21-fake\n" +
		"curr_connections 3\n"
	if code != 0 || out != want || errs != "" {
		t.Fatalf("code %d, stderr %q, stdout:\n%s\nwant:\n%s", code, errs, out, want)
	}
}

func TestCtlStatsThrottle(t *testing.T) {
	t.Setenv(passwordEnv, fakeViewerPW)
	f := startFake(t, false)
	code, out, errs := ctl(t, "", "--addr", f.addr, "--user", "viewer", "stats", "throttle")
	want := "" +
		"node capacity:  25000 units/s\n" +
		"node free pool: 15000 units/s\n" +
		"\n" +
		"BUCKET                   RESERVED  HARD_LIMIT  UNITS/S         UNITS          READ   WRITE  COMMANDS  THROTTLED  REJECTED  HELD  CONNS\n" +
		"analytics-batch-nightly         0   unlimited     2100  123456789012  123456000000  789012  98765432          0         0     0     12\n" +
		"web                         10000       20000    14500       5400000       5000000  400000   5300000       1050         7     3    250\n"
	if code != 0 || out != want || errs != "" {
		t.Fatalf("code %d, stderr %q, stdout:\n%s\nwant:\n%s", code, errs, out, want)
	}
}

func TestCtlParseThrottleStats(t *testing.T) {
	ts, err := mcclient.ParseThrottleStats(append(fakeThrottleStats(1), [2]string{"bucket:web:future_field", "x"}, [2]string{"other:key", "y"}))
	if err != nil {
		t.Fatal(err)
	}
	if ts.Node.Capacity != 25000 || ts.Node.FreePool != 15000 || len(ts.Buckets) != 2 {
		t.Fatalf("%+v", ts)
	}
	web, ok := ts.Bucket("web")
	want := mcclient.BucketStats{Name: "web", Reserved: 10000, HardLimit: 20000,
		UnitsPerSec: 14500, UnitsTotal: 5400000, ReadUnitsTotal: 5000000, WriteUnitsTotal: 400000, CommandsTotal: 5300000,
		ThrottledTotal: 1050, RejectedTotal: 7, HeldSessions: 3, Connections: 250}
	if !ok || web != want {
		t.Fatalf("web = %+v, want %+v", web, want)
	}
	if a := ts.Buckets[0]; a.Name != "analytics-batch-nightly" || !a.HardLimit.IsUnlimited() || a.UnitsTotal != 123456789012 {
		t.Fatalf("first bucket %+v", a)
	}
	for name, kv := range map[string][][2]string{
		"missing capacity": {{"node:free_pool", "1"}},
		"bad number":       {{"node:capacity", "1"}, {"node:free_pool", "-1"}},
		"duplicate":        {{"node:capacity", "1"}, {"node:capacity", "1"}, {"node:free_pool", "1"}},
		"missing field":    {{"node:capacity", "1"}, {"node:free_pool", "1"}, {"bucket:b:reserved", "1"}},
		"bad name":         {{"node:capacity", "1"}, {"node:free_pool", "1"}, {"bucket:b c:reserved", "1"}},
		"no field":         {{"node:capacity", "1"}, {"node:free_pool", "1"}, {"bucket:b", "1"}},
		"unlimited count":  append(fakeThrottleStats(1)[:2], [2]string{"bucket:web:units_total", "unlimited"}),
	} {
		if _, err := mcclient.ParseThrottleStats(kv); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// topFrames runs top and returns its raw output and its frames, each a
// list of lines with the escape sequences removed.
func topFrames(t *testing.T, args ...string) (string, [][]string) {
	t.Helper()
	code, out, errs := ctl(t, "", args...)
	if code != 0 || errs != "" {
		t.Fatalf("top: code %d, stderr %q", code, errs)
	}
	var frames [][]string
	for _, fr := range strings.Split(out, ansiHome)[1:] {
		frames = append(frames, strings.Split(strings.TrimSuffix(ansiEscape.ReplaceAllString(fr, ""), "\n"), "\n"))
	}
	return out, frames
}

func TestCtlTop(t *testing.T) {
	t.Setenv(passwordEnv, fakeAdminPW)
	t.Setenv("LINES", "")
	f := startFake(t, false)
	for _, cols := range []int{80, 50, 132} {
		t.Run(fmt.Sprint(cols), func(t *testing.T) {
			t.Setenv("COLUMNS", fmt.Sprint(cols))
			out, frames := topFrames(t, "--addr", f.addr, "--user", "admin", "top", "--iterations", "2", "--interval", "20ms")
			if !strings.HasPrefix(out, ansiHideCursor+ansiClear+ansiHome) || !strings.HasSuffix(out, ansiShowCursor) {
				t.Errorf("cursor not hidden then restored: starts %q, ends %q", out[:min(20, len(out))], out[max(0, len(out)-20):])
			}
			if len(frames) != 2 {
				t.Fatalf("%d frames, want 2:\n%s", len(frames), out)
			}
			for i, fr := range frames {
				t.Logf("frame %d at %d columns:\n%s", i+1, cols, strings.Join(fr, "\n"))
				web, batch := -1, -1
				for j, l := range fr {
					if n := utf8.RuneCountInString(l); n > cols {
						t.Errorf("frame %d line %d is %d columns wide: %q", i+1, j, n, l)
					}
					switch {
					case strings.HasPrefix(l, "web "):
						web = j
					case strings.HasPrefix(l, "analy"):
						batch = j
					}
				}
				if web < 0 || batch < 0 || web > batch {
					t.Errorf("frame %d: web at line %d, analytics at line %d; want both, web (busier) first", i+1, web, batch)
				}
				if all := strings.Join(fr, "\n"); !strings.Contains(all, "capacity 25000/s  free pool 15000/s") || !strings.Contains(all, "used 16600/s (66%)") {
					t.Errorf("frame %d lacks the node header", i+1)
				}
			}
			// The second frame has a rate of held commands for web.
			for _, l := range frames[1] {
				if fs := strings.Fields(l); cols >= 80 && strings.HasPrefix(l, "web ") && fs[len(fs)-3] == "-" {
					t.Errorf("no throttled/s in the second frame: %q", l)
				}
			}
		})
	}
}

func TestCtlTopFewLines(t *testing.T) {
	t.Setenv(passwordEnv, "")
	t.Setenv("COLUMNS", "80")
	t.Setenv("LINES", "7")
	f := startFake(t, false)
	_, frames := topFrames(t, "--addr", f.addr, "top", "--iterations", "1")
	if len(frames) != 1 || len(frames[0]) != 6 || !strings.HasPrefix(frames[0][5], "... and 2 more buckets") {
		t.Fatalf("frames: %q", frames)
	}
}

func TestTopBar(t *testing.T) {
	lim := func(n uint64) throttle.Limit { return throttle.Limit(n) }
	unl := throttle.Unlimited
	cases := []struct {
		name           string
		width          int
		use            uint64
		reserved, hard throttle.Limit
		scale          uint64
		want           string
	}{
		{"marks", 18, 30, lim(35), lim(80), 100, "[#####|......:   ]"},
		{"use past reservation", 12, 70, lim(20), lim(100), 100, "[#|#####..:]"},
		{"at hard limit", 12, 100, lim(20), lim(100), 100, "[#|#######:]"},
		{"over hard limit", 12, 100, lim(10), lim(50), 100, "[|###:#####]"},
		{"unlimited hard limit", 12, 50, lim(0), unl, 100, "[#####.....]"},
		{"unlimited reservation", 12, 0, unl, unl, 100, "[..........]"},
		{"reservation equals hard limit", 12, 0, lim(50), lim(50), 100, "[....:     ]"},
		{"tiny use shows", 12, 1, lim(0), unl, 1000000, "[#.........]"},
		{"zero scale", 12, 0, lim(0), unl, 0, "[..........]"},
		{"zero scale, zero hard limit", 12, 0, lim(0), lim(0), 0, "[:         ]"},
		{"zero hard limit", 12, 0, lim(0), lim(0), 100, "[:         ]"},
		{"too narrow", 1, 5, lim(1), lim(10), 10, "[:]"},
	}
	for _, tc := range cases {
		if got := renderBar(tc.width, tc.use, tc.reserved, tc.hard, tc.scale); got != tc.want {
			t.Errorf("%s: renderBar(%d, %d, %v, %v, %d) = %q, want %q", tc.name, tc.width, tc.use, tc.reserved, tc.hard, tc.scale, got, tc.want)
		}
	}
	// Always exactly the width asked for.
	for w := 3; w < 40; w++ {
		for _, use := range []uint64{0, 1, 33, 99, 100} {
			if got := renderBar(w, use, lim(use/2), lim(100), 100); len(got) != w {
				t.Errorf("renderBar(%d, %d) = %q: %d columns", w, use, got, len(got))
			}
		}
	}
}

func TestTopHuman(t *testing.T) {
	for x, want := range map[float64]string{
		0: "0", 0.25: "0.2", 7: "7", 9999: "9999", 9999.6: "10.0k", 16600: "16.6k", 123456: "123k",
		999999: "1.00M", 1234567: "1.23M", 123456789012: "123G", 1e21: "1000E",
	} {
		if got := human(x); got != want {
			t.Errorf("human(%v) = %q, want %q", x, got, want)
		}
	}
}

// A reason sent by the server cannot drive the terminal.
func TestCtlStatusReasonSanitized(t *testing.T) {
	o := &ctlOptions{cmd: "stats"}
	msg := o.statusMessage(&mcclient.StatusError{Op: mc.OpStat, Status: mc.StatusEinval, Reason: "bad\x1b]0;owned\x07 value\r\n"})
	if strings.ContainsAny(msg, "\x1b\x07\r\n") || !strings.HasPrefix(msg, "invalid request: bad?]0;owned? value") {
		t.Fatalf("message %q", msg)
	}
}
