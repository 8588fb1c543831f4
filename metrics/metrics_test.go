package metrics

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// fakeSource is a Source whose state the tests set directly.
type fakeSource struct {
	mu        sync.Mutex
	buckets   []BucketSnapshot
	upstreams []UpstreamSnapshot
	auth      []AuthCount
	capacity  float64
	pool      float64
}

func (f *fakeSource) AppendBuckets(dst []BucketSnapshot) []BucketSnapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(dst, f.buckets...)
}

func (f *fakeSource) AppendUpstreams(dst []UpstreamSnapshot) []UpstreamSnapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(dst, f.upstreams...)
}

func (f *fakeSource) AppendAuth(dst []AuthCount) []AuthCount {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append(dst, f.auth...)
}

func (f *fakeSource) NodeCapacity() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.capacity
}

func (f *fakeSource) FreePool() float64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pool
}

func newFake() *fakeSource {
	return &fakeSource{
		buckets: []BucketSnapshot{
			{Name: "alpha", Reserved: 1000, HardLimit: 5000, Weight: 3, Commands: 42, ReadUnits: 30, WriteUnits: 17,
				Throttled: 5, Rejected: 2, Connections: 3},
			{Name: "beta.b-2%", Reserved: 0, HardLimit: math.Inf(1), Commands: 1 << 40, ReadUnits: 7,
				WriteUnits: 0, Throttled: 0, Rejected: 0, Connections: 0},
		},
		upstreams: []UpstreamSnapshot{{Server: "127.0.0.1:11211", Up: true}, {Server: "10.0.0.2:11211", Up: false}},
		auth:      []AuthCount{{Mechanism: "PLAIN", Result: "success", Count: 3}, {Mechanism: "PLAIN", Result: "refused", Count: 1}},
		capacity:  25000,
		pool:      24000,
	}
}

// wantFamily describes one metric family of the contract.
type wantFamily struct {
	typ    dto.MetricType
	labels []string // sorted label names, without le
}

var contract = map[string]wantFamily{
	NameCommands:        {dto.MetricType_COUNTER, []string{"bucket"}},
	NameUnits:           {dto.MetricType_COUNTER, []string{"bucket", "kind"}},
	NameThrottled:       {dto.MetricType_COUNTER, []string{"bucket"}},
	NameRejected:        {dto.MetricType_COUNTER, []string{"bucket"}},
	NameThrottleWait:    {dto.MetricType_HISTOGRAM, []string{"bucket"}},
	NameReserved:        {dto.MetricType_GAUGE, []string{"bucket"}},
	NameHardLimit:       {dto.MetricType_GAUGE, []string{"bucket"}},
	NameWeight:          {dto.MetricType_GAUGE, []string{"bucket"}},
	NameNodeCapacity:    {dto.MetricType_GAUGE, nil},
	NameFreePool:        {dto.MetricType_GAUGE, nil},
	NameConnections:     {dto.MetricType_GAUGE, []string{"bucket"}},
	NameUpstreamUp:      {dto.MetricType_GAUGE, []string{"server"}},
	NameUpstreamEjected: {dto.MetricType_GAUGE, []string{"server"}},
	NameUpstreamLatency: {dto.MetricType_HISTOGRAM, []string{"server"}},
	NameAuth:            {dto.MetricType_COUNTER, []string{"mechanism", "result"}},
	// a sample of the runtime collectors
	"go_goroutines":                 {dto.MetricType_GAUGE, nil},
	"go_gc_duration_seconds":        {dto.MetricType_SUMMARY, nil},
	"process_cpu_seconds_total":     {dto.MetricType_COUNTER, nil},
	"process_resident_memory_bytes": {dto.MetricType_GAUGE, nil},
}

func TestScrapeContract(t *testing.T) {
	src := newFake()
	m := New(src)
	m.WaitObserver("alpha").Observe(0.003)
	m.WaitObserver("alpha").Observe(0.2)
	m.UpstreamLoopObserver("127.0.0.1:11211", 0).Observe(0.0002)
	ts := httptest.NewServer(m.Handler(nil))
	defer ts.Close()

	text := testmc.Scrape(t, ts.URL+"/metrics")
	mfs := testmc.ParseMetrics(t, text)

	for name, want := range contract {
		mf := mfs[name]
		if mf == nil {
			t.Errorf("%s: missing from scrape", name)
			continue
		}
		if mf.GetType() != want.typ {
			t.Errorf("%s: type %v, want %v", name, mf.GetType(), want.typ)
		}
		if !strings.Contains(mf.GetHelp(), " ") {
			t.Errorf("%s: no real HELP text: %q", name, mf.GetHelp())
		}
		if help := mf.GetHelp(); strings.HasPrefix(name, "kvthrottle_") && !strings.Contains(help, "seconds") &&
			!strings.Contains(help, "units per second") && !strings.Contains(help, "count of") &&
			!strings.Contains(help, "boolean") && !strings.Contains(help, "no unit") {
			t.Errorf("%s: HELP does not state the unit: %q", name, help)
		}
		for _, m := range mf.GetMetric() {
			var got []string
			for _, lp := range m.GetLabel() {
				got = append(got, lp.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, want.labels) {
				t.Errorf("%s: label names %v, want %v", name, got, want.labels)
			}
		}
	}
	for name := range mfs {
		if strings.HasPrefix(name, "kvthrottle_") {
			if _, ok := contract[name]; !ok {
				t.Errorf("%s: exported but not in the test's contract table", name)
			}
		}
	}

	for _, b := range src.buckets {
		eq := func(name string, want float64, extra ...string) {
			t.Helper()
			if got := testmc.SeriesValue(t, mfs, name, append([]string{"bucket", b.Name}, extra...)...); got != want {
				t.Errorf("%s{bucket=%q %v} = %v, want %v", name, b.Name, extra, got, want)
			}
		}
		eq(NameCommands, float64(b.Commands))
		eq(NameUnits, float64(b.ReadUnits), "kind", "read")
		eq(NameUnits, float64(b.WriteUnits), "kind", "write")
		eq(NameThrottled, float64(b.Throttled))
		eq(NameRejected, float64(b.Rejected))
		eq(NameReserved, b.Reserved)
		eq(NameHardLimit, b.HardLimit)
		eq(NameWeight, float64(max(b.Weight, 1))) // beta's 0: the default, 1
		eq(NameConnections, float64(b.Connections))
	}
	if got := testmc.SeriesValue(t, mfs, NameNodeCapacity); got != 25000 {
		t.Errorf("capacity %v", got)
	}
	if got := testmc.SeriesValue(t, mfs, NameFreePool); got != 24000 {
		t.Errorf("free pool %v", got)
	}
	if got := testmc.SeriesValue(t, mfs, NameUpstreamUp, "server", "127.0.0.1:11211"); got != 1 {
		t.Errorf("upstream up %v, want 1", got)
	}
	if got := testmc.SeriesValue(t, mfs, NameUpstreamUp, "server", "10.0.0.2:11211"); got != 0 {
		t.Errorf("upstream down %v, want 0", got)
	}
	if got := testmc.SeriesValue(t, mfs, NameThrottleWait, "bucket", "alpha"); got != 2 {
		t.Errorf("wait histogram count %v, want 2", got)
	}
	if got := testmc.SeriesValue(t, mfs, NameUpstreamLatency, "server", "127.0.0.1:11211"); got != 1 {
		t.Errorf("upstream histogram count %v, want 1", got)
	}
	if !strings.Contains(text, `kvthrottle_bucket_hard_limit_units{bucket="beta.b-2%"} +Inf`) {
		t.Errorf("unlimited hard limit not exported as +Inf:\n%s", grep(text, NameHardLimit))
	}

	// Wait-time buckets cover 100us..10s, upstream ones 50us..2s (the
	// parser adds the implicit +Inf bucket).
	bounds := func(name string) (lo, hi float64) {
		h := mfs[name].GetMetric()[0].GetHistogram().GetBucket()
		if math.IsInf(h[len(h)-1].GetUpperBound(), 1) {
			h = h[:len(h)-1]
		}
		return h[0].GetUpperBound(), h[len(h)-1].GetUpperBound()
	}
	if lo, hi := bounds(NameThrottleWait); lo != 0.0001 || hi != 10 {
		t.Errorf("wait buckets %v..%v", lo, hi)
	}
	if lo, hi := bounds(NameUpstreamLatency); lo != 0.00005 || hi != 2 {
		t.Errorf("upstream buckets %v..%v", lo, hi)
	}

	// The collector reads the source at every scrape: changes show at once,
	// removed buckets disappear.
	src.mu.Lock()
	src.buckets = src.buckets[:1]
	src.buckets[0].Commands++
	src.upstreams[1].Up = true
	src.capacity = math.Inf(1)
	src.mu.Unlock()
	mfs = testmc.ParseMetrics(t, testmc.Scrape(t, ts.URL+"/metrics"))
	if got := testmc.SeriesValue(t, mfs, NameCommands, "bucket", "alpha"); got != 43 {
		t.Errorf("commands after change %v, want 43", got)
	}
	if n := len(mfs[NameCommands].GetMetric()); n != 1 {
		t.Errorf("%d commands series after removing a bucket, want 1", n)
	}
	if got := testmc.SeriesValue(t, mfs, NameUpstreamUp, "server", "10.0.0.2:11211"); got != 1 {
		t.Errorf("upstream up after change %v", got)
	}
	if got := testmc.SeriesValue(t, mfs, NameNodeCapacity); !math.IsInf(got, 1) {
		t.Errorf("unlimited capacity %v, want +Inf", got)
	}
}

func grep(text, prefix string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestUnlimitedNormalisation(t *testing.T) {
	src := &fakeSource{
		buckets:  []BucketSnapshot{{Name: "u", Reserved: -1, HardLimit: math.NaN()}},
		capacity: -1,
		pool:     math.Inf(-1),
	}
	mfs, err := New(src).Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf
	}
	for _, c := range []struct {
		name   string
		labels []string
	}{
		{NameReserved, []string{"bucket", "u"}},
		{NameHardLimit, []string{"bucket", "u"}},
		{NameNodeCapacity, nil},
		{NameFreePool, nil},
	} {
		if got := testmc.SeriesValue(t, byName, c.name, c.labels...); !math.IsInf(got, 1) {
			t.Errorf("%s = %v, want +Inf", c.name, got)
		}
	}
}

func TestLint(t *testing.T) {
	m := New(newFake())
	m.WaitObserver("alpha").Observe(0.01)
	m.UpstreamLoopObserver("127.0.0.1:11211", 0).Observe(0.001)
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("registry lint: %s: %s", p.Metric, p.Text)
	}
	problems, err = testutil.CollectAndLint(newSourceCollector(newFake()))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("collector lint: %s: %s", p.Metric, p.Text)
	}
	problems, err = testutil.CollectAndLint(m.wait)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("wait histogram lint: %s: %s", p.Metric, p.Text)
	}
}

// TestScrapeLints runs the linter of `promtool check metrics` (promlint) on
// a real scrape of the handler: what a Prometheus server reads, not only
// what the collectors describe (TestLint). It replaced a run of promtool
// itself, which make test never installed, so it always skipped.
func TestScrapeLints(t *testing.T) {
	m := New(newFake())
	m.WaitObserver("alpha").Observe(0.01)
	m.UpstreamLoopObserver("127.0.0.1:11211", 0).Observe(0.001)
	ts := httptest.NewServer(m.Handler(nil))
	defer ts.Close()
	text := testmc.Scrape(t, ts.URL+"/metrics")
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		t.Fatalf("the scrape does not parse: %v\n%s", err, text)
	}
	for _, p := range problems {
		t.Errorf("scrape lint: %s: %s", p.Metric, p.Text)
	}
	for _, name := range []string{"kvthrottle_throttle_wait_seconds", "kvthrottle_upstream"} {
		if !strings.Contains(text, name) {
			t.Errorf("the scrape has no %s metric", name)
		}
	}
}

func TestHealthAndReady(t *testing.T) {
	var mu sync.Mutex
	ok, reason := false, "upstream 127.0.0.1:11211 down\nsince boot"
	ready := func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		return ok, reason
	}
	m := New(newFake())
	ts := httptest.NewServer(m.Handler(ready))
	defer ts.Close()

	if code, body, h := testmc.Get(t, ts.URL+"/healthz"); code != 200 || body != "ok\n" ||
		!strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
		t.Errorf("/healthz: %d %q %v", code, body, h)
	}
	if code, body, _ := testmc.Get(t, ts.URL+"/readyz"); code != 503 || body != "upstream 127.0.0.1:11211 down since boot\n" {
		t.Errorf("/readyz not ready: %d %q", code, body)
	}
	mu.Lock()
	reason = ""
	mu.Unlock()
	if code, body, _ := testmc.Get(t, ts.URL+"/readyz"); code != 503 || body != "not ready\n" {
		t.Errorf("/readyz not ready, no reason: %d %q", code, body)
	}
	mu.Lock()
	ok = true
	mu.Unlock()
	if code, body, _ := testmc.Get(t, ts.URL+"/readyz"); code != 200 || body != "ok\n" {
		t.Errorf("/readyz ready: %d %q", code, body)
	}
	// healthz does not depend on readiness
	mu.Lock()
	ok = false
	mu.Unlock()
	if code, _, _ := testmc.Get(t, ts.URL+"/healthz"); code != 200 {
		t.Errorf("/healthz while not ready: %d", code)
	}
	if code, _, _ := testmc.Get(t, ts.URL+"/nope"); code != 404 {
		t.Errorf("/nope: %d, want 404", code)
	}
	if code, body, _ := testmc.Get(t, ts.URL+"/"); code != 200 || !strings.Contains(body, "/metrics") {
		t.Errorf("/: %d %q", code, body)
	}
	resp, err := http.Post(ts.URL+"/healthz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /healthz: %d, want 405", resp.StatusCode)
	}

	// nil ready: always ready
	ts2 := httptest.NewServer(m.Handler(nil))
	defer ts2.Close()
	if code, body, _ := testmc.Get(t, ts2.URL+"/readyz"); code != 200 || body != "ok\n" {
		t.Errorf("/readyz with nil ready: %d %q", code, body)
	}
}

// waitGoroutines polls until at most n goroutines run or the deadline passes.
func waitGoroutines(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := runtime.NumGoroutine()
		if got <= n {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("%d goroutines after Shutdown, want <= %d:\n%s", got, n, buf)
		}
		runtime.Gosched()
		time.Sleep(time.Millisecond) // poll interval, bounded by the deadline above
	}
}

func TestServeShutdownNoLeak(t *testing.T) {
	m := New(newFake())
	before := runtime.NumGoroutine()

	addr, err := m.Serve("127.0.0.1:0", func() (bool, string) { return true, "" })
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasSuffix(addr, ":0") {
		t.Fatalf("bound address %q has no real port", addr)
	}
	if _, err := m.Serve("127.0.0.1:0", nil); err == nil {
		t.Error("second Serve before Shutdown succeeded")
	}

	tr := &http.Transport{}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		resp, err := client.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s: %s", path, resp.Status)
		}
	}
	// Leave a keep-alive connection open on purpose: Shutdown must close it.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	tr.CloseIdleConnections()
	waitGoroutines(t, before)

	if _, err := client.Get("http://" + addr + "/healthz"); err == nil {
		t.Error("server still answers after Shutdown")
	}
	tr.CloseIdleConnections()
	if err := m.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}

	// Serve works again after Shutdown.
	addr2, err := m.Serve("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, _ := testmc.Get(t, "http://"+addr2+"/healthz"); code != 200 {
		t.Errorf("healthz after restart: %d", code)
	}
	if err := m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	waitGoroutines(t, before)
}

func TestServeListenError(t *testing.T) {
	m := New(nil)
	addr, err := m.Serve("127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Shutdown(context.Background())
	if _, err := New(nil).Serve(addr, nil); err == nil {
		t.Errorf("Serve on busy address %s succeeded", addr)
	}
	if _, err := New(nil).Serve("not-an-address", nil); err == nil {
		t.Error("Serve on a bad address succeeded")
	}
}

func TestShutdownDeadline(t *testing.T) {
	block := make(chan struct{})
	entered := make(chan struct{})
	m := New(nil)
	addr, err := m.Serve("127.0.0.1:0", func() (bool, string) {
		close(entered)
		<-block
		return true, ""
	})
	if err != nil {
		t.Fatal(err)
	}
	defer close(block)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	go func() {
		resp, err := (&http.Client{Transport: tr}).Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := m.Shutdown(ctx); err != context.DeadlineExceeded {
		t.Errorf("Shutdown with a stuck request: %v, want DeadlineExceeded", err)
	}
}

func TestObservers(t *testing.T) {
	m := New(nil)
	w := m.WaitObserver("alpha")
	u := m.UpstreamLoopObserver("127.0.0.1:11211", 0)
	if n := testing.AllocsPerRun(1000, func() { w.Observe(0.001); u.Observe(0.0001) }); n != 0 {
		t.Errorf("Observe allocates %v times per call", n)
	}
	if n := testutil.CollectAndCount(m.wait); n != 1 {
		t.Fatalf("%d wait series, want 1", n)
	}
	m.ForgetBucket("alpha")
	m.ForgetBucket("never-seen")
	if n := testutil.CollectAndCount(m.wait); n != 0 {
		t.Errorf("%d wait series after ForgetBucket, want 0", n)
	}
	m.ForgetUpstream("127.0.0.1:11211")
	if n := testutil.CollectAndCount(m.upstream); n != 0 {
		t.Errorf("%d upstream series after ForgetUpstream, want 0", n)
	}
	// Invalid UTF-8 must not panic.
	m.WaitObserver("\xff").Observe(1)
	m.UpstreamLoopObserver("\xff", 0).Observe(1)
}

// TestConcurrentScrapes runs scrapes, observations and source changes at once
// (meaningful under -race).
func TestConcurrentScrapes(t *testing.T) {
	src := newFake()
	m := New(src)
	ts := httptest.NewServer(m.Handler(nil))
	defer ts.Close()
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				if _, err := m.Registry().Gather(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 100; i++ {
			name := fmt.Sprintf("b%d", i%5)
			m.WaitObserver(name).Observe(float64(i) / 1000)
			if i%7 == 0 {
				m.ForgetBucket(name)
			}
			src.mu.Lock()
			src.buckets[0].Commands++
			src.mu.Unlock()
		}
	}()
	for i := 0; i < 5; i++ {
		testmc.ParseMetrics(t, testmc.Scrape(t, ts.URL+"/metrics"))
	}
	wg.Wait()
}

// TestDuplicateBucketKeepsServing: a source bug (two buckets of one name) must
// not take /metrics down; it is counted in promhttp_metric_handler_errors_total.
func TestDuplicateBucketKeepsServing(t *testing.T) {
	src := newFake()
	src.buckets = append(src.buckets, src.buckets[0])
	m := New(src)
	ts := httptest.NewServer(m.Handler(nil))
	defer ts.Close()
	testmc.ParseMetrics(t, testmc.Scrape(t, ts.URL+"/metrics"))
	mfs := testmc.ParseMetrics(t, testmc.Scrape(t, ts.URL+"/metrics"))
	if got := testmc.SeriesValue(t, mfs, "promhttp_metric_handler_errors_total", "cause", "gathering"); got < 1 {
		t.Errorf("gathering errors %v, want >= 1", got)
	}
	if got := testmc.SeriesValue(t, mfs, NameNodeCapacity); got != 25000 {
		t.Errorf("capacity %v in a partial scrape", got)
	}
}
