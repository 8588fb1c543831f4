package proxy

// The fake-clock driver of the fleet tests: three proxies whose engines
// read one fake clock, each with a fake fleet clock of its own, and closed
// loop clients started and stopped one at a time.

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
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
	for {
		n, why := unsettled(f.t, p)
		if why == "" && n == want {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("at %v instance %d did not settle with %d connections held (%d held; %s)", f.fake.clock.Now(), i, want, n, why)
		}
		time.Sleep(50 * time.Microsecond)
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
		ff.fclocks[i].Set(now)
		start := time.Now()
		for p.fleet.fl.NextTick() <= now {
			if time.Since(start) > fleetTickPatience {
				var stacks strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&stacks, 1)
				f.t.Logf("goroutines:\n%s", stacks.String())
				f.t.Fatalf("at %v instance %d's fleet tick due at %v has not run in %v", now, i, p.fleet.fl.NextTick(), fleetTickPatience)
			}
			time.Sleep(50 * time.Microsecond)
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
