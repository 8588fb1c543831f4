package proxy

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// Delayed flushes (flush_all <delay>, binary FLUSH with an expiration), as
// memcached's t/flush-all.t checks them, on an injected wall clock: the
// deadline is passed by moving the clock, never by sleeping.

// fakeWall is a wall clock running with the real one, offset by what the
// test adds. Safe for concurrent use.
type fakeWall struct{ off atomic.Int64 }

func (w *fakeWall) now() time.Time { return time.Now().Add(time.Duration(w.off.Load())) }

func (w *fakeWall) advance(d time.Duration) { w.off.Add(int64(d)) }

// startFlushProxy starts a proxy on a fake wall clock and connects a text
// client to it.
func startFlushProxy(t *testing.T) (*fakeWall, *testProxy, *textConn) {
	t.Helper()
	w := &fakeWall{}
	p := startProxy(t, testConfig{wall: w.now})
	return w, p, dialText(t, p.Addr)
}

// textSet stores key=val through tc.
func textSet(t *testing.T, tc *textConn, key, val string) {
	t.Helper()
	if got := textDo(t, tc, fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", key, len(val), val), "STORED\r\n"); got != "STORED\r\n" {
		t.Fatalf("set %s: %q", key, got)
	}
}

// textHas reports whether key is stored (with value val) as seen through tc.
func textHas(t *testing.T, tc *textConn, key, val string) bool {
	t.Helper()
	got := textDo(t, tc, "get "+key+"\r\n", "END\r\n")
	switch got {
	case "END\r\n":
		return false
	case fmt.Sprintf("VALUE %s 0 %d\r\n%s\r\nEND\r\n", key, len(val), val):
		return true
	}
	t.Fatalf("get %s: %q", key, got)
	return false
}

// textFlush sends a flush_all line and requires OK.
func textFlush(t *testing.T, tc *textConn, line string) {
	t.Helper()
	if got := textDo(t, tc, line+"\r\n", "OK\r\n"); got != "OK\r\n" {
		t.Fatalf("%s: %q", line, got)
	}
}

// wantKeys checks which of keys are present (value "v"+key).
func wantKeys(t *testing.T, tc *textConn, when string, present map[string]bool) {
	t.Helper()
	for k, want := range present {
		if got := textHas(t, tc, k, "v"+k); got != want {
			t.Errorf("%s: %s present = %v, want %v", when, k, got, want)
		}
	}
}

// TestFlushAllDelayed: flush_all 2 leaves the items in place until the
// deadline; then every item stored before it, also after the flush_all,
// is gone, and items stored after it stay, however much later they are
// read.
func TestFlushAllDelayed(t *testing.T) {
	t.Parallel()
	w, _, tc := startFlushProxy(t)
	textSet(t, tc, "a", "va")
	textFlush(t, tc, "flush_all 2")
	textSet(t, tc, "b", "vb")
	wantKeys(t, tc, "before the deadline", map[string]bool{"a": true, "b": true})
	w.advance(2 * time.Second)
	wantKeys(t, tc, "at the deadline", map[string]bool{"a": false, "b": false})
	textSet(t, tc, "c", "vc")
	w.advance(time.Hour)
	wantKeys(t, tc, "an hour after the deadline", map[string]bool{"c": true})
}

// TestFlushAllFarFuture: a flush a day away, or at an absolute Unix time 40
// days away, leaves the items alone.
func TestFlushAllFarFuture(t *testing.T) {
	t.Parallel()
	w, _, tc := startFlushProxy(t)
	textSet(t, tc, "a", "va")
	textFlush(t, tc, "flush_all 86400")
	textSet(t, tc, "b", "vb")
	wantKeys(t, tc, "after flush_all 86400", map[string]bool{"a": true, "b": true})
	textFlush(t, tc, fmt.Sprintf("flush_all %d", time.Now().Add(40*24*time.Hour).Unix()))
	w.advance(2 * 24 * time.Hour) // past the replaced 86400
	wantKeys(t, tc, "after an absolute flush_all 40 days away", map[string]bool{"a": true, "b": true})
	w.advance(40 * 24 * time.Hour)
	wantKeys(t, tc, "40 days on", map[string]bool{"a": false, "b": false})
}

// TestFlushAllDelayedReplaced: a later flush_all replaces a pending one,
// whether it comes sooner or later than it, and an immediate one (no
// delay, or 0) flushes at once and cancels it.
func TestFlushAllDelayedReplaced(t *testing.T) {
	t.Parallel()
	w, _, tc := startFlushProxy(t)

	textSet(t, tc, "a", "va")
	textFlush(t, tc, "flush_all 100")
	textFlush(t, tc, "flush_all 10") // sooner
	w.advance(10 * time.Second)
	wantKeys(t, tc, "at the sooner deadline", map[string]bool{"a": false})
	textSet(t, tc, "b", "vb")
	w.advance(100 * time.Second)
	wantKeys(t, tc, "past the replaced deadline", map[string]bool{"b": true})

	textFlush(t, tc, "flush_all 10")
	textFlush(t, tc, "flush_all 100") // later
	w.advance(10 * time.Second)
	wantKeys(t, tc, "at the replaced deadline", map[string]bool{"b": true})
	w.advance(90 * time.Second)
	wantKeys(t, tc, "at the later deadline", map[string]bool{"b": false})

	for _, now := range []string{"flush_all", "flush_all 0"} {
		textSet(t, tc, "c", "vc")
		textFlush(t, tc, "flush_all 10")
		textFlush(t, tc, now)
		wantKeys(t, tc, "after "+now, map[string]bool{"c": false})
		textSet(t, tc, "d", "vd")
		w.advance(10 * time.Second)
		wantKeys(t, tc, "past the deadline "+now+" cancelled", map[string]bool{"d": true})
	}
}

// TestFlushAllDelayedNoreply: flush_all <delay> noreply answers nothing
// and flushes at the deadline; a negative delay flushes at once, as in
// memcached.
func TestFlushAllDelayedNoreply(t *testing.T) {
	t.Parallel()
	w, _, tc := startFlushProxy(t)
	textSet(t, tc, "a", "va")
	if got := textDo(t, tc, "flush_all 5 noreply\r\nget a\r\n", "END\r\n"); got != "VALUE a 0 2\r\nva\r\nEND\r\n" {
		t.Fatalf("flush_all 5 noreply, get a: %q", got)
	}
	w.advance(5 * time.Second)
	wantKeys(t, tc, "at the deadline", map[string]bool{"a": false})
	textSet(t, tc, "b", "vb")
	textFlush(t, tc, "flush_all -1")
	wantKeys(t, tc, "after flush_all -1", map[string]bool{"b": false})
}

// TestFlushAllDelayedDisabled: a bucket without flush_enabled refuses a
// delayed flush_all as it refuses a plain one.
func TestFlushAllDelayedDisabled(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: "[[bucket]]\nname = \"default\"\n"})
	tc := dialText(t, p.Addr)
	textSet(t, tc, "a", "va")
	for _, line := range []string{"flush_all", "flush_all 10"} {
		if got := textDo(t, tc, line+"\r\n", "CLIENT_ERROR flush_all not allowed\r\n"); got != "CLIENT_ERROR flush_all not allowed\r\n" {
			t.Fatalf("%s: %q", line, got)
		}
	}
	wantKeys(t, tc, "after refused flushes", map[string]bool{"a": true})
}

// TestFlushAllDelayedRestart: a pending flush is in the state file: a
// proxy restarted before the deadline flushes at the deadline; one
// restarted after it flushes at once, and only once.
func TestFlushAllDelayedRestart(t *testing.T) {
	t.Parallel()
	w, p, tc := startFlushProxy(t)
	textSet(t, tc, "a", "va")
	textFlush(t, tc, "flush_all 100")
	if data := readFile(t, p.StatePath); !strings.Contains(data, `"flushes"`) {
		t.Fatalf("state file without the pending flush:\n%s", data)
	}
	restart := func() *textConn {
		p.stop(t)
		p = startProxyTo(t, p.MC, testConfig{statePath: p.StatePath, wall: w.now})
		return dialText(t, p.Addr)
	}
	tc = restart()
	wantKeys(t, tc, "restarted before the deadline", map[string]bool{"a": true})
	w.advance(100 * time.Second)
	wantKeys(t, tc, "at the deadline, after a restart", map[string]bool{"a": false})

	textSet(t, tc, "b", "vb")
	textFlush(t, tc, "flush_all 100")
	p.stop(t)
	w.advance(200 * time.Second)
	tc = restart()
	wantKeys(t, tc, "restarted after the deadline", map[string]bool{"b": false})
	textSet(t, tc, "c", "vc")
	tc = restart()
	wantKeys(t, tc, "restarted again", map[string]bool{"c": true})
}

// TestFlushDelayedBinary: binary FLUSH and FLUSHQ with a 4-byte expiration
// schedule the flush (FLUSHQ answering nothing); a zero one flushes at once.
func TestFlushDelayedBinary(t *testing.T) {
	t.Parallel()
	w := &fakeWall{}
	p := startProxy(t, testConfig{wall: w.now})
	c := dial(t, p.Addr)
	has := func(k string) bool {
		t.Helper()
		r, err := c.Get([]byte(k))
		switch st := status(t, r, err); st {
		case mc.StatusSuccess:
			return true
		case mc.StatusKeyEnoent:
			return false
		default:
			t.Fatalf("GET %s: %s", k, st)
		}
		return false
	}
	set := func(k string) {
		t.Helper()
		if r, err := c.Set([]byte(k), []byte("v")); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("SET %s: %s", k, r.Status())
		}
	}
	for _, op := range []mc.Opcode{mc.OpFlush, mc.OpFlushQ} {
		k := op.String()
		set(k)
		if op == mc.OpFlushQ {
			c.Send(flushDelayed(op, 30)) // answers nothing: the GET's reply is the next one
		} else if r, err := c.Do(flushDelayed(op, 30)); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("%s in 30 s: %s %q", op, r.Status(), r.Value)
		}
		if !has(k) {
			t.Fatalf("%s: key gone before the deadline", op)
		}
		w.advance(30 * time.Second)
		if has(k) {
			t.Fatalf("%s: key still there at the deadline", op)
		}
	}
	set("c")
	if r, err := c.Do(flushDelayed(mc.OpFlush, 0)); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("FLUSH with delay 0: %s", r.Status())
	}
	if has("c") {
		t.Fatal("c still there after a FLUSH with delay 0")
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestFleetFlushAllDelayed: in fleet mode a delayed flush_all sent to one
// instance is pending on every instance (through the store) and empties
// the bucket on each at the deadline, once; an immediate flush_all sent to
// another instance cancels it fleet-wide. The waits for a change to reach
// the other instance are liveness bounds (a minute): the store's periods
// run on the real clock here, and a loaded machine once took more than 5 s.
func TestFleetFlushAllDelayed(t *testing.T) {
	t.Parallel()
	w := &fakeWall{}
	f := newFleetTest(t, "[[bucket]]\nname = \"b\"\nflush_enabled = true\n", "200ms")
	f.wall = w.now
	a, b := f.start(0, `default_bucket = "b"`), f.start(1, `default_bucket = "b"`)
	ta, tb := dialText(t, a.Addr), dialText(t, b.Addr)
	pending := func(p *testProxy) *bucketcfg.PendingFlush { return p.ten.Load().bucket("b").pending.Load() }

	textSet(t, ta, "k1", "vk1")
	textFlush(t, ta, "flush_all 100")
	testmc.Eventually(t, time.Minute, "the pending flush reaches b", func() bool { return pending(b) != nil })
	wantKeys(t, tb, "before the deadline, through b", map[string]bool{"k1": true})
	w.advance(100 * time.Second)
	wantKeys(t, tb, "at the deadline, through b", map[string]bool{"k1": false})
	wantKeys(t, ta, "at the deadline, through a", map[string]bool{"k1": false})
	textSet(t, tb, "k2", "vk2")
	// Three more syncs of each instance (its sync count, a histogram's),
	// not three periods of a clock that may run late on a busy machine.
	syncs := func(p *testProxy) float64 {
		return testmc.SeriesValue(t, fleetMetrics(t, p), "kvthrottle_fleet_sync_duration_seconds")
	}
	sa, sb := syncs(a), syncs(b)
	testmc.Eventually(t, 30*time.Second, "three more syncs of each instance", func() bool { return syncs(a) >= sa+3 && syncs(b) >= sb+3 })
	wantKeys(t, ta, "after the deadline and a few syncs, through a", map[string]bool{"k2": true})
	wantKeys(t, tb, "after the deadline and a few syncs, through b", map[string]bool{"k2": true})

	textFlush(t, ta, "flush_all 50")
	testmc.Eventually(t, time.Minute, "the second pending flush reaches b", func() bool { return pending(b) != nil })
	textFlush(t, tb, "flush_all")
	testmc.Eventually(t, time.Minute, "b's flush_all cancels the pending flush on a", func() bool { return pending(a) == nil })
	wantKeys(t, ta, "after b's flush_all, through a", map[string]bool{"k2": false})
	textSet(t, ta, "k3", "vk3")
	w.advance(50 * time.Second)
	wantKeys(t, ta, "past the cancelled deadline, through a", map[string]bool{"k3": true})
	wantKeys(t, tb, "past the cancelled deadline, through b", map[string]bool{"k3": true})

	// Scheduled while the store is stopped: answered at once, and sent
	// to the store once it is back.
	thaw := f.redis.Freeze(t)
	testmc.Eventually(t, time.Minute, "a notices the store is gone", func() bool { return !a.fleet.storeUp.Load() })
	textFlush(t, ta, "flush_all 30")
	thaw()
	testmc.Eventually(t, time.Minute, "the pending flush reaches b once the store is back", func() bool { return pending(b) != nil })
	w.advance(30 * time.Second)
	wantKeys(t, tb, "at the deadline of a flush scheduled without the store, through b", map[string]bool{"k3": false})
}

// TestFlushAllDelayedMatchesMemcached runs one script of delayed and
// immediate flush_alls against a real memcached and through the proxy (real
// clocks both) and requires byte-identical replies. Waiting for the
// deadline is the one place where it polls: each side is read until the
// item is gone (memcached flushes on its one-second tick, the proxy at the
// Unix second of the deadline), then the replies are compared again.
func TestFlushAllDelayedMatchesMemcached(t *testing.T) {
	t.Parallel()
	direct := testmc.Start(t)
	p := startProxy(t, testConfig{})
	dm, pm := dialText(t, direct.Addr), dialText(t, p.Addr)
	same := func(in, last string) {
		t.Helper()
		want, got := textDo(t, dm, in, last), textDo(t, pm, in, last)
		if got != want {
			t.Fatalf("%q: proxy %q, memcached %q", in, got, want)
		}
	}
	same("set foo 0 0 6\r\nfooval\r\n", "STORED\r\n")
	same("flush_all 3\r\n", "OK\r\n")
	same("get foo\r\n", "END\r\n")
	same("set bar 0 0 3\r\nnew\r\n", "STORED\r\n")
	same("flush_all invalid\r\n", "CLIENT_ERROR invalid exptime argument\r\n")
	for _, c := range []*textConn{dm, pm} {
		c := c
		testmc.Eventually(t, 8*time.Second, "foo flushed at the deadline", func() bool {
			return textDo(t, c, "get foo\r\n", "END\r\n") == "END\r\n"
		})
	}
	same("get foo bar\r\n", "END\r\n")
	// memcached keeps time in whole seconds and counts an item stored in
	// the deadline's second as flushed: wait until an item stored now
	// stays, on both sides alike.
	for _, c := range []*textConn{dm, pm} {
		testmc.Eventually(t, time.Minute, "an item stored after the deadline to stay", func() bool {
			textDo(t, c, "set probe 0 0 1\r\np\r\n", "STORED\r\n")
			return textDo(t, c, "get probe\r\n", "END\r\n") != "END\r\n"
		})
	}
	same("set baz 0 0 3\r\nbaz\r\n", "STORED\r\n")
	same("flush_all 86400\r\nget baz\r\n", "END\r\n")
	same(fmt.Sprintf("flush_all %d noreply\r\nget baz\r\n", time.Now().Add(40*24*time.Hour).Unix()), "END\r\n")
	same("flush_all 0 noreply\r\nget baz\r\n", "END\r\n")
	same("set baz 0 0 3\r\nbaz\r\nflush_all -1\r\nget baz\r\n", "END\r\n")
	same("set baz 0 0 3\r\nbaz\r\nflush_all 86400 noreply\r\nflush_all\r\nget baz\r\n", "END\r\n")
}

// TestMergeFleetStateFlushes: the fleet's pending flushes win; a local one
// the fleet lacks (scheduled while the store was down) is kept and makes
// the instance ahead, unless an immediate flush overtook it; a fleet flush
// due by now is applied without making the instance ahead of the fleet.
func TestMergeFleetStateFlushes(t *testing.T) {
	t.Parallel()
	fleetSt, local := bucketcfg.NewState(), bucketcfg.NewState()
	fleetSt.Epochs = map[string]uint64{"a": 1, "b": 4, "c": 2, "d": 7}
	fleetSt.Flushes["a"] = bucketcfg.PendingFlush{At: 500, Epoch: 2}
	fleetSt.Flushes["c"] = bucketcfg.PendingFlush{At: 90, Epoch: 3} // due
	local.Epochs = map[string]uint64{"a": 1, "b": 4, "c": 3, "d": 7}
	local.Flushes["a"] = bucketcfg.PendingFlush{At: 900, Epoch: 2} // the fleet's replaces it
	local.Flushes["b"] = bucketcfg.PendingFlush{At: 800, Epoch: 4} // overtaken
	m, ahead := mergeFleetState(fleetSt, local, 100)
	if ahead || len(m.Flushes) != 1 || m.Flushes["a"].At != 500 || m.Epochs["c"] != 3 {
		t.Fatalf("merged epochs %v flushes %v ahead %v", m.Epochs, m.Flushes, ahead)
	}
	local.Flushes["d"] = bucketcfg.PendingFlush{At: 300, Epoch: 8} // scheduled while the store was down
	m, ahead = mergeFleetState(fleetSt, local, 100)
	if !ahead || m.Flushes["d"] != local.Flushes["d"] {
		t.Fatalf("merged flushes %v ahead %v, want d's kept and ahead", m.Flushes, ahead)
	}
}

// flushDelayed is a FLUSH request with a delay of sec seconds.
func flushDelayed(op mc.Opcode, sec uint32) mcclient.Request {
	return mcclient.Request{Opcode: op, Extras: []byte{byte(sec >> 24), byte(sec >> 16), byte(sec >> 8), byte(sec)}}
}

// TestFlushGoneMeansEpochMoved: a state that replaces a bucket's pending
// flush by the epoch it led to (another instance applied it) moves the
// epoch before it drops the pending flush, so that a key command never
// finds neither: it would read the keys the flush removed. A reader
// watches the bucket while 300 such states are put in force; before the
// fix (pending flushes synced, then epochs), it caught the gap.
func TestFlushGoneMeansEpochMoved(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{proxy: `default_bucket = "b"`, tail: "[[bucket]]\nname = \"b\"\nflush_enabled = true\n"})
	b := p.ten.Load().bucket("b")
	base := b.gen.Load()
	stop := make(chan struct{})
	gaps := make(chan uint64, 1)
	go func() {
		defer close(gaps)
		var last uint64 // epoch of the last pending flush seen
		for {
			select {
			case <-stop:
				return
			default:
			}
			if f := b.pending.Load(); f != nil {
				last = f.Epoch
				continue
			}
			if g := b.gen.Load(); g < last {
				gaps <- last
				return
			}
		}
	}()
	put := func(epoch uint64, pending bool) {
		t.Helper()
		p.adminMu.Lock()
		defer p.adminMu.Unlock()
		next := p.state.Clone()
		next.Epochs["b"] = epoch
		delete(next.Flushes, "b")
		if pending {
			next.Flushes["b"] = bucketcfg.PendingFlush{At: time.Now().Add(time.Hour).Unix(), Epoch: epoch + 1}
		}
		if err := p.commit(next); err != nil {
			t.Fatal(err)
		}
	}
	for i := uint64(0); i < 300; i++ {
		put(base+i, true)
		put(base+i+1, false)
	}
	close(stop)
	if last, found := <-gaps; found {
		t.Fatalf("the pending flush to epoch %d was gone before the bucket reached it", last)
	}
	if g := b.gen.Load(); g != base+300 {
		t.Fatalf("epoch %d after the states, want %d", g, base+300)
	}
}
