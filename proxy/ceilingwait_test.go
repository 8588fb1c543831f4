package proxy

import (
	"io"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// A write that raises its bucket's ceiling waits for the raised class to
// be saved in state_file: work done in real time, not a throttle hold.
// With the save slowed by a hook, on the engine's fake clock: while the
// save is pending the session waits in waitingCeiling and the proxy is not
// settled, however far the clock moves; once the save is through, the
// writes go, and each second of the clock admits exactly the hard limit.
// The wait counts neither as throttled nor in the throttle's wait
// histogram. Before, the write was held on the engine's clock with a 5 ms
// re-try: a settle saw a held session and returned while the save was
// still running, and a step of the clock then admitted nothing
// (TestPymemcacheHeldBackPressure failed so, now and then).
func TestCeilingSaveWaitIsNotAHold(t *testing.T) {
	entered, unblock := stopFirstAt(t, &testHookCeilingSave)
	defer unblock() // before the proxy's cleanup, which waits for the save

	const limit, n, valueLen = 100, 1000, 4000 // 1 write unit per set; 4000 B: read class 2
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, bpConfig(limit, time.Second), clock)
	b := p.Engine().Bucket("default")
	startPipeWriter(t, rawDial(t, p.Addr), "cw", n, valueLen)
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the first set did not start a save of the ceilings")
	}

	ft := &fakeTime{t: t, p: p, clock: clock}
	for i := 0; i < 2; i++ {
		if held, ok := settled(t, p); ok {
			t.Fatalf("step %d: settled (%d held) while the raise's save is pending", i, held)
		}
		in := clientInputs(t, p)
		if len(in) != 1 || in[0].pause != waitingCeiling {
			t.Fatalf("step %d: sessions %+v, want one waitingCeiling", i, in)
		}
		if got := b.Stats().Commands; got != 0 {
			t.Fatalf("step %d: %d sets admitted before the raised class was saved", i, got)
		}
		clock.Advance(time.Second) // no engine timer ends the wait
	}
	unblock()
	ft.settle(1, nil)
	first := b.Stats().Commands
	if first == 0 || b.Stats().Held != 1 {
		t.Fatalf("after the save: %d sets admitted, %d held by the throttle; want some, then 1 held", first, b.Stats().Held)
	}
	if w := waitHistogram(t, p, "default").GetSampleCount(); w != 0 {
		t.Fatalf("the ceiling's wait was counted as a throttle wait (%d samples)", w)
	}
	for i := 0; i < 2; i++ {
		if got := admitted(t, p, clock, b, time.Second); got != limit {
			t.Fatalf("advancing the clock 1 s admitted %d sets, want %d (the hard limit)", got, limit)
		}
	}
	if w := waitHistogram(t, p, "default").GetSampleCount(); w != 2 {
		t.Fatalf("%d throttle waits counted, want 2 (one per step)", w)
	}
}

// A key command that finds its bucket's FLUSH admitted and not yet in
// effect waits for the FLUSH's save: work done in real time, not a
// throttle hold. With the save stopped by a hook, on the engine's fake
// clock: the session waits in waitingFlush and the proxy is not settled,
// however far the clock moves, and the wait is not counted as held or as a
// throttle wait; once the save is through, the command runs in the new
// namespace. (The session was parked as held before: a test's settle saw
// it held and moved the clock while the FLUSH was still being saved.)
func TestFlushWaitIsNotAHold(t *testing.T) {
	entered, unblock := stopFirstAt(t, &testHookFlushSave)
	defer unblock() // before the proxy's cleanup, which waits for the save

	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{loops: 1}, clock)
	a, b := dialText(t, p.Addr), dialText(t, p.Addr)
	textDo(t, b, "set k 0 0 3\r\nold\r\n", "STORED\r\n")
	if _, err := io.WriteString(a.c, "flush_all\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the FLUSH never reached its save")
	}
	if _, err := io.WriteString(b.c, "get k\r\n"); err != nil {
		t.Fatal(err)
	}
	waiting := func() bool {
		for _, in := range clientInputs(t, p) {
			if in.pause == waitingFlush {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(20 * time.Second); !waiting(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no session waits for the FLUSH: %+v", clientInputs(t, p))
		}
	}
	for i := 0; i < 2; i++ {
		if held, ok := settled(t, p); ok {
			t.Fatalf("step %d: settled (%d held) while the FLUSH's save is pending", i, held)
		}
		clock.Advance(time.Second) // no engine timer ends the wait
	}
	if h := p.Engine().Bucket("default").Stats().Held; h != 0 {
		t.Fatalf("the wait for the FLUSH was counted as %d throttle holds", h)
	}
	unblock()
	if got := a.line(t); got != "OK\r\n" {
		t.Fatalf("flush_all: %q", got)
	}
	if got := b.line(t); got != "END\r\n" {
		t.Fatalf("get k after the FLUSH: %q, want END (the key flushed)", got)
	}
	ft := &fakeTime{t: t, p: p, clock: clock}
	ft.settle(0, nil)
	if w := waitHistogram(t, p, "default").GetSampleCount(); w != 0 {
		t.Fatalf("the wait for the FLUSH was counted as a throttle wait (%d samples)", w)
	}
}

// stopFirstAt sets *hook, a package test hook (set before the Server
// starts), to stop the first caller until unblock is called; entered is
// closed when that caller arrives. Defer unblock: the test's cleanups,
// which stop the proxy, may wait for the caller.
func stopFirstAt(t *testing.T, hook *func()) (entered <-chan struct{}, unblock func()) {
	in, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	*hook = func() {
		once.Do(func() { close(in); <-release })
	}
	unblock = func() { released.Do(func() { close(release) }) }
	t.Cleanup(func() { unblock(); *hook = nil })
	return in, unblock
}
