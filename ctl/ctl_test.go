package ctl

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

func TestCtlSetNode(t *testing.T) {
	f := startFake(t, false)
	body := `{"capacity": 30000, "default_throttle_reserved_units": 0, "default_throttle_hard_limit": "unlimited"}`
	var out bytes.Buffer
	if err := SetNode(opts(f.addr, "admin", fakeAdminPW), []byte(body), &out); err != nil || out.String() != "ok\n" {
		t.Fatalf("error %v, output %q", err, out.String())
	}
	reqs := f.adminRequests()
	if len(reqs) != 1 || reqs[0] != (fakeRequest{mc.OpSetNodeThrottleProperties, "", body}) {
		t.Fatalf("server got %+v", reqs)
	}
}

func TestCtlSetBucket(t *testing.T) {
	f := startFake(t, false)
	var out bytes.Buffer
	if err := SetBucket(opts(f.addr, "admin", fakeAdminPW), "web", []byte(`{"reserved": 100}`), &out); err != nil ||
		out.String() != "ok\n{\"reserved\":100,\"hard_limit\":\"unlimited\"}\n" {
		t.Fatalf("error %v, output %q", err, out.String())
	}
	reqs := f.adminRequests()
	want := []fakeRequest{{mc.OpSetBucketThrottleProperties, "web", `{"reserved": 100}`}}
	if fmt.Sprint(reqs) != fmt.Sprint(want) {
		t.Fatalf("server got %+v, want %+v", reqs, want)
	}
}

func TestReadPassword(t *testing.T) {
	// No user: no password needed.
	t.Setenv(PasswordEnv, "")
	if pw, err := ReadPassword("", ""); pw != "" || err != nil {
		t.Fatalf("no user: %q, %v", pw, err)
	}
	// From the environment.
	t.Setenv(PasswordEnv, fakeViewerPW)
	if pw, err := ReadPassword("viewer", ""); pw != fakeViewerPW || err != nil {
		t.Fatalf("env password: %q, %v", pw, err)
	}
	// The file wins over the environment.
	t.Setenv(PasswordEnv, "wrong")
	if pw, err := ReadPassword("admin", passwordFile(t, fakeAdminPW)); pw != fakeAdminPW || err != nil {
		t.Fatalf("file password: %q, %v", pw, err)
	}
	// CRLF line end and a second line are not part of the password.
	p := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(p, []byte(fakeAdminPW+"\r\nnot this\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pw, err := ReadPassword("admin", p); pw != fakeAdminPW || err != nil {
		t.Fatalf("CRLF password file: %q, %v", pw, err)
	}
	// No password at all.
	t.Setenv(PasswordEnv, "")
	if _, err := ReadPassword("admin", ""); err == nil || !strings.Contains(err.Error(), "--user admin needs a password") {
		t.Fatalf("no password: %v", err)
	}
	// Unreadable and empty files.
	if _, err := ReadPassword("admin", filepath.Join(t.TempDir(), "missing")); err == nil || !strings.Contains(err.Error(), "cannot read the password file") {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := ReadPassword("admin", passwordFile(t, "")); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Fatalf("empty file: %v", err)
	}
}

// op is one ctl operation with its arguments bound.
type op func(o Options, w io.Writer) error

func stats(group string) op {
	return func(o Options, w io.Writer) error { return Stats(o, group, w) }
}

func setNode(body string) op {
	return func(o Options, w io.Writer) error { return SetNode(o, []byte(body), w) }
}

func setBucket(bucket, body string) op {
	return func(o Options, w io.Writer) error { return SetBucket(o, bucket, []byte(body), w) }
}

func top(o Options, w io.Writer) error {
	return Top(context.Background(), o, TopOptions{Iterations: 1}, w)
}

func TestCtlErrors(t *testing.T) {
	f := startFake(t, false)
	plain := startFake(t, true)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	asAdmin := opts(f.addr, "admin", fakeAdminPW)
	asViewer := opts(f.addr, "viewer", fakeViewerPW)
	cases := []struct {
		name string
		o    Options
		op   op
		want string // the start of the error's text
	}{
		{"bad password", opts(f.addr, "admin", "guess"), stats(""),
			"authentication failed for user admin"},
		{"unknown user", opts(f.addr, "mallory", "guess"), setNode("{}"),
			"authentication failed for user mallory"},
		{"set-bucket non-admin", asViewer, setBucket("web", `{"reserved":1}`),
			"permission denied: user viewer lacks the admin privilege"},
		{"set-node non-admin", asViewer, setNode(`{"capacity":1}`),
			"permission denied: user viewer lacks the admin privilege"},
		{"set-node anonymous", opts(f.addr, "", ""), setNode(`{"capacity":1}`),
			"permission denied: set-node needs a user with the admin privilege (give --user U)"},
		{"stats access", asViewer, stats("secret"),
			"access denied: stats group secret needs the admin privilege"},
		{"einval node", asAdmin, setNode(`{"capacity":"bad"}`),
			`invalid request: reserved: must be a non-negative integer or "unlimited", got "bad"`},
		{"einval bucket", asAdmin, setBucket("web", `{"reserved":"bad"}`),
			`invalid request: reserved: must be a non-negative integer or "unlimited", got "bad"`},
		{"unknown bucket", asAdmin, setBucket("nope", `{"reserved":1}`),
			"unknown bucket nope"},
		{"unknown stats group", asAdmin, stats("nosuch"),
			"unknown stats group nosuch"},
		{"tmpfail", asAdmin, setBucket("busy", `{"reserved":1}`),
			"proxy temporarily unavailable: cannot write the state file: disk full"},
		{"not a proxy", opts(plain.addr, "", ""), setNode(`{"capacity":1}`),
			"the server does not support this command (is it a kvthrottle proxy?)"},
		{"not a proxy, sasl", opts(plain.addr, "admin", fakeAdminPW), stats(""),
			"the server does not support this command (is it a kvthrottle proxy?)"},
		{"not a proxy, top", opts(plain.addr, "", ""), top,
			"the server does not support this command (is it a kvthrottle proxy?)"},
		{"connection refused", opts(closedAddr, "", ""), stats(""),
			"cannot connect to " + closedAddr + ": "},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := tc.op(tc.o, &out)
			if err == nil || out.Len() != 0 {
				t.Fatalf("error %v, output %q; want an error and nothing", err, out.String())
			}
			if msg := err.Error(); !strings.HasPrefix(msg, tc.want) || strings.Contains(msg, "\n") {
				t.Errorf("error %q, want one line starting with %q", msg, tc.want)
			}
			for _, pw := range []string{fakeAdminPW, fakeViewerPW, "guess"} {
				if strings.Contains(err.Error(), pw) {
					t.Errorf("the error shows a password: %q", err)
				}
			}
		})
	}
}

func TestCtlStats(t *testing.T) {
	f := startFake(t, false)
	var out bytes.Buffer
	err := Stats(opts(f.addr, "", ""), "", &out)
	want := "" +
		"pid              4242\n" +
		"uptime           17\n" +
		"version          1.6.21-fake\n" +
		"curr_connections 3\n"
	if err != nil || out.String() != want {
		t.Fatalf("error %v, output:\n%s\nwant:\n%s", err, out.String(), want)
	}
}

func TestCtlStatsThrottle(t *testing.T) {
	f := startFake(t, false)
	var out bytes.Buffer
	err := Stats(opts(f.addr, "viewer", fakeViewerPW), "throttle", &out)
	want := "" +
		"node capacity:  25000 units/s\n" +
		"node free pool: 15000 units/s (fcfs)\n" +
		"\n" +
		"BUCKET                   RESERVED  HARD_LIMIT  WEIGHT  UNITS/S         UNITS          READ   WRITE  COMMANDS  THROTTLED  REJECTED  HELD  CONNS\n" +
		"analytics-batch-nightly         0   unlimited       1     2100  123456789012  123456000000  789012  98765432          0         0     0     12\n" +
		"web                         10000       20000     250    14500       5400000       5000000  400000   5300000       1050         7     3    250\n"
	if err != nil || out.String() != want {
		t.Fatalf("error %v, output:\n%s\nwant:\n%s", err, out.String(), want)
	}
}

func TestCtlParseThrottleStats(t *testing.T) {
	ts, err := mcclient.ParseThrottleStats(append(fakeThrottleStats(1), [2]string{"bucket:web:future_field", "x"}, [2]string{"other:key", "y"}))
	if err != nil {
		t.Fatal(err)
	}
	if ts.Node.Capacity != 25000 || ts.Node.FreePool != 15000 || ts.Node.FreePoolMode != "fcfs" || len(ts.Buckets) != 2 {
		t.Fatalf("%+v", ts)
	}
	web, ok := ts.Bucket("web")
	want := mcclient.BucketStats{Name: "web", Reserved: 10000, HardLimit: 20000, Weight: 250, HasWeight: true,
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
		"zero weight":      withValue(fakeThrottleStats(1), "bucket:web:weight", "0"),
		"unlimited weight": withValue(fakeThrottleStats(1), "bucket:web:weight", "unlimited"),
		"empty pool mode":  withValue(fakeThrottleStats(1), "node:free_pool_mode", ""),
	} {
		if _, err := mcclient.ParseThrottleStats(kv); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// A proxy that predates weights and free pool modes: the answer parses,
// without them.
func TestCtlParseThrottleStatsWithoutWeights(t *testing.T) {
	var kv [][2]string
	for _, p := range fakeThrottleStats(1) {
		if p[0] != "node:free_pool_mode" && !strings.HasSuffix(p[0], ":weight") {
			kv = append(kv, p)
		}
	}
	ts, err := mcclient.ParseThrottleStats(kv)
	if err != nil {
		t.Fatal(err)
	}
	if web, _ := ts.Bucket("web"); ts.Node.FreePoolMode != "" || web.HasWeight || web.Weight != 0 || formatThrottleTable(ts) == "" {
		t.Fatalf("%+v", ts)
	}
	if out := formatThrottleTable(ts); !strings.Contains(out, "node free pool: 15000 units/s\n") || !strings.Contains(out, "   unlimited       -     2100") {
		t.Fatalf("table:\n%s", out)
	}
}

// withValue returns kv with the value of key replaced.
func withValue(kv [][2]string, key, val string) [][2]string {
	out := append([][2]string(nil), kv...)
	for i := range out {
		if out[i][0] == key {
			out[i][1] = val
		}
	}
	return out
}

// A reason sent by the server cannot drive the terminal.
func TestCtlStatusReasonSanitized(t *testing.T) {
	msg := Options{}.statusMessage(request{cmd: "stats"}, &mcclient.StatusError{Op: mc.OpStat, Status: mc.StatusEinval, Reason: "bad\x1b]0;owned\x07 value\r\n"})
	if strings.ContainsAny(msg, "\x1b\x07\r\n") || !strings.HasPrefix(msg, "invalid request: bad?]0;owned? value") {
		t.Fatalf("message %q", msg)
	}
}

func TestCtlStatsThrottleFleet(t *testing.T) {
	f := startFleetFake(t)
	var out bytes.Buffer
	err := Stats(opts(f.addr, "viewer", fakeViewerPW), "throttle", &out)
	want := "" +
		"node capacity:  25000 units/s\n" +
		"node free pool: 15000 units/s (fcfs)\n" +
		"fleet:          3 instances, store up\n" +
		"this instance:  proxy-a:11211, capacity 18000 units/s, free pool 10000 units/s\n" +
		"\n" +
		"BUCKET                   RESERVED  HARD_LIMIT  LOCAL_RES  LOCAL_HARD  WEIGHT  UNITS/S  FLEET/S         UNITS          READ   WRITE  COMMANDS  THROTTLED  REJECTED  HELD  CONNS\n" +
		"analytics-batch-nightly         0   unlimited          0   unlimited       1     2100        -  123456789012  123456000000  789012  98765432          0         0     0     12\n" +
		"web                         10000       20000       6000       15000     250    14500    19800       5400000       5000000  400000   5300000       1050         7     3    250\n"
	if err != nil || out.String() != want {
		t.Fatalf("error %v, output:\n%s\nwant:\n%s", err, out.String(), want)
	}
}

func TestFleetStatus(t *testing.T) {
	for _, tc := range []struct {
		fl   mcclient.FleetStats
		want string
	}{
		{mcclient.FleetStats{Instances: 3, StoreUp: true}, "3 instances, store up"},
		{mcclient.FleetStats{Instances: 1, StoreUp: true}, "1 instance, store up"},
		{mcclient.FleetStats{Instances: 2}, "2 instances, store DOWN"},
		{mcclient.FleetStats{Instances: 2, Fallback: true}, "2 instances, store DOWN, fallback (on_store_loss)"},
	} {
		if got := fleetStatus(&tc.fl); got != tc.want {
			t.Errorf("fleetStatus(%+v) = %q, want %q", tc.fl, got, tc.want)
		}
	}
}
