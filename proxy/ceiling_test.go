package proxy

import (
	"bytes"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// readAsync reads c's next answer in a goroutine; the channel gets it.
func readAsync(c *mcclient.Client) <-chan *mcclient.Response {
	got := make(chan *mcclient.Response, 1)
	go func() {
		r, err := c.Read()
		if err != nil {
			r = nil
		}
		got <- r
	}()
	return got
}

// notYet fails the test if an answer arrives within a short real time:
// what it waits for must wait for the fake clock, or for memcached.
func notYet(t *testing.T, got <-chan *mcclient.Response, what string) {
	t.Helper()
	select {
	case r := <-got:
		if r == nil {
			t.Fatalf("%s: connection closed", what)
		}
		t.Fatalf("%s answered early: status %v, %d bytes", what, r.Status(), len(r.Value))
	case <-time.After(300 * time.Millisecond):
	}
}

// A write whose value crosses its bucket's ceiling class is forwarded only
// once the reads billed under the old class have settled: with a GET of
// the bucket stuck in a frozen memcached, a SET of 100 KB raises the
// ceiling (new reads are billed 32 units at once) but is not admitted
// until memcached answers the GET.
func TestRaiseWaitsForOldReads(t *testing.T) {
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"\nburst_ms = 100", upstream: `timeout = "60s"`}, throttle.NewFakeClock(time.Hour))
	a, b := dial(t, p.Addr), dial(t, p.Addr)
	if r, err := a.Set([]byte("k"), []byte("small")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set: %v %v", r, err)
	}
	tb := p.Engine().Bucket("default")
	rc := tb.ReadCost()
	if c := rc.Bound(); c != 1 {
		t.Fatalf("ceiling %d after small values on empty servers, want class 1", c)
	}
	thaw := p.MC.Freeze(t)
	defer thaw()
	n0 := tb.Stats().Commands
	a.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("k")})
	_ = a.Flush()
	gotA := readAsync(a)
	eventually(t, 10*time.Second, "the GET admitted", func() bool { return tb.Stats().Commands == n0+1 })
	b.Send(mcclient.Request{Opcode: mc.OpSet, Key: []byte("k2"), Value: bytes.Repeat([]byte("v"), 100_000), Extras: make([]byte, 8)})
	_ = b.Flush()
	gotB := readAsync(b)
	eventually(t, 10*time.Second, "the ceiling raised", func() bool { return rc.Bound() == 32 })
	notYet(t, gotB, "the SET")
	if n := tb.Stats().Commands; n != n0+1 {
		t.Fatalf("the SET was admitted (%d commands, want %d) while a read billed under class 1 was in flight", n, n0+1)
	}
	thaw()
	if r := answered(t, gotA, "the GET"); r.Status() != mc.StatusSuccess || string(r.Value) != "small" {
		t.Fatalf("GET: status %v %q", r.Status(), r.Value)
	}
	if r := answered(t, gotB, "the SET"); r.Status() != mc.StatusSuccess {
		t.Fatalf("SET: status %v %q", r.Status(), r.Value)
	}
	if rc.Pending() {
		t.Fatal("the raise still waits")
	}
}

// Rule 3: a value written around the proxy (straight into memcached) is a
// surprise: the read that finds it raises the ceiling, and its answer
// waits until the bucket's hard limit admits its excess, on the fake
// clock, as a command of that cost would.
func TestSurprisePaidBeforeDelivery(t *testing.T) {
	clk := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"\nburst_ms = 100",
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 100\n"}, clk)
	direct := dial(t, p.MC.Addr)
	if r, err := direct.Set([]byte("default:big"), bytes.Repeat([]byte("v"), 100_000)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("seed memcached: %v %v", r, err)
	}
	tb := p.Engine().Bucket("default")
	c := dial(t, p.Addr)
	c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
	_ = c.Flush()
	got := readAsync(c)
	// Billed 1 unit (class 1), it brings 25: 24 more, 240 ms at 100/s,
	// more than the burst, so they wait for the gauge to be paid up (the
	// 1 unit: 10 ms).
	eventually(t, 10*time.Second, "the ceiling raised by the surprise", func() bool { return tb.ReadCost().Ceiling() == 32 })
	notYet(t, got, "the surprising GET")
	clk.Advance(10 * time.Millisecond)
	if r := answered(t, got, "the GET once paid"); r.Status() != mc.StatusSuccess || len(r.Value) != 100_000 {
		t.Fatalf("GET: status %v, %d bytes", r.Status(), len(r.Value))
	}
	// The excess was billed before delivery: the next command waits for
	// it (240 ms), not for 1 unit.
	c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
	_ = c.Flush()
	next := readAsync(c)
	clk.Advance(100 * time.Millisecond)
	notYet(t, next, "the next GET, 100 ms into the surprise's 240")
	clk.Advance(time.Second)
	answered(t, next, "the next GET")
}

// Rule 5: a settle that gives units back wakes the loop's held sessions
// of its bucket. At 100 units/s with values of 200 KB (ceiling 64 units,
// more than the burst), a GET held behind another's bill of 64 runs as
// soon as that GET's refund leaves room, not 640 ms later.
func TestRefundWakesHeldSessions(t *testing.T) {
	clk := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"\nburst_ms = 100", loops: 1, // rule 5 is the loop's
		upstream: `timeout = "60s"`,
		tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 100\n"}, clk)
	a, b := dial(t, p.Addr), dial(t, p.Addr)
	if r, err := a.Set([]byte("big"), bytes.Repeat([]byte("v"), 200_000)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set big: %v %v", r, err)
	}
	clk.Advance(2 * time.Second) // the big SET's units paid
	if r, err := a.Set([]byte("small"), []byte("x")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set small: %v %v", r, err)
	}
	tb := p.Engine().Bucket("default")
	rc := tb.ReadCost()
	if c := rc.Bound(); c != 64 || rc.Listed() != 1 {
		t.Fatalf("bound %d, %d keys listed after a value of 200 KB; want class 64, 1", c, rc.Listed())
	}
	// Rule 5 with every read billed 64: the ceiling itself at that class
	// (as when more keys than the list holds are large).
	ep, _ := rc.Snapshot()
	rc.Restore(ep, 64)
	clk.Advance(time.Second)
	thaw := p.MC.Freeze(t)
	defer thaw()
	n0, held0 := tb.Stats().Commands, tb.Stats().Held
	a.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("small")})
	_ = a.Flush()
	gotA := readAsync(a)
	// a's GET admitted (in flight, memcached frozen) before b's is sent:
	// the other way round, b's bill goes first and a waits for the clock.
	eventually(t, time.Minute, "a's GET admitted", func() bool { return tb.Stats().Commands == n0+1 })
	b.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("small")})
	_ = b.Flush()
	gotB := readAsync(b)
	eventually(t, 10*time.Second, "b held behind a's bill", func() bool { return tb.Stats().Held > held0 })
	thaw()
	answered(t, gotA, "a's GET")
	// a's GET cost 1 unit: 63 went back. b's bill (64 units, more than
	// the burst) needs the gauge paid up: 10 ms after a's admission.
	clk.Advance(10 * time.Millisecond)
	if r := answered(t, gotB, "b's GET after the refund"); r.Status() != mc.StatusSuccess {
		t.Fatalf("b: status %v %q", r.Status(), r.Value)
	}
}

// The ceiling of a bucket's epoch is in the state file before the write
// that raised it is answered, and a restart starts from it: on servers
// that hold items, a bucket with a saved class starts there, one without
// at M (the largest item); on servers that hold none, at class 1.
func TestCeilingSurvivesRestart(t *testing.T) {
	tc := testConfig{throttle: "capacity = \"unlimited\"\nburst_ms = 100",
		tail:      "[[bucket]]\nname = \"default\"\n[[bucket]]\nname = \"other\"\n",
		statePath: filepath.Join(t.TempDir(), "state.json")}
	m := testmc.Start(t)
	p := startProxyTo(t, m, tc)
	for _, name := range []string{"default", "other"} {
		if c := p.Engine().Bucket(name).ReadCost().Bound(); c != 1 {
			t.Fatalf("%s: ceiling %d on empty servers, want class 1", name, c)
		}
	}
	c := dial(t, p.Addr)
	if r, err := c.Set([]byte("k"), bytes.Repeat([]byte("v"), 100_000)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set: %v %v", r, err)
	}
	st, err := bucketcfg.LoadState(tc.statePath)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := st.Ceilings["default"], (bucketcfg.Ceiling{Epoch: 0, Class: 32}); got != want {
		t.Fatalf("saved ceiling %+v when the SET was answered, want %+v", got, want)
	}
	c.Close()
	p.stop(t)

	tc.tail += "[[bucket]]\nname = \"third\"\n"
	p = startProxyTo(t, m, tc) // memcached holds the value
	for name, want := range map[string]int64{"default": 32, "other": 1, "third": 257} {
		// (other's class 1 was saved with default's: nothing was written
		// to it; third has none saved, and the servers hold items)
		if c := p.Engine().Bucket(name).ReadCost().Bound(); c != want {
			t.Errorf("%s: ceiling %d after a restart, want %d", name, c, want)
		}
	}
}

// The fleet's merge of ceilings: the greater epoch wins, then the larger
// class; a local ceiling ahead of the fleet's is pushed (ahead).
func TestMergeFleetStateCeilings(t *testing.T) {
	t.Parallel()
	fleetSt, local := bucketcfg.NewState(), bucketcfg.NewState()
	fleetSt.Ceilings["a"] = bucketcfg.Ceiling{Epoch: 1, Class: 64}
	fleetSt.Ceilings["b"] = bucketcfg.Ceiling{Epoch: 2, Class: 1}
	local.Ceilings["a"] = bucketcfg.Ceiling{Epoch: 1, Class: 8}
	local.Ceilings["b"] = bucketcfg.Ceiling{Epoch: 1, Class: 257}
	m, ahead := mergeFleetState(fleetSt, local, 100)
	if ahead || m.Ceilings["a"].Class != 64 || m.Ceilings["b"] != fleetSt.Ceilings["b"] {
		t.Fatalf("merged %v ahead %v, want the fleet's", m.Ceilings, ahead)
	}
	local.Ceilings["b"] = bucketcfg.Ceiling{Epoch: 2, Class: 32}
	m, ahead = mergeFleetState(fleetSt, local, 100)
	if !ahead || m.Ceilings["b"].Class != 32 {
		t.Fatalf("merged %v ahead %v, want b's raise kept and pushed", m.Ceilings, ahead)
	}
}

// In fleet mode a raise of a bucket's ceiling on one instance reaches the
// others through the fleet's state document (a grant period or two).
func TestFleetCeilings(t *testing.T) {
	f := newFleetTest(t, "[[bucket]]\nname = \"b\"\n", "1s")
	a, b := f.start(0, `default_bucket = "b"`), f.start(1, `default_bucket = "b"`)
	for _, p := range []*testProxy{a, b} {
		if c := p.Engine().Bucket("b").ReadCost().Bound(); c != 1 {
			t.Fatalf("ceiling %d on empty servers, want class 1", c)
		}
	}
	ca := dial(t, a.Addr)
	defer ca.Close()
	if r, err := ca.Set([]byte("k"), bytes.Repeat([]byte("v"), 100_000)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set: %v %v", r, err)
	}
	if c := a.Engine().Bucket("b").ReadCost().Bound(); c != 32 {
		t.Fatalf("a: ceiling %d after a 100 KB value, want 32", c)
	}
	testmc.Eventually(t, time.Minute, "b learns a's ceiling", func() bool {
		return b.Engine().Bucket("b").ReadCost().Bound() == 32
	})
}
