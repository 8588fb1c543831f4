package proxy

// The read ceiling (docs/throttling.md, "Reads: the ceiling") across
// restarts, FLUSHes and a fleet.

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// flush sends a FLUSH through c and fails the test unless it succeeds.
func flush(t *testing.T, c *mcclient.Client) {
	t.Helper()
	if r, err := c.Do(mcclient.Request{Opcode: mc.OpFlush}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("flush: %v %v", r, err)
	}
}

// TestCeilingRestartKeepsEpochClass: a bucket's ceiling after a FLUSH and
// a raise in the new epoch is what a restart starts from, also when the
// restart changes max_item_bytes (and so the classes): the saved class
// is taken up to the least new class above it, never down, so a read of
// a value written before the restart is never billed below it. A value
// of the old epoch is gone after the FLUSH, and stays gone.
func TestCeilingRestartKeepsEpochClass(t *testing.T) {
	t.Parallel()
	tc := testConfig{throttle: "capacity = \"unlimited\"", statePath: filepath.Join(t.TempDir(), "state.json")}
	m := testmc.Start(t)
	p := startProxyTo(t, m, tc)
	c := dial(t, p.Addr)
	setValue(t, c, "old", 1_000_000)
	rc := p.Engine().Bucket("default").ReadCost()
	if got := rc.Bound(); got != 256 {
		t.Fatalf("ceiling %d after a 1 MB value, want 256", got)
	}
	flush(t, c)
	if got := rc.Bound(); got != 1 {
		t.Fatalf("ceiling %d after a FLUSH, want 1", got)
	}
	setValue(t, c, "new", 100_000)
	c.Close()
	p.stop(t)
	for _, step := range []struct {
		maxItem string
		want    int64
	}{
		{"65536", 34},   // classes 1 ... 16, 17, 34: the least at or above 32
		{"1048576", 32}, // the saved 32 units, not the 34 of the run before (nothing was raised)
	} {
		tc.throttle = "capacity = \"unlimited\"\nmax_item_bytes = " + step.maxItem
		p = startProxyTo(t, m, tc)
		if got := p.Engine().Bucket("default").ReadCost().Bound(); got != step.want {
			t.Errorf("max_item_bytes %s: ceiling %d after a restart, want %d", step.maxItem, got, step.want)
		}
		c = dial(t, p.Addr)
		if r, err := c.Get([]byte("old")); err != nil || r.Status() != mc.StatusKeyEnoent {
			t.Errorf("max_item_bytes %s: the flushed value after a restart: %v %v", step.maxItem, r, err)
		}
		if r, err := c.Get([]byte("new")); err != nil || r.Status() != mc.StatusSuccess || len(r.Value) != 100_000 {
			t.Errorf("max_item_bytes %s: the new epoch's value after a restart: %v %v", step.maxItem, r, err)
		}
		c.Close()
		p.stop(t)
	}
}

// TestFleetCeilingsFollowFlush: two instances of a fleet agree on a
// bucket's ceiling through a raise, a FLUSH on one of them (both go back
// to class 1 in the new epoch) and a raise in the new epoch; the second
// instance restarted keeps it.
func TestFleetCeilingsFollowFlush(t *testing.T) {
	f := newFleetTest(t, "[[bucket]]\nname = \"b\"\nflush_enabled = true\n", "1s")
	a, b := f.start(0, `default_bucket = "b"`), f.start(1, `default_bucket = "b"`)
	ceil := func(p *testProxy) int64 { return p.Engine().Bucket("b").ReadCost().Bound() }
	agree := func(what string, want int64) {
		t.Helper()
		testmc.Eventually(t, 10*time.Second, what, func() bool { return ceil(a) == want && ceil(b) == want })
	}
	ca := dial(t, a.Addr)
	setValue(t, ca, "k", 200_000)
	agree("both at class 64", 64)
	flush(t, ca)
	agree("both back at class 1 after the FLUSH", 1)
	setValue(t, ca, "k", 100_000)
	agree("both at class 32 in the new epoch", 32)
	ca.Close()
	b.stop(t)
	b = f.start(1, `default_bucket = "b"`)
	if got := ceil(b); got != 32 {
		t.Fatalf("restarted instance: ceiling %d, want 32", got)
	}
}

// TestCeilingFollowsAppendGrowth: a value grown by appends through the
// proxy (text append and prepend, meta ms MA and MP, binary APPEND and
// PREPENDQ), each piece small, raises the ceiling to the sum before each
// piece goes (the key is listed as large): a GET of the grown value is
// never billed below it (no surprise: its bill covers it).
func TestCeilingFollowsAppendGrowth(t *testing.T) {
	t.Parallel()
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`}, throttle.NewFakeClock(time.Hour))
	rc := p.Engine().Bucket("default").ReadCost()
	piece := strings.Repeat("a", 30_000)
	tc := dialText(t, p.Addr)
	bin := dial(t, p.Addr)
	size := 0
	grow := func(how string, send func()) {
		t.Helper()
		send()
		size += len(piece)
		if need := throttle.ReadUnits(int64(250+size), 4096); rc.Bound() < need {
			t.Fatalf("after %s to %d bytes: ceiling %d, below the value's %d units", how, size, rc.Bound(), need)
		}
	}
	textCmd := func(line string) func() {
		return func() {
			if got := textDo(t, tc, fmt.Sprintf(line, len(piece))+"\r\n"+piece+"\r\nmn\r\n", "MN\r\n"); strings.Contains(got, "ERROR") || strings.Contains(got, "NOT_") {
				t.Fatalf("%s: %q", line, got)
			}
		}
	}
	binCmd := func(op mc.Opcode) func() {
		return func() {
			bin.Send(mcclient.Request{Opcode: op, Key: []byte("k"), Value: []byte(piece)})
			bin.Send(mcclient.Request{Opcode: mc.OpNoop})
			_ = bin.Flush()
			for {
				r, err := bin.Read()
				if err != nil || r.Status() != mc.StatusSuccess {
					t.Fatalf("%v: %v %v", op, r, err)
				}
				if r.Opcode == mc.OpNoop {
					return
				}
			}
		}
	}
	grow("set", textCmd("set k 0 0 %d"))
	for i := 0; i < 4; i++ {
		grow("append", textCmd("append k 0 0 %d"))
		grow("prepend", textCmd("prepend k 0 0 %d noreply"))
		grow("ms MA", textCmd("ms k %d MA"))
		grow("ms MP", textCmd("ms k %d MP q"))
		grow("PREPENDQ", binCmd(mc.OpPrependQ))
	}
	grow("APPEND", binCmd(mc.OpAppend))
	if r, err := bin.Get([]byte("k")); err != nil || len(r.Value) != size {
		t.Fatalf("the grown value: %d bytes, want %d (%v)", len(r.Value), size, err)
	}
	// The key is listed: each append adds its bytes to the top of the
	// key's class (what the list knows of its value), so the bound may
	// pass the value's own class, never the largest item.
	if b := rc.Bound(); b < 256 || b > 257 || rc.Ceiling() != 1 {
		t.Fatalf("bound %d, ceiling %d after growing a value to %d bytes, want 256 or 257 (M), 1", b, rc.Ceiling(), size)
	}
}
