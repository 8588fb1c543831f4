package proxy

// A raise of the read ceiling (ceilingraise.go) beside clients that go
// away mid-answer, and the writes it holds.

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// stuckRead starts a proxy (fake clock, 60 s upstream timeout) whose
// bucket "default" holds one small value "k" (ceiling class 1), freezes
// its memcached and sends a GET of k on a new client, and returns once
// the GET is admitted (billed under class 1, stuck in flight): the proxy,
// the bucket, the client, and thaw.
func stuckRead(t *testing.T) (*testProxy, *throttle.Bucket, *mcclient.Client, func()) {
	t.Helper()
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"", upstream: `timeout = "60s"`}, throttle.NewFakeClock(time.Hour))
	a := dial(t, p.Addr)
	if r, err := a.Set([]byte("k"), []byte("small")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set: %v %v", r, err)
	}
	tb := p.Engine().Bucket("default")
	if c := tb.ReadCost().Bound(); c != 1 {
		t.Fatalf("ceiling %d after small values on empty servers, want class 1", c)
	}
	thaw := p.MC.Freeze(t)
	n0 := tb.Stats().Commands
	a.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("k")})
	_ = a.Flush()
	eventually(t, 10*time.Second, "the GET admitted", func() bool { return tb.Stats().Commands == n0+1 })
	return p, tb, a, thaw
}

// TestRaiseAfterReaderClosedMidAnswer: a read billed under class 1 is in
// flight (memcached frozen) when its client closes; a write that raises
// the ceiling waits for it, and goes as soon as memcached answers the
// orphaned read: a read that never reaches its client still settles, so a
// raise is never pending forever. Then a raise whose writer closed while
// waiting leaves nothing pending: the next larger write goes.
func TestRaiseAfterReaderClosedMidAnswer(t *testing.T) {
	t.Parallel()
	p, tb, a, thaw := stuckRead(t)
	defer thaw()
	rc := tb.ReadCost()
	b := dial(t, p.Addr)
	a.Close() // gone before its answer
	b.Send(mcclient.Request{Opcode: mc.OpSet, Key: []byte("k2"), Value: bytes.Repeat([]byte("v"), 100_000), Extras: make([]byte, 8)})
	_ = b.Flush()
	gotB := readAsync(b)
	eventually(t, 10*time.Second, "the ceiling raised", func() bool { return rc.Bound() == 32 })
	notYet(t, gotB, "the SET while the orphaned GET is in flight")
	thaw()
	if r := answered(t, gotB, "the SET once the orphaned GET is answered"); r.Status() != mc.StatusSuccess {
		t.Fatalf("SET: status %v %q", r.Status(), r.Value)
	}

	// A writer that closes while its raise waits.
	c, d := dial(t, p.Addr), dial(t, p.Addr)
	thaw = p.MC.Freeze(t)
	n0 := tb.Stats().Commands
	c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("k")})
	_ = c.Flush()
	gotC := readAsync(c)
	eventually(t, 10*time.Second, "the second GET admitted", func() bool { return tb.Stats().Commands == n0+1 })
	d.Send(mcclient.Request{Opcode: mc.OpSet, Key: []byte("k3"), Value: bytes.Repeat([]byte("v"), 200_000), Extras: make([]byte, 8)})
	_ = d.Flush()
	eventually(t, 10*time.Second, "the ceiling raised again", func() bool { return rc.Bound() == 64 })
	d.Close()
	thaw()
	answered(t, gotC, "the second GET")
	e := dial(t, p.Addr)
	done := make(chan *mcclient.Response, 1)
	go func() {
		r, err := e.Set([]byte("k4"), bytes.Repeat([]byte("v"), 500_000))
		if err != nil {
			r = nil
		}
		done <- r
	}()
	if r := answered(t, done, "a larger SET after the waiting writer closed"); r.Status() != mc.StatusSuccess {
		t.Fatalf("SET: status %v", r.Status())
	}
	if rc.Pending() || rc.Bound() != 128 {
		t.Fatalf("after the raises: pending %v, ceiling %d (want 128)", rc.Pending(), rc.Bound())
	}
}

// TestRaiseHoldsTextPipelineInOrder: a text client pipelines a noreply
// set that raises the ceiling (and waits for a read billed under class 1,
// stuck in a frozen memcached) with a get of the key and an mn: nothing
// is lost or reordered; the get sees the value once the raise is through.
func TestRaiseHoldsTextPipelineInOrder(t *testing.T) {
	t.Parallel()
	p, tb, a, thaw := stuckRead(t)
	defer thaw()
	gotA := readAsync(a)
	tc := dialText(t, p.Addr)
	v := strings.Repeat("w", 100_000)
	in := fmt.Sprintf("set big 0 0 %d noreply\r\n%s\r\nget big\r\nmn\r\n", len(v), v)
	_ = tc.c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(tc.c, in); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the ceiling raised", func() bool { return tb.ReadCost().Bound() == 32 })
	thaw()
	answered(t, gotA, "the GET")
	want := fmt.Sprintf("VALUE big 0 %d\r\n%s\r\nEND\r\nMN\r\n", len(v), v)
	var out strings.Builder
	for !strings.HasSuffix(out.String(), "MN\r\n") {
		l := tc.line(t)
		if l == "" {
			t.Fatalf("connection closed after %q", out.String())
		}
		out.WriteString(l)
	}
	if got := out.String(); got != want {
		t.Fatalf("pipeline answered %.200q, want %.200q", got, want)
	}
}

// TestRule3OwingSessionClosedFreesTheLine: a client whose surprise (a
// 1 MB value written around the proxy, billed 1 unit, bringing 245) waits
// to be paid holds its bucket's place in line; it closes before paying.
// Its excess (244 units) becomes the bucket's debt, billed with the
// bucket's next command: another client of the bucket, behind it, is not
// left waiting for it (its GET goes once the gauge is paid up, as a bill
// larger than the burst does), and the GET after that waits until the
// gauge has paid the debt (2.44 s at 100 units/s), not before.
func TestRule3OwingSessionClosedFreesTheLine(t *testing.T) {
	t.Parallel()
	clk := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"\nburst_ms = 100", loops: 1,
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 100\n"}, clk)
	direct := dial(t, p.MC.Addr)
	setValue(t, direct, "default:big", 1_000_000)
	setValue(t, direct, "default:s", 1)
	tb := p.Engine().Bucket("default")
	a, b := dial(t, p.Addr), dial(t, p.Addr)
	a.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
	_ = a.Flush()
	eventually(t, 10*time.Second, "the surprise found", func() bool { return tb.ReadCost().Ceiling() == 256 })
	clk.Advance(5 * time.Millisecond) // not yet paid up (its 1 unit: 10 ms)
	b.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("s")})
	_ = b.Flush()
	gotB := readAsync(b)
	notYet(t, gotB, "b's GET behind a's unpaid surprise")
	a.Close()
	eventually(t, 10*time.Second, "a's session gone", func() bool {
		n := 0
		onLoop(t, p, func(lp *loop) { n = len(lp.sessions) })
		return n == 1
	})
	clk.Advance(5 * time.Millisecond) // a's 1 unit paid: the gauge is paid up
	if r := answered(t, gotB, "b's GET, billed the debt"); r.Status() != mc.StatusSuccess {
		t.Fatalf("b: %v", r.Status())
	}
	b.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("s")})
	_ = b.Flush()
	gotB = readAsync(b)
	clk.Advance(2 * time.Second) // the debt (2.44 s) not yet paid
	notYet(t, gotB, "b's next GET before the debt is paid")
	clk.Advance(time.Second)
	if r := answered(t, gotB, "b's next GET once the debt is paid"); r.Status() != mc.StatusSuccess {
		t.Fatalf("b: %v", r.Status())
	}
}

// TestAppendToKeyBeyondTheListBilledItsValue: 64 keys of 100,000 bytes
// fill a bucket's list of large keys, a 65th raises the ceiling to their
// class (32); an APPEND of 100,000 bytes to the 65th then raises what its
// read is billed (to 64) before it goes, so its read, of a value written
// through the proxy only, is no surprise.
func TestAppendToKeyBeyondTheListBilledItsValue(t *testing.T) {
	t.Parallel()
	clk := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, loops: 1,
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 1000000\n"}, clk)
	w := dial(t, p.Addr)
	v := bytes.Repeat([]byte("v"), 100_000)
	for i := 0; i < 65; i++ {
		if r, err := w.Set(fmt.Appendf(nil, "k%d", i), v); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("set %d: %v %v", i, r, err)
		}
		clk.Advance(time.Second)
	}
	rc := p.Engine().Bucket("default").ReadCost()
	if rc.Listed() != 64 || rc.Ceiling() != 32 {
		t.Fatalf("after 65 large keys: %d listed, ceiling %d; want 64 and 32", rc.Listed(), rc.Ceiling())
	}
	if r, err := w.Do(mcclient.Request{Opcode: mc.OpAppend, Key: []byte("k64"), Value: v}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("append: %v %v", r, err)
	}
	bill := rc.KeyBound([]byte("k64"))
	r, err := w.Get([]byte("k64"))
	if err != nil || r.Status() != mc.StatusSuccess || len(r.Value) != 200_000 {
		t.Fatalf("get: %v %v", r, err)
	}
	if units := throttle.ReadUnits(int64(len("default:k64")+len(r.Value)), 4096); units > bill {
		t.Fatalf("k64 holds %d bytes (%d units); its read was billed %d", len(r.Value), units, bill)
	}
}

// appendThroughProxy sends an APPEND of v to key through w and fails the
// test unless it is stored.
func appendThroughProxy(t *testing.T, w *mcclient.Client, key string, v []byte) {
	t.Helper()
	if r, err := w.Do(mcclient.Request{Opcode: mc.OpAppend, Key: []byte(key), Value: v}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("append to %s: %v %v", key, r, err)
	}
}

// largeKeyProxy starts a proxy on a fake clock whose default bucket may
// read and write 1,000,000 units/s (nothing is held), with throttleLines
// in its [throttle] table, and returns it with a client.
func largeKeyProxy(t *testing.T, throttleLines string) (*testProxy, *mcclient.Client, *throttle.ReadCost) {
	t.Helper()
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"\n" + throttleLines, loops: 1,
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 1000000\n"}, throttle.NewFakeClock(time.Hour))
	return p, dial(t, p.Addr), p.Engine().Bucket("default").ReadCost()
}

// An APPEND that lists its key waits for the save of the raised class and
// is dispatched again: its bytes count once. One APPEND of 100,000 bytes
// to a key of 100,000 (listed at class 32) bills its reads 64 units, not
// a class more at each re-try (it reached M, 257).
func TestAppendWaitingForItsListingCountsItsBytesOnce(t *testing.T) {
	t.Parallel()
	_, w, rc := largeKeyProxy(t, "")
	setValue(t, w, "k", 100_000)
	if b := rc.KeyBound([]byte("k")); b != 32 {
		t.Fatalf("k listed at %d after a SET of 100,000 bytes, want 32", b)
	}
	appendThroughProxy(t, w, "k", bytes.Repeat([]byte("v"), 100_000))
	if b := rc.KeyBound([]byte("k")); b != 64 {
		t.Fatalf("after one APPEND of 100,000 bytes to 100,000, k is billed %d per read, want 64", b)
	}
}

// The same with the list full: the APPEND raises the ceiling, waits for
// its save, and its re-try does not add its bytes again (every read of
// the bucket was billed 128 where 64 covers all).
func TestAppendWaitingForTheCeilingCountsItsBytesOnce(t *testing.T) {
	t.Parallel()
	_, w, rc := largeKeyProxy(t, "")
	for i := 0; i < 65; i++ {
		setValue(t, w, fmt.Sprintf("k%d", i), 100_000)
	}
	if rc.Listed() != 64 || rc.Ceiling() != 32 {
		t.Fatalf("after 65 large keys: %d listed, ceiling %d; want 64 and 32", rc.Listed(), rc.Ceiling())
	}
	appendThroughProxy(t, w, "k64", bytes.Repeat([]byte("v"), 100_000))
	if c := rc.Ceiling(); c != 64 {
		t.Fatalf("after one APPEND of 100,000 bytes to a 100,000-byte key the ceiling is %d, want 64", c)
	}
}

// An APPEND to a listed key starts from its largest value's units, not
// from the top of its class: one byte appended to 100,000 keeps the key
// in class 32 (it was billed 257, M, after the re-tries).
func TestOneByteAppendToListedKeyKeepsItsClass(t *testing.T) {
	t.Parallel()
	_, w, rc := largeKeyProxy(t, "")
	setValue(t, w, "k", 100_000)
	appendThroughProxy(t, w, "k", []byte("x"))
	if b := rc.KeyBound([]byte("k")); b != 32 {
		t.Fatalf("after a 1-byte APPEND to 100,000 bytes, k is billed %d per read, want 32", b)
	}
}

// max_item_bytes set below memcached's item size (-I 1m here) bounds no
// write: an APPEND chain grows a value past it, and the estimate follows
// (it was capped at max_item_bytes: 300,000 bytes read billed 17 units).
func TestAppendBeyondMaxItemBytesBilledItsValue(t *testing.T) {
	t.Parallel()
	_, w, rc := largeKeyProxy(t, "max_item_bytes = 65536")
	setValue(t, w, "k", 60_000)
	for range 4 {
		appendThroughProxy(t, w, "k", bytes.Repeat([]byte("v"), 60_000))
	}
	bill := rc.KeyBound([]byte("k"))
	r, err := w.Get([]byte("k"))
	if err != nil || r.Status() != mc.StatusSuccess || len(r.Value) != 300_000 {
		t.Fatalf("get: %v %v", r, err)
	}
	if units := throttle.ReadUnits(int64(len("default:k")+len(r.Value)), 4096); units > bill {
		t.Fatalf("k, written through the proxy only, holds %d bytes (%d units); its read was billed %d", len(r.Value), units, bill)
	}
}
