package throttle

import (
	"testing"
	"time"
)

// Two places forgiven one after the other (both stalled for more than
// abandonAfter, as two held connections of one event loop are when that
// loop stalls) are each counted once when they come back: otherwise the
// line reads shorter than it is, a place still waiting is counted as
// served, and a newcomer that never waited is admitted at once while that
// place, re-trying exactly on time, is held.
func TestFIFOTwoForgivenPlacesComeBack(t *testing.T) {
	e, clk := newEngine(t, Unlimited, 0) // no burst: 1 unit admitted per ms
	b := addBucket(t, e, "a", 0, 1000)
	t0 := clk.Now()
	ab := time.Duration(abandonAfter)
	at := func(d time.Duration) { clk.Set(t0 + d) }

	wantAdmit(t, b, Blocking, 1, FreePool) // the gauge is busy until t0+1ms
	var A, B, C, D, E Waiter
	for _, w := range []*Waiter{&A, &B, &C} { // places 1, 2, 3
		if d, _ := b.Admit(w, Blocking); d != Held {
			t.Fatal("admitted")
		}
	}
	// A and B stall (their loop is blocked); C re-tries as told.
	at(ab + 1*ms)
	if d, _ := b.Admit(&C, Blocking); d != Held { // forgives place 1 (A)
		t.Fatalf("C admitted at +ab+1ms: %v", d)
	}
	at(2*ab + 1*ms)
	if d, _ := b.Admit(&C, Blocking); d == Held { // forgives place 2 (B), runs
		t.Fatal("C held at +41ms")
	}
	// D arrives at once and is held (C took the gauge until +42ms): first
	// in line.
	if d, _ := b.Admit(&D, Blocking); d != Held {
		t.Fatal("D admitted at +41ms")
	}
	// The stalled loop resumes: A comes back and runs.
	at(2*ab + 2*ms)
	if d, _ := b.Admit(&A, Blocking); d == Held {
		t.Fatal("A held at +42ms")
	}
	if !D.Waiting() {
		t.Fatal("D lost its place")
	}
	if s := b.Stats(); s.Waiting < 1 {
		t.Errorf("Stats.Waiting = %d while D waits (and B holds a place): A was counted as served twice", s.Waiting)
	}
	// At +43ms the gauge admits again: a newcomer E arriving just before D
	// re-tries (exactly on time) takes D's turn.
	at(2*ab + 3*ms)
	dE, _ := b.Admit(&E, Blocking)
	dD, _ := b.Admit(&D, Blocking)
	if dE != Held && dD == Held {
		t.Errorf("newcomer E admitted without waiting while D, held since +41ms and re-trying on time, is held")
	}
}

// A live place is never forgiven as lost, however deep in line it was when
// it was told when to re-try: no wait reaches past maxRecheck after the
// bucket has room, well within abandonAfter. Here the 399 places ahead of
// the last one go away at once (their clients disconnect, Cancel) and a
// newcomer arrives just before the last place re-tries, on time: it must
// queue behind it. (Waits estimated at 0.5 ms per place ahead, without a
// ceiling, would have had it sleep 200 ms, long after the room came.)
func TestFIFODeepPlaceNotForgivenAsLost(t *testing.T) {
	e, clk := newEngine(t, Unlimited, 0)
	b := addBucket(t, e, "a", 0, 1000)
	t0 := clk.Now()
	wantAdmit(t, b, Blocking, 1, FreePool) // room again at +1 ms
	ws := make([]Waiter, 400)
	var lastWait time.Duration
	for i := range ws {
		d, wait := b.Admit(&ws[i], Blocking)
		if d != Held {
			t.Fatal("admitted")
		}
		lastWait = wait
	}
	if max := ms + time.Duration(maxRecheck); lastWait > max {
		t.Fatalf("place 400 told to re-try after %v, beyond %v", lastWait, max)
	}
	for i := range len(ws) - 1 {
		ws[i].Cancel()
	}
	clk.Set(t0 + lastWait)
	var n Waiter
	if d, _ := b.Admit(&n, Blocking); d != Held {
		t.Fatal("newcomer admitted ahead of the last place, live and re-trying on time: it was forgiven as lost")
	}
	if d, _ := b.Admit(&ws[len(ws)-1], Blocking); d == Held {
		t.Fatal("the last place, first in line with room, is held")
	}
}
