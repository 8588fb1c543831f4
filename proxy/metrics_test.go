package proxy

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestMetricsAfterTraffic scrapes /metrics after known traffic: every name
// of DESIGN.md section 7 is there with its type and labels, the values
// match what was sent, and the linter promtool uses finds nothing.
func TestMetricsAfterTraffic(t *testing.T) {
	// On a fake clock: bob's held commands are held on every run, however
	// fast or slow the machine (on the real clock a slow one refilled the
	// bucket as fast as bob sent).
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: "capacity = 50000", tail: tenantTail(t)}, clock)
	ft := &fakeTime{t: t, p: p, clock: clock}
	// Limits that show up as gauges.
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "bob", `{"reserved":100,"hard_limit":200}`); r.Status() != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	addr, err := p.Metrics().Serve("127.0.0.1:0", p.Ready)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Metrics().Shutdown(t.Context()) })

	// alice: 10 SETs of 10000 bytes (3 write units each: key+value =
	// 10003 bytes) and 10 GETs of them (3 read units each); bob: held
	// commands; a non-blocking rejection.
	alice := login(t, p.Addr, "alice")
	val := make([]byte, 10000)
	for i := 0; i < 10; i++ {
		if r, err := alice.Set([]byte("abc"), val); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatal(err, r)
		}
		if r, err := alice.Get([]byte("abc")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatal(err, r)
		}
	}
	bob := login(t, p.Addr, "bob")
	sent, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 60; i++ { // past the hard limit's burst (20): some are held
			if r, err := bob.Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
				sent <- fmt.Errorf("bob's set %d: %v %v", i, err, r)
				return
			}
		}
	}()
	// The clock moves only while bob is held: the first burst's worth
	// goes through with it standing, and every later set waits its turn.
	ft.stepWhileHeld(10*time.Millisecond, done)
	select {
	case err := <-sent:
		t.Fatal(err)
	default:
	}
	nb := login(t, p.Addr, "bob")
	hello(t, nb, mc.FeatureNonBlockingThrottlingMode)
	rejected := 0
	for i := 0; i < 200 && rejected == 0; i++ {
		r, err := nb.Set([]byte("k"), []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		if r.Status() == mc.StatusEWouldThrottle {
			rejected++
		}
	}
	if rejected == 0 {
		t.Fatal("no rejection for the non-blocking bob")
	}
	eventually(t, time.Minute, "the upstream prober", func() bool { ok, _ := p.Ready(); return ok })

	fams := testmc.ParseMetrics(t, testmc.Scrape(t, "http://"+addr+"/metrics"))
	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		"kvthrottle_commands_total":                    {dto.MetricType_COUNTER, []string{"bucket"}},
		"kvthrottle_units_total":                       {dto.MetricType_COUNTER, []string{"bucket", "kind"}},
		"kvthrottle_throttled_total":                   {dto.MetricType_COUNTER, []string{"bucket"}},
		"kvthrottle_rejected_total":                    {dto.MetricType_COUNTER, []string{"bucket"}},
		"kvthrottle_throttle_wait_seconds":             {dto.MetricType_HISTOGRAM, []string{"bucket"}},
		"kvthrottle_bucket_reserved_units":             {dto.MetricType_GAUGE, []string{"bucket"}},
		"kvthrottle_bucket_hard_limit_units":           {dto.MetricType_GAUGE, []string{"bucket"}},
		"kvthrottle_node_capacity_units":               {dto.MetricType_GAUGE, nil},
		"kvthrottle_connections":                       {dto.MetricType_GAUGE, []string{"bucket"}},
		"kvthrottle_upstream_up":                       {dto.MetricType_GAUGE, []string{"server"}},
		"kvthrottle_upstream_request_duration_seconds": {dto.MetricType_HISTOGRAM, []string{"server"}},
		"go_goroutines":                                {dto.MetricType_GAUGE, nil},
		"process_resident_memory_bytes":                {dto.MetricType_GAUGE, nil},
	}
	for name, w := range want {
		f := fams[name]
		if f == nil {
			t.Errorf("%s missing", name)
			continue
		}
		if f.GetType() != w.typ {
			t.Errorf("%s: type %s, want %s", name, f.GetType(), w.typ)
		}
		for _, m := range f.GetMetric() {
			var got []string
			for _, l := range m.GetLabel() {
				got = append(got, l.GetName())
			}
			if strings.Join(got, ",") != strings.Join(w.labels, ",") {
				t.Errorf("%s: labels %v, want %v", name, got, w.labels)
			}
		}
	}
	val1 := func(name string, labels ...string) float64 {
		t.Helper()
		return testmc.SeriesValue(t, fams, name, labels...)
	}
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"kvthrottle_commands_total", []string{"bucket", "alice"}, 20},
		{"kvthrottle_units_total", []string{"bucket", "alice", "kind", "write"}, 30},
		{"kvthrottle_units_total", []string{"bucket", "alice", "kind", "read"}, 30},
		{"kvthrottle_bucket_reserved_units", []string{"bucket", "bob"}, 100},
		{"kvthrottle_bucket_hard_limit_units", []string{"bucket", "bob"}, 200},
		{"kvthrottle_bucket_hard_limit_units", []string{"bucket", "alice"}, math.Inf(1)},
		{"kvthrottle_node_capacity_units", nil, 50000},
		{"kvthrottle_connections", []string{"bucket", "alice"}, 1},
		{"kvthrottle_connections", []string{"bucket", "bob"}, 2},
		{"kvthrottle_rejected_total", []string{"bucket", "bob"}, float64(rejected)},
		{"kvthrottle_upstream_up", []string{"server", p.Upstream}, 1},
	}
	for _, c := range checks {
		if got := val1(c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if held := val1("kvthrottle_throttled_total", "bucket", "bob"); held == 0 {
		t.Error("kvthrottle_throttled_total{bucket=bob} = 0, want > 0")
	} else if waits := val1("kvthrottle_throttle_wait_seconds", "bucket", "bob"); waits == 0 {
		t.Errorf("held %v commands but no wait observed", held)
	}
	if n := val1("kvthrottle_upstream_request_duration_seconds", "server", p.Upstream); n < 20 {
		t.Errorf("upstream duration samples %v, want >= 20", n)
	}
	problems, err := testutil.GatherAndLint(p.Metrics().Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
	}
	// /healthz and /readyz.
	for _, path := range []string{"/healthz", "/readyz"} {
		r, err := http.Get("http://" + addr + path)
		if err != nil || r.StatusCode != 200 {
			t.Errorf("%s: %v %v", path, err, r)
		}
		if r != nil {
			r.Body.Close()
		}
	}
}

// TestThrottleStatGroup checks the STAT throttle group against its
// contract (the strict parser ctl uses) and per-tenant visibility.
func TestThrottleStatGroup(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{throttle: "capacity = 9000", tail: tenantTail(t)})
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "alice", `{"reserved":1000,"hard_limit":4000}`); r.Status() != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	alice := login(t, p.Addr, "alice")
	for i := 0; i < 5; i++ {
		if _, err := alice.Set([]byte(fmt.Sprint(i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	parse := func(c *mcclient.Client) mcclient.ThrottleStats {
		t.Helper()
		kv, err := c.Stats("throttle")
		if err != nil {
			t.Fatal(err)
		}
		st, err := mcclient.ParseThrottleStats(kv)
		if err != nil {
			t.Fatalf("STAT throttle breaks its contract: %v", err)
		}
		return st
	}
	all := parse(admin)
	if len(all.Buckets) != 3 || all.Node.Capacity != 9000 || all.Node.FreePool != 8000 {
		t.Fatalf("admin view: %+v", all)
	}
	a, ok := all.Bucket("alice")
	if !ok || a.Reserved != 1000 || a.HardLimit != 4000 || a.CommandsTotal != 5 || a.WriteUnitsTotal != 5 || a.Connections != 1 {
		t.Fatalf("alice as the admin sees it: %+v", a)
	}
	own := parse(alice)
	if len(own.Buckets) != 1 || own.Buckets[0].Name != "alice" {
		t.Fatalf("alice sees %d buckets: %+v", len(own.Buckets), own.Buckets)
	}
	bob := parse(login(t, p.Addr, "bob"))
	if len(bob.Buckets) != 1 || bob.Buckets[0].Name != "bob" {
		t.Fatalf("bob sees %+v", bob.Buckets)
	}
}
