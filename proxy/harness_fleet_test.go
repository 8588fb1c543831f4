package proxy

// Test helpers of fleet mode: a fleet of proxies sharing a Redis
// (fleetTest, newFleetTest), its admin, users and statistics; and the
// fake-clock driver of the fleet tests: three proxies whose engines read
// one fake clock, each with a fake fleet clock of its own, and closed loop
// clients started and stopped one at a time.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
	dto "github.com/prometheus/client_model/go"
)

// fleetStep is how far the fleet tests move the fake clock at a time: a
// fifth of the fleet's tick at a 500 ms period (a sample every 25 ms), and
// far below the engine's burst (100 ms), so that a held command woken up
// to a step late loses its bucket no rate.
const fleetStep = 5 * time.Millisecond

// fleetFake is the fake time of a fleetTest (newFakeFleetTest): the
// engines' clock, shared by every instance, and each instance's fleet
// clock (Options.FleetClock), moved to the engines' reading one instance
// after another once the event loops have done all that reading allows.
// So at each reading the loops admit first, then instance 0's fleet
// samples, syncs and applies its grants, its loop admits what they allow,
// then instance 1, and so on: the same order on every run. The store's
// time is the fleet clocks' reading.
type fleetFake struct {
	clock   *throttle.FakeClock
	fclocks []*throttle.FakeClock
	conns   [][]*fleetConn // per instance, in the order started
	// onStep, when set, is called after every step with the clock
	// standing still and everything settled.
	onStep func()
	// trace, when set (KVTHROTTLE_FLEET_TRACE names a file), gets a line
	// per step: the reading and, per instance and bucket, the units so
	// far and the hard limit enforced. Runs that differ differ there
	// first: diff two.
	trace io.Writer
}

// newFakeFleetTest is newFleetTest on fake clocks.
func newFakeFleetTest(t *testing.T, tail, period string) *fleetTest {
	f := newFleetTest(t, tail, period)
	f.fakeTime()
	return f
}

// fakeTime puts f on fake clocks (fleetFake), before its first instance
// starts.
func (f *fleetTest) fakeTime() {
	t := f.t
	f.fake = &fleetFake{clock: throttle.NewFakeClock(time.Hour)}
	if name := os.Getenv("KVTHROTTLE_FLEET_TRACE"); name != "" {
		fh, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fh.Close() })
		f.fake.trace = fh
	}
}

// traceStep writes the trace line of the reading now.
func (f *fleetTest) traceStep(now time.Duration) {
	fmt.Fprint(f.fake.trace, now)
	for i, p := range f.insts {
		if p == nil {
			continue
		}
		fmt.Fprintf(f.fake.trace, " | %d:", i)
		for _, bc := range p.ten.Load().cfg.Buckets {
			b := p.Engine().Bucket(bc.Name)
			_, h := b.Limits()
			fmt.Fprintf(f.fake.trace, " %s %d %v", bc.Name, b.Stats().Units, h)
		}
	}
	fmt.Fprintln(f.fake.trace)
}

// fakeClocks gives instance i its clocks in tc (fake time only).
func (f *fleetTest) fakeClocks(i int, tc *testConfig) {
	ff := f.fake
	if ff == nil {
		return
	}
	for len(ff.fclocks) <= i {
		ff.fclocks = append(ff.fclocks, nil)
		ff.conns = append(ff.conns, nil)
	}
	ff.fclocks[i] = throttle.NewFakeClock(ff.clock.Now())
	tc.clock, tc.fleetClock = ff.clock, ff.fclocks[i]
}

// settleInst waits until instance i is settled (settled) with each of its
// clients' connections held.
func (f *fleetTest) settleInst(i int) {
	f.t.Helper()
	p, want := f.insts[i], len(f.fake.conns[i])
	deadline := time.Now().Add(30 * time.Second)
	var poll backoff
	for {
		n, why := unsettled(f.t, p)
		if why == "" && n == want {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("at %v instance %d did not settle with %d connections held (%d held; %s)", f.fake.clock.Now(), i, want, n, why)
		}
		poll.wait()
	}
}

// fleetTickPatience bounds the real time one fleet tick may take under
// fake clocks: a liveness bound, not a figure (the fake clock stands
// meanwhile). A tick makes a few store calls in turn, each bounded by
// fakeFleetCallTimeout; a call can wait out its timeout on a loaded
// machine, as one did once during a demotion (TestFleetDemotedPrimary
// beside the other race passes: over 30 s), so the bound covers three.
const fleetTickPatience = 3*fakeFleetCallTimeout + 10*time.Second

// step moves the fake clock by d: the loops first, then each instance's
// fleet in turn (see fleetFake).
func (f *fleetTest) step(d time.Duration) {
	f.t.Helper()
	ff := f.fake
	ff.clock.Advance(d)
	now := ff.clock.Now()
	for i, p := range f.insts {
		if p != nil {
			f.settleInst(i)
		}
	}
	for i, p := range f.insts {
		if p == nil {
			continue
		}
		due := p.fleet.fl.NextTick() <= now
		ff.fclocks[i].Set(now)
		if !due {
			// The tick is the fleet clock's only timer: with none due the
			// instance stands as it settled above.
			continue
		}
		start := time.Now()
		var poll backoff
		for p.fleet.fl.NextTick() <= now {
			if time.Since(start) > fleetTickPatience {
				var stacks strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
				f.t.Logf("goroutines:\n%s", stacks.String())
				f.t.Fatalf("at %v instance %d's fleet tick due at %v has not run in %v", now, i, p.fleet.fl.NextTick(), fleetTickPatience)
			}
			poll.wait()
		}
		if took := time.Since(start); took > 5*time.Second {
			f.t.Logf("at %v instance %d's fleet tick took %v of real time (a store call waiting for its timeout?)", now, i, took.Round(time.Millisecond))
		}
		f.settleInst(i)
	}
	if ff.trace != nil {
		f.traceStep(now)
	}
	if ff.onStep != nil {
		ff.onStep()
	}
}

// pass moves the fake clock by d in fleetSteps.
func (f *fleetTest) pass(d time.Duration) {
	f.t.Helper()
	for end := f.fake.clock.Now() + d; f.fake.clock.Now() < end; {
		f.step(min(fleetStep, end-f.fake.clock.Now()))
	}
}

// seconds moves the fake clock by n seconds and returns, per bucket, each
// second's units per instance (from the engines' counters, read with the
// clock standing still).
func (f *fleetTest) seconds(n int, buckets ...string) map[string][][]float64 {
	f.t.Helper()
	out := map[string][][]float64{}
	prev := map[string][]float64{}
	for _, b := range buckets {
		prev[b] = f.units(b)
	}
	for range n {
		f.pass(time.Second)
		for _, b := range buckets {
			cur := f.units(b)
			d := make([]float64, len(cur))
			for i := range cur {
				d[i] = cur[i] - prev[b][i]
			}
			out[b] = append(out[b], d)
			prev[b] = cur
		}
	}
	return out
}

// fleetConn is a closed-loop client of the fake-time fleet tests: it SETs
// a 15-unit value (60000 bytes) again as soon as the last SET is answered.
type fleetConn struct {
	c        *mcclient.Client
	stopping atomic.Bool
}

// fleetClients are the fleetConns of a test; every error but those of a
// connection being stopped is counted.
type fleetClients struct {
	errs atomic.Int64
	wg   sync.WaitGroup
}

// add starts n connections to instance i, one at a time, each once the
// one before is held: which connection takes a standing clock's room
// must not depend on when the requests arrive.
func (l *fleetClients) add(f *fleetTest, i, n int) {
	f.t.Helper()
	for range n {
		c, err := mcclient.Dial(f.insts[i].Addr)
		if err != nil {
			f.t.Fatal(err)
		}
		c.Timeout = 5 * time.Minute // held while the clock stands still
		fc := &fleetConn{c: c}
		k := len(f.fake.conns[i])
		f.fake.conns[i] = append(f.fake.conns[i], fc)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer c.Close()
			key := []byte(fmt.Sprintf("fleet-%d-%03d", i, k))
			val := make([]byte, 60000)
			for {
				r, err := c.Set(key, val)
				if fc.stopping.Load() {
					return
				}
				if err != nil || r.Header.Status() != mc.StatusSuccess {
					l.errs.Add(1)
					if err != nil {
						return
					}
				}
			}
		}()
		f.settleInst(i)
	}
}

// remove closes the last n connections of instance i, one at a time.
func (l *fleetClients) remove(f *fleetTest, i, n int) {
	f.t.Helper()
	for range n {
		cs := f.fake.conns[i]
		fc := cs[len(cs)-1]
		f.fake.conns[i] = cs[:len(cs)-1]
		fc.stopping.Store(true)
		_ = fc.c.Close()
		if f.insts[i] != nil {
			f.settleInst(i)
		}
	}
}

// close stops every connection and waits for the clients.
func (l *fleetClients) close(f *fleetTest) {
	for _, cs := range f.fake.conns {
		for _, fc := range cs {
			fc.stopping.Store(true)
			_ = fc.c.Close()
		}
	}
	l.wg.Wait()
}

// hardSum returns the sum of the hard limits the instances enforce for
// bucket (their shares of the fleet's).
func (f *fleetTest) hardSum(bucket string) int64 {
	var s int64
	for _, p := range f.insts {
		if p == nil {
			continue
		}
		if _, h := p.Engine().Bucket(bucket).Limits(); h != throttle.Unlimited {
			n, _ := h.Finite()
			s += n
		}
	}
	return s
}

// fleetTest is a fleet of proxies sharing one store and one memcached.
type fleetTest struct {
	t      testing.TB
	redis  *testmc.Redis
	mc     *testmc.Server
	tail   string // buckets and users, shared by every instance
	period string
	// throttle: lines inside [throttle] (default: capacity = "unlimited")
	throttle string
	insts    []*testProxy
	tcs      []testConfig
	wall     func() time.Time // every instance's wall clock (default time.Now)
	fake     *fleetFake       // fake clocks (newFakeFleetTest); nil: the real clock
	url      string           // the store's redis_url when not redis's (a cluster, Sentinel)
	log      io.Writer        // every instance's log when set (else testLogger's)
}

func newFleetTest(t testing.TB, tail, period string) *fleetTest {
	return &fleetTest{t: t, redis: testmc.StartRedis(t), mc: testmc.Start(t), tail: tail, period: period}
}

// storeURL is the instances' redis_url.
func (f *fleetTest) storeURL() string {
	if f.url != "" {
		return f.url
	}
	return f.redis.URL()
}

// instanceURL is the redis_url an instance is given: the store's, with
// a dial timeout of 20 s on fake clocks (a liveness bound, as
// fakeFleetCallTimeout: a dial that runs out fails a sync and changes the
// figures asserted; the default is 2 s, a TLS handshake included).
func (f *fleetTest) instanceURL() string {
	u := f.storeURL()
	if f.fake == nil || strings.Contains(u, "dial_timeout=") {
		return u
	}
	if strings.Contains(u, "?") {
		return u + "&dial_timeout=20s"
	}
	return u + "?dial_timeout=20s"
}

// start adds instance i (or restarts it with its earlier state file) with
// proxy lines proxyLines (e.g. its default bucket).
func (f *fleetTest) start(i int, proxyLines string) *testProxy {
	f.t.Helper()
	for len(f.insts) <= i {
		f.insts = append(f.insts, nil)
		f.tcs = append(f.tcs, testConfig{})
	}
	tc := f.tcs[i]
	if tc.statePath == "" {
		th := f.throttle
		if th == "" {
			th = `capacity = "unlimited"`
		}
		tc = testConfig{
			proxy:     proxyLines,
			throttle:  th,
			statePath: filepath.Join(f.t.TempDir(), "state.json"),
			loops:     1,
			wall:      f.wall,
			log:       f.log,
			tail: f.tail + fmt.Sprintf("[fleet]\nredis_url = %q\nname = \"test\"\ninstance = \"i%d\"\ngrant_period = %q\n",
				f.instanceURL(), i, f.period),
		}
		f.tcs[i] = tc
	}
	f.fakeClocks(i, &tc)
	p := startProxyTo(f.t, f.mc, tc)
	f.insts[i] = p
	return p
}

// units returns each instance's running total of units of bucket.
func (f *fleetTest) units(bucket string) []float64 {
	out := make([]float64, len(f.insts))
	for i, p := range f.insts {
		if p == nil {
			continue
		}
		if b := p.Engine().Bucket(bucket); b != nil {
			out[i] = float64(b.Stats().Units)
		}
	}
	return out
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

// fleetAdmin makes an admin change through instance p and fails the test
// unless it succeeds.
func fleetAdmin(t testing.TB, p *testProxy, op mc.Opcode, key, body string) {
	t.Helper()
	c := login(t, p.Addr, "admin")
	defer c.Close()
	if r := adminDo(t, c, op, key, body); r.Header.Status() != mc.StatusSuccess {
		t.Fatalf("%v %s %s: %v %s", op, key, body, r.Header.Status(), r.Value)
	}
}

func fleetUsers(t testing.TB) string {
	h := hashes(t)
	return fmt.Sprintf("[[user]]\nname = \"admin\"\npassword_hash = %q\nprivileges = [\"admin\"]\nbuckets = [\"*\"]\n", h["admin"])
}

func partsOf(secs [][]float64) []float64 {
	parts := make([]float64, len(secs[0]))
	total := 0.0
	for _, s := range secs {
		for i, x := range s {
			parts[i] += x
			total += x
		}
	}
	for i := range parts {
		parts[i] /= total
	}
	return parts
}

// fleetMetrics gathers an instance's metrics.
func fleetMetrics(t *testing.T, p *testProxy) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := p.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// fleetTag is the hash tag of the fleet tests' keys (fleet name "test").
const fleetTag = "{kvthrottle:test}"

// statHardLimit returns bucket's hard_limit as p's STAT throttle shows it
// to the admin user (fleetUsers): the limit in force, not the share.
func statHardLimit(t testing.TB, p *testProxy, bucket string) string {
	t.Helper()
	c := dial(t, p.Addr)
	defer c.Close()
	if err := c.AuthPlain("admin", "admin-pw"); err != nil {
		t.Fatal(err)
	}
	kv, err := c.Stats("throttle")
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range kv {
		if kv[0] == "bucket:"+bucket+":hard_limit" {
			return kv[1]
		}
	}
	return ""
}

// fleetStats returns p's fleet part of STAT throttle (nil if absent).
func fleetStats(t testing.TB, p *testProxy) *mcclient.FleetStats {
	t.Helper()
	c := login(t, p.Addr, "admin")
	defer c.Close()
	kv, err := c.Stats("throttle")
	if err != nil {
		t.Fatal(err)
	}
	st, err := mcclient.ParseThrottleStats(kv)
	if err != nil {
		t.Fatal(err)
	}
	return st.Fleet
}
