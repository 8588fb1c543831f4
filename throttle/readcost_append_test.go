package throttle

// APPEND and PREPEND (readcost_append.go): each test replays, on one
// ReadCost, the calls the proxy makes (proxy/ceilingraise.go: reserve and
// raise at each attempt; Complete when memcached answers; Release when the
// write never went) in an order the proxy allows, and checks the promise:
// a key written only through the proxy is billed at least what it holds,
// and a later APPEND to it starts from at least that.

import (
	"fmt"
	"testing"
)

// raiseAll lets a write of key (v bytes) go: RaiseKey, draining until it
// may (no read is in flight when it is called).
func raiseAll(t *testing.T, rc *ReadCost, key []byte, v int64) {
	t.Helper()
	for i := 0; !rc.RaiseKey(key, v); i++ {
		if i == 1000 {
			t.Fatalf("the write of %q (%d bytes) waits with no read in flight", key, v)
		}
		rc.TryDrain()
	}
}

// reserveAll is an APPEND's attempt that goes: ReserveAppend, and
// RaiseAppend until it may (no read in flight). It returns the bound.
func reserveAll(t *testing.T, rc *ReadCost, a *AppendRes, key []byte, v, limit int64) int64 {
	t.Helper()
	bound := max(rc.ReserveAppend(a, key, v, limit), 1)
	for i := 0; !rc.RaiseAppend(key, bound); i++ {
		if i == 1000 {
			t.Fatalf("the APPEND to %q (bound %d) waits with no read in flight", key, bound)
		}
		rc.TryDrain()
	}
	return bound
}

// appendWent runs an APPEND of v bytes to key as the proxy does when
// memcached stores it, and reports whether its raise let it go at once.
func appendWent(rc *ReadCost, key []byte, v, limit int64) bool {
	var a AppendRes
	ok := rc.RaiseAppend(key, max(rc.ReserveAppend(&a, key, v, limit), 1))
	a.Complete(key, true)
	return ok
}

// appendBound is appendWent's bound (its raise drained until it goes).
func appendBound(rc *ReadCost, key []byte, v, limit int64) int64 {
	var a AppendRes
	bound := max(rc.ReserveAppend(&a, key, v, limit), 1)
	for !rc.RaiseAppend(key, bound) {
		rc.TryDrain()
	}
	a.Complete(key, true)
	return bound
}

// billedFor fails when a read of key is billed less than a value of
// holds bytes reads back as.
func billedFor(t *testing.T, rc *ReadCost, key []byte, holds int64) {
	t.Helper()
	if need, got := rc.valueUnits(holds), rc.KeyBound(key); got < need {
		t.Fatalf("%q holds %d bytes (%d units), written through the proxy only; a read of it is billed %d (listed %d, largest value %d, in flight %d)",
			key, holds, need, got, rc.Listed(), rc.LargestValue(), rc.InFlight())
	}
}

// A write that waits, or that the throttle refuses and the client sends
// again, counts its bytes once however many attempts it makes; refused for
// good (Release), it leaves nothing behind.
func TestAppendCountsItsBytesOnceAcrossAttempts(t *testing.T) {
	rc, _ := newCostBucket(t)
	raiseAll(t, rc, []byte("s"), 1000)
	k := []byte("k")
	var a AppendRes
	for i := range 20 {
		if bound := rc.ReserveAppend(&a, k, 1000, 0); bound != 2000 {
			t.Fatalf("attempt %d: bound %d, want 2000", i, bound)
		}
	}
	a.Release()
	if f, lv := rc.InFlight(), rc.LargestValue(); f != 0 || lv != 1000 || a.Held() {
		t.Fatalf("after 20 attempts and a release: %d bytes in flight, largest value %d, held %v; want 0, 1000, false", f, lv, a.Held())
	}
}

// APPENDs of one key in flight together (two loops, a pipeline) each
// raise the key to its base plus all their bytes before they go, and each
// raise waits for the reads admitted before it: a GET of the key admitted
// before the second APPEND's raise is waited for, never finds 4,400
// bytes billed 1 unit. (The review of the earlier design found the second
// APPEND's bytes raised nothing while another write's raise waited, and
// its raise did not wait for old reads.)
func TestAppendsInFlightTogetherEachRaiseTheirKey(t *testing.T) {
	rc, b := newCostBucket(t)
	k := []byte("k")
	raiseAll(t, rc, k, 3000) // class 1
	var a1, a2 AppendRes
	if bound := reserveAll(t, rc, &a1, k, 700, 0); bound != 3700 {
		t.Fatalf("first APPEND's bound %d, want 3,700", bound)
	}
	old, _ := b.AdmitCost(nil, Blocking, Cost{Read: true, Key: k}) // a GET of k in flight
	if old.ReadBill() != 1 {
		t.Fatalf("the GET is billed %d, want 1", old.ReadBill())
	}
	bound := rc.ReserveAppend(&a2, k, 700, 0)
	if bound != 4400 {
		t.Fatalf("second APPEND's bound %d, want 4,400 (the first's bytes are in flight)", bound)
	}
	if rc.RaiseAppend(k, bound) {
		t.Fatal("the second APPEND may go while a GET billed 1 unit is in flight: memcached may run it first")
	}
	// A SET of another key waits too; the APPEND's raise still stands.
	if rc.RaiseKey([]byte("j"), 5000) {
		t.Fatal("a SET went during the APPEND's listing wait")
	}
	b.Settle(old, 1)
	if !rc.TryDrain() || !rc.RaiseAppend(k, bound) {
		t.Fatal("the second APPEND still waits after the GET settled")
	}
	billedFor(t, rc, k, 4400)
	a2.Complete(k, true) // answered in either order
	a1.Complete(k, true)
	billedFor(t, rc, k, 4400)
	var a3 AppendRes
	if base := rc.ReserveAppend(&a3, k, 0, 0); base < 4400 {
		t.Fatalf("k holds 4,400 bytes; a later APPEND starts from %d", base)
	}
	a3.Release()
}

// A NOT_STORED gives back the bytes in flight only: it lowers no record.
// k is listed (100,000 bytes); pipelined, APPEND k 20,000 (NOT_STORED: k
// was deleted) and SET k 110,000; then APPEND k 24,000 leaves 134,000
// bytes, billed for. (In the earlier design the give-back undid the SET.)
func TestAppendNotStoredLowersNoRecord(t *testing.T) {
	rc, _ := newCostBucket(t)
	k := []byte("k")
	raiseAll(t, rc, k, 100_000) // listed, class 32
	var a AppendRes
	reserveAll(t, rc, &a, k, 20_000, 0)
	raiseAll(t, rc, k, 110_000)
	a.Complete(k, false)
	var b AppendRes
	reserveAll(t, rc, &b, k, 24_000, 0)
	billedFor(t, rc, k, 134_000)
	b.Complete(k, true)
	billedFor(t, rc, k, 134_000)
	if f := rc.InFlight(); f != 0 {
		t.Fatalf("%d bytes in flight after both answered", f)
	}
}

// A completion of an APPEND of an earlier epoch (in flight across a
// FLUSH) changes nothing of the new epoch: neither its NOT_STORED nor its
// success.
func TestAppendOfAnEarlierEpochChangesNothing(t *testing.T) {
	rc, _ := newCostBucket(t)
	raiseAll(t, rc, []byte("x"), 1000)
	var lost, stored AppendRes
	reserveAll(t, rc, &lost, []byte("list1"), 300, 0)
	reserveAll(t, rc, &stored, []byte("x"), 5000, 0)
	rc.Reset(2) // FLUSH
	k2 := []byte("k2")
	raiseAll(t, rc, k2, 1000)
	var a AppendRes
	reserveAll(t, rc, &a, k2, 300, 0)
	lost.Complete([]byte("list1"), false)
	stored.Complete([]byte("x"), true)
	if f, lv := rc.InFlight(), rc.LargestValue(); f != 300 || lv != 1000 {
		t.Fatalf("after the old epoch's answers: %d in flight, largest value %d; want 300, 1000", f, lv)
	}
	a.Complete(k2, true)
	if f, lv := rc.InFlight(), rc.LargestValue(); f != 0 || lv != 1300 {
		t.Fatalf("after the new epoch's APPEND: %d in flight, largest value %d; want 0, 1300", f, lv)
	}
	// An attempt of an APPEND reserved before the FLUSH reserves anew.
	var w AppendRes
	rc.ReserveAppend(&w, k2, 100, 0)
	rc.Reset(3)
	if bound := rc.ReserveAppend(&w, k2, 100, 0); bound != 100 || rc.InFlight() != 100 {
		t.Fatalf("its attempt after the FLUSH: bound %d, %d in flight; want 100, 100", bound, rc.InFlight())
	}
	w.Release()
}

// APPENDs to missing keys (the "append, else add" idiom of lists) leave
// nothing once answered, whatever order they were answered in: 30 of 100
// bytes, all in flight before the first NOT_STORED, leave the largest
// value at the 10 bytes a SET wrote (the earlier design's give-back was
// last-in-first-out: 2,900 of the 3,000 bytes stayed). The class their
// bound needed (3,010 bytes: class 1 here) stays until a FLUSH.
func TestAppendsNotStoredLeaveNothingInAnyOrder(t *testing.T) {
	for _, order := range []string{"first", "last"} {
		rc, _ := newCostBucket(t)
		raiseAll(t, rc, []byte("s"), 10)
		var rs [30]AppendRes
		keys := make([][]byte, len(rs))
		for i := range rs {
			keys[i] = fmt.Appendf(nil, "l%02d", i)
			reserveAll(t, rc, &rs[i], keys[i], 100, 0)
		}
		for j := range rs {
			i := j
			if order == "last" {
				i = len(rs) - 1 - j
			}
			rs[i].Complete(keys[i], false)
		}
		if lv, f := rc.LargestValue(), rc.InFlight(); lv != 10 || f != 0 {
			t.Fatalf("answered %s-in-first: largest value %d, %d in flight; want 10, 0", order, lv, f)
		}
	}
}

// A listed key's NOT_STORED leaves every other key's record: with the list
// full (64 keys of 100,000 bytes, a 65th on the ceiling), APPEND k00 1,000
// (NOT_STORED), APPEND k64 3,150 (stored), APPEND k00 100 (NOT_STORED)
// leave k64 at 103,150 bytes, and an APPEND of 28,672 to it is billed
// 131,822.
func TestAppendNotStoredOfAListedKeyLeavesTheOthers(t *testing.T) {
	rc, _ := newCostBucket(t)
	key := func(i int) []byte { return fmt.Appendf(nil, "k%02d", i) }
	for i := 0; i < 65; i++ {
		raiseAll(t, rc, key(i), 100_000)
	}
	if rc.Listed() != maxLargeKeys || rc.Ceiling() != 32 {
		t.Fatalf("%d listed, ceiling %d", rc.Listed(), rc.Ceiling())
	}
	k0, k64 := key(0), key(64)
	var a1, a2, a3 AppendRes
	reserveAll(t, rc, &a1, k0, 1000, 0)
	reserveAll(t, rc, &a2, k64, 3150, 0)
	reserveAll(t, rc, &a3, k0, 100, 0)
	a2.Complete(k64, true)
	a1.Complete(k0, false)
	a3.Complete(k0, false)
	var a4 AppendRes
	if base := rc.ReserveAppend(&a4, k64, 0, 0); base < 103_150 {
		t.Fatalf("k64 holds 103,150 bytes; a later APPEND starts from %d", base)
	}
	a4.Release()
	reserveAll(t, rc, &a4, k64, 28_672, 0)
	a4.Complete(k64, true)
	billedFor(t, rc, k64, 131_822)
}

// An APPEND that lists its key folds its bytes onto the key's entry, not
// on the largest value of the other keys: a 1,001-byte key stays billed 1
// after an APPEND of 100,000 bytes to another.
func TestAppendThatListsItsKeyLeavesTheOthers(t *testing.T) {
	rc, _ := newCostBucket(t)
	raiseAll(t, rc, []byte("small"), 1001)
	k := []byte("big")
	var a AppendRes
	bound := reserveAll(t, rc, &a, k, 100_000, 0)
	a.Complete(k, true)
	if v := rc.LargestValue(); v != 1001 {
		t.Fatalf("the largest value of the keys not listed is %d after the APPEND listed its key, want 1001", v)
	}
	if got := rc.KeyBound([]byte("small")); got != 1 {
		t.Fatalf("small is billed %d, want 1", got)
	}
	billedFor(t, rc, k, bound)
}

// An APPEND that waited while a SET of its key went first raises again
// at its next attempt from the key as it then stands: memcached appends to
// the SET's value, and the key is billed both.
func TestAppendAfterASetOfItsKeyCoversBoth(t *testing.T) {
	rc, _ := newCostBucket(t)
	k := []byte("k")
	raiseAll(t, rc, k, 1000)
	var a AppendRes
	reserveAll(t, rc, &a, k, 20_000, 0) // first attempt: then it is held
	raiseAll(t, rc, k, 130_000)         // another connection's SET goes
	if bound := reserveAll(t, rc, &a, k, 20_000, 0); bound < 150_000 {
		t.Fatalf("the APPEND's attempt after the SET: bound %d, want at least 150,000", bound)
	}
	billedFor(t, rc, k, 150_000)
	a.Complete(k, true)
}

// The bytes appended to keys that are not listed add up in one bound
// (LargestValue), the documented worst case: 1,000 keys of 1,000 bytes
// each appended 1,000 bytes once leave it at 1,000 + 936 * 1,000 bytes (64
// keys were listed when their bound crossed a class, and keep theirs on
// their entries), every read billed that class, 256 units. A FLUSH ends
// it. Exact: a bound that grows faster, or a listing that stops earlier,
// fails it.
func TestAppendsToUnlistedKeysAddUpInOneBound(t *testing.T) {
	rc, _ := newCostBucket(t)
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%d", i) }
	for i := 0; i < 1000; i++ {
		raiseAll(t, rc, key(i), 1000)
	}
	for i := 0; i < 1000; i++ {
		var a AppendRes
		reserveAll(t, rc, &a, key(i), 1000, 1<<20)
		a.Complete(key(i), true)
	}
	if lv, n, c := rc.LargestValue(), rc.Listed(), rc.Ceiling(); lv != 937_000 || n != maxLargeKeys || c != 256 {
		t.Fatalf("largest value %d bytes, %d keys listed, ceiling %d; want 937,000, %d, 256", lv, n, c, maxLargeKeys)
	}
	rc.Reset(2)
	if lv, c := rc.LargestValue(), rc.Ceiling(); lv != 0 || c != 1 {
		t.Fatalf("after a FLUSH: largest value %d, ceiling %d; want 0, 1", lv, c)
	}
}

// Hot path: an APPEND's calls allocate nothing, listed key or not.
func TestAppendCallsDoNotAllocate(t *testing.T) {
	rc, _ := newCostBucket(t)
	big, small := []byte("big"), []byte("small")
	raiseAll(t, rc, big, 100_000)
	raiseAll(t, rc, small, 10)
	for _, k := range [][]byte{big, small} {
		n := testing.AllocsPerRun(1000, func() {
			var a AppendRes
			rc.RaiseAppend(k, rc.ReserveAppend(&a, k, 1, 1<<20))
			a.Complete(k, false)
		})
		if n != 0 {
			t.Fatalf("%s: %v allocations per APPEND", k, n)
		}
	}
}
