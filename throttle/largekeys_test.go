package throttle

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// mib is the class of a value of 1 MiB less 512 bytes under the longest
// key (256 units).
const mib = 256

// A write of a large value lists its key: reads of that key are billed
// its class, every other read the ceiling; a listing waits for the reads
// admitted before it, but reads admitted after it are billed the new
// class at once; a FLUSH empties the list.
func TestLargeKeyListed(t *testing.T) {
	e, _ := newCostEngine(t, Unlimited)
	b, _ := e.AddBucket("a", 0, Unlimited)
	rc := b.ReadCost()
	rc.Reset(1)
	read := func(key string) Grant {
		g, _ := b.AdmitCost(nil, Blocking, Cost{Read: true, Key: []byte(key)})
		return g
	}
	if !rc.RaiseKey([]byte("small"), 100) {
		t.Fatal("a 100-byte write waited: it fits class 1")
	}
	old := read("big") // in flight while big is listed
	if old.Paid() != 1 {
		t.Fatalf("a read of an unlisted key billed %d, want the ceiling 1", old.Paid())
	}
	if rc.RaiseKey([]byte("big"), 1<<20-512) {
		t.Fatal("a listing went while a read admitted before it was in flight")
	}
	if g := read("big"); g.Paid() != mib {
		t.Fatalf("a read of the listed key billed %d, want its class %d", g.Paid(), mib)
	} else {
		b.Settle(g, 1)
	}
	if g := read("small"); g.Paid() != 1 {
		t.Fatalf("a read of another key billed %d beside one listed key, want the ceiling 1", g.Paid())
	} else {
		b.Settle(g, 1)
	}
	if c, bound := rc.Ceiling(), rc.Bound(); c != 1 || bound != mib || rc.Listed() != 1 {
		t.Fatalf("ceiling %d, bound %d, %d listed; want 1, %d, 1", c, bound, rc.Listed(), mib)
	}
	if rc.RaiseKey([]byte("other"), 10) {
		t.Fatal("a write went while a listing waits for the reads before it")
	}
	b.Settle(old, 1)
	if !rc.RaiseKey([]byte("big"), 1<<20-512) || !rc.RaiseKey([]byte("other"), 10) {
		t.Fatal("the listing still waits after the read before it settled")
	}
	if ep, c := rc.Snapshot(); ep != 1 || c != mib {
		t.Fatalf("snapshot (%d, %d), want (1, %d): the bound is saved", ep, c, mib)
	}
	// APPEND to a listed key adds to its largest value, at most the
	// server's item size (1 MiB).
	if !appendWent(rc, []byte("big"), 4096, 1<<20) {
		t.Fatal("an append waited with no read in flight")
	}
	if g := read("big"); g.Paid() != testM { // (capped at the largest item)
		t.Fatalf("after an append to the listed key its read is billed %d, want %d", g.Paid(), testM)
	} else {
		b.Settle(g, 1)
	}
	rc.Reset(2)
	if g := read("big"); g.Paid() != 1 || rc.Listed() != 0 || rc.Bound() != 1 {
		t.Fatalf("after a reset: a read of the old large key billed %d, %d listed, bound %d; want 1, 0, 1", g.Paid(), rc.Listed(), rc.Bound())
	}
}

// fullList returns the read cost of a new bucket (epoch 1) whose list of
// large keys is full: k0 ... k63, 100,000 bytes each (class 32).
func fullList(t *testing.T) (*ReadCost, *Bucket) {
	t.Helper()
	rc, b := newCostBucket(t)
	for i := 0; i < maxLargeKeys; i++ {
		if !rc.RaiseKey(fmt.Appendf(nil, "k%d", i), 100_000) {
			t.Fatalf("listing %d waited with no read in flight", i)
		}
	}
	return rc, b
}

// A full list raises the ceiling, as before the list: the 65th large key
// bills every unlisted key its class.
func TestLargeKeyListFull(t *testing.T) {
	rc, _ := fullList(t)
	if rc.Listed() != maxLargeKeys || rc.Ceiling() != 1 {
		t.Fatalf("%d listed, ceiling %d; want %d, 1", rc.Listed(), rc.Ceiling(), maxLargeKeys)
	}
	if !rc.RaiseKey([]byte("one more"), 100_000) {
		t.Fatal("a raise waited with no read in flight")
	}
	if rc.Listed() != maxLargeKeys || rc.Ceiling() != 32 {
		t.Fatalf("after the 65th large key: %d listed, ceiling %d; want %d, 32", rc.Listed(), rc.Ceiling(), maxLargeKeys)
	}
	// A listed key still takes a larger value as a listing.
	if !rc.RaiseKey([]byte("k3"), 1<<20-512) || rc.Ceiling() != 32 || rc.Bound() != mib {
		t.Fatalf("a listed key's larger value: ceiling %d, bound %d; want 32, %d", rc.Ceiling(), rc.Bound(), mib)
	}
}

// Under concurrent readers and writers: once a write's RaiseKey reports
// true, no read of its key billed below the value's class is in flight,
// and every read admitted after that is billed at least that class.
func TestLargeKeyConcurrentListing(t *testing.T) {
	e, _ := newCostEngine(t, Unlimited)
	b, _ := e.AddBucket("a", 0, Unlimited)
	rc := b.ReadCost()
	rc.Reset(1)
	const keys = 80 // more than the list holds: the ceiling rises too
	var (
		low   [keys]atomic.Int64 // reads of each key billed below M, in flight
		large [keys]atomic.Bool  // the key's large write may go
		wg    sync.WaitGroup
		stop  atomic.Bool
		fail  atomic.Value
	)
	key := func(i int) []byte { return fmt.Appendf(nil, "key-%d", i) }
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(seed, 1))
			for !stop.Load() {
				i := rnd.IntN(keys)
				wasLarge := large[i].Load()
				g, _ := b.AdmitCost(nil, Blocking, Cost{Read: true, Key: key(i)})
				if g.Paid() < mib {
					if wasLarge {
						fail.CompareAndSwap(nil, fmt.Sprintf("key %d listed, then read billed %d", i, g.Paid()))
					}
					low[i].Add(1)
					runtime.Gosched() // in flight a while
					low[i].Add(-1)
				}
				b.Settle(g, 1)
			}
		}(uint64(r))
	}
	for i := 0; i < keys; i++ {
		for !rc.RaiseKey(key(i), 1<<20-512) {
			rc.TryDrain()
		}
		if n := low[i].Load(); n != 0 {
			fail.CompareAndSwap(nil, fmt.Sprintf("key %d's write went with %d reads billed below its class in flight", i, n))
		}
		large[i].Store(true)
	}
	stop.Store(true)
	wg.Wait()
	if f := fail.Load(); f != nil {
		t.Fatal(f)
	}
	if rc.Listed() != maxLargeKeys || rc.Ceiling() != mib {
		t.Fatalf("%d listed, ceiling %d; want %d, %d", rc.Listed(), rc.Ceiling(), maxLargeKeys, mib)
	}
}

// A bucket's debt (Owe: a surprise's excess its session could not pay) is
// billed with its next admitted command, on the gauge that admits it, and
// is not given back when that command settles; a command held keeps the
// debt for the next.
func TestDebtBilledWithNextCommand(t *testing.T) {
	e, clk := newCostEngine(t, Unlimited)
	b, _ := e.AddBucket("a", 0, 1000) // hard limit 1,000/s: burst 100
	b.ReadCost().Reset(1)
	clk.Advance(time.Second)
	b.Owe(244)
	g, _ := b.AdmitCost(nil, Blocking, Cost{Read: true})
	if g.Domain == Held || g.Paid() != 245 || g.ReadBill() != 1 {
		t.Fatalf("first command after the debt: domain %v, paid %d, read bill %d; want admitted (gauge paid up), 245, 1", g.Domain, g.Paid(), g.ReadBill())
	}
	b.Settle(g, 1)
	// The debt stays billed: the gauge is 245 ms ahead, so a bill of 1
	// waits until 146 ms have passed (245 - the burst's 100, less its own).
	if g2, wait := b.AdmitCost(nil, NonBlocking, Cost{Known: 1}); g2.Domain != Held || wait != 146*ms {
		t.Fatalf("next command: domain %v, wait %v; want held for 146ms", g2.Domain, wait)
	}
	b.Owe(50)
	if g3, _ := b.AdmitCost(nil, NonBlocking, Cost{Known: 1}); g3.Domain != Held {
		t.Fatal("a command over the gauge admitted with a debt")
	}
	clk.Advance(time.Second)
	if g4, _ := b.AdmitCost(nil, NonBlocking, Cost{Known: 1}); g4.Paid() != 51 {
		t.Fatalf("the debt kept by a held command: next bill %d, want 51", g4.Paid())
	}
}

// A bucket's debt is paid in parts of at most one largest read (M units),
// one with each of its next commands: a gauge others share (here the free
// pool, 1,000 units/s, burst 100 ms) takes no more of it at once than of
// one large read. Ten closed surprises of 244 units (2,440) charged with
// one command held a pool neighbour's 1-unit command for 2.34 s.
func TestDebtPaidInPartsOfOneLargestRead(t *testing.T) {
	for _, mode := range []Mode{Blocking, Unthrottled} {
		t.Run(fmt.Sprint("mode=", mode), func(t *testing.T) {
			e, clk := newCostEngine(t, 1000)
			noisy, _ := e.AddBucket("noisy", 0, Unlimited)
			calm, _ := e.AddBucket("calm", 0, Unlimited)
			clk.Advance(time.Second)
			noisy.Owe(2440)
			var w Waiter
			g, _ := noisy.AdmitCost(&w, mode, Cost{Known: 1})
			if g.Domain == Held || g.Paid() != 1+testM {
				t.Fatalf("noisy's next command: domain %v, paid %d; want admitted, 1 + one largest read (%d)", g.Domain, g.Paid(), 1+testM)
			}
			noisy.Settle(g, 1)
			// The pool is 1 + M ms ahead: a bill waits until it is no more
			// than the burst ahead (the free pool admits any bill then).
			want := time.Duration(1+testM)*ms - 100*ms
			if gc, wait := calm.AdmitCost(nil, NonBlocking, Cost{Known: 1}); gc.Domain != Held || wait != want {
				t.Fatalf("a pool neighbour's 1-unit command: domain %v, wait %v; want held for %v", gc.Domain, wait, want)
			}
			for paid := int64(testM); paid < 2440; paid += testM {
				clk.Advance(time.Second)
				g, _ := noisy.AdmitCost(&w, mode, Cost{Known: 1})
				if want := 1 + min(testM, 2440-paid); g.Domain == Held || g.Paid() != want {
					t.Fatalf("after %d of the debt paid: domain %v, paid %d; want %d", paid, g.Domain, g.Paid(), want)
				}
				noisy.Settle(g, 1)
			}
			clk.Advance(time.Second)
			if g, _ := noisy.AdmitCost(&w, mode, Cost{Known: 1}); g.Paid() != 1 {
				t.Fatalf("the debt paid: next bill %d, want 1", g.Paid())
			}
		})
	}
}

// appendBilled appends v bytes to key (as the proxy does; it must go)
// and fails when a read of key is then billed less than a value of
// stored bytes reads back as.
func appendBilled(t *testing.T, rc *ReadCost, key []byte, v, stored int64) {
	t.Helper()
	if !appendWent(rc, key, v, 0) {
		t.Fatalf("the APPEND to %q waited with no read in flight", key)
	}
	if need, got := rc.valueUnits(stored), rc.KeyBound(key); got < need {
		t.Fatalf("%q holds %d bytes (%d units) after the APPEND went; a read of it is billed %d", key, stored, need, got)
	}
}

// A write that raises the ceiling because the list is full records its
// value: an APPEND to its key starts from that value, not from the
// largest one before it.
func TestAppendToKeyBeyondTheListStartsFromItsValue(t *testing.T) {
	rc, _ := fullList(t)
	x := []byte("x")
	if !rc.RaiseKey(x, 100_000) || rc.Listed() != maxLargeKeys || rc.Ceiling() != 32 {
		t.Fatalf("the 65th large key: ceiling %d, %d listed; want class 32, the list full", rc.Ceiling(), rc.Listed())
	}
	appendBilled(t, rc, x, 100_000, 200_000)
}

// A listed key whose class the ceiling has since reached still has its
// class as the bound of its value: an APPEND to it starts from there.
func TestAppendToListedKeyAtTheCeilingStartsFromItsClass(t *testing.T) {
	e, _ := newCostEngine(t, Unlimited)
	b, _ := e.AddBucket("a", 0, Unlimited)
	rc := b.ReadCost()
	rc.Reset(1)
	k := []byte("k")
	if !rc.RaiseKey(k, 120_000) { // class 32
		t.Fatal("listing waited")
	}
	for i := 1; i < maxLargeKeys; i++ {
		if !rc.RaiseKey(fmt.Appendf(nil, "k%d", i), 10_000) { // class 4
			t.Fatalf("listing %d waited", i)
		}
	}
	if !rc.RaiseKey([]byte("y"), 70_000) || rc.Ceiling() != 32 { // the 65th
		t.Fatalf("the ceiling is %d after the 65th large key, want 32", rc.Ceiling())
	}
	appendBilled(t, rc, k, 40_000, 160_000)
}

// A ceiling restored from saved state, or raised by a surprise whose
// value's size is not known, bounds every value by what its class holds:
// an APPEND to a key written before starts from there.
func TestAppendAfterRestoreOrSurpriseStartsFromTheCeiling(t *testing.T) {
	e, _ := newCostEngine(t, Unlimited)
	b, _ := e.AddBucket("a", 0, Unlimited)
	rc := b.ReadCost()
	rc.Restore(1, 32) // a value of up to 130,822 bytes may be stored
	appendBilled(t, rc, []byte("old"), 20_000, 150_000)

	rc.Reset(2)
	rc.Surprise(32, 0) // another instance read 32 units
	appendBilled(t, rc, []byte("around"), 20_000, 150_000)
}

// A listed key's units are kept in 20 bits, saturating: with a small
// read_unit_size (1 byte is accepted) a value above 1,048,575 units does
// not fit, and its class bounds it instead. A key of 2,000,000 bytes of
// 1-byte units appended 1,000,000 holds 3,000,000: before, the APPEND
// started from the saturated field and the key was billed 2,097,152.
func TestAppendToListedKeyBeyondTheUnitsField(t *testing.T) {
	const item = 4 << 20 // memcached -I 4m
	e, err := New(Config{Capacity: Unlimited, Burst: 100 * ms, MaxReadUnits: item + 250, ReadUnitSize: 1, Clock: NewFakeClock(0)})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := e.AddBucket("a", 0, Unlimited)
	rc := b.ReadCost()
	rc.Reset(1)
	k := []byte("k")
	if !rc.RaiseKey(k, 2_000_000) {
		t.Fatal("the listing waited with no read in flight")
	}
	if !appendWent(rc, k, 1_000_000, item) {
		t.Fatal("the APPEND waited with no read in flight")
	}
	if need, got := rc.valueUnits(3_000_000), rc.KeyBound(k); got < need {
		t.Fatalf("k holds 3,000,000 bytes (%d units of 1 byte); a read of it is billed %d", need, got)
	}
}

// Appends to one key from many writers at once each add their bytes: the
// last to reserve returns the value all of them can leave (on two loops,
// two APPENDs that both started from the same size left the value above
// both estimates).
func TestConcurrentAppendsEachCount(t *testing.T) {
	for _, listed := range []bool{false, true} {
		t.Run(fmt.Sprint("listed=", listed), func(t *testing.T) {
			e, _ := newCostEngine(t, Unlimited)
			b, _ := e.AddBucket("a", 0, Unlimited)
			rc := b.ReadCost()
			rc.Reset(1)
			key, size := []byte("k"), int64(1000)
			if listed {
				size = 100_000
			}
			if !rc.RaiseKey(key, size) || (rc.Listed() == 1) != listed {
				t.Fatalf("the first write: %d listed", rc.Listed())
			}
			const writers, each = 8, 1000
			var wg sync.WaitGroup
			var most atomic.Int64
			for range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						atomicMax(&most, appendBound(rc, key, 10, 0))
					}
				}()
			}
			wg.Wait()
			if got, want := most.Load(), size+writers*each*10; got < want {
				t.Fatalf("%d appends of 10 bytes to %d: the estimate is %d bytes, want at least %d", writers*each, size, got, want)
			}
		})
	}
}

// A reset (FLUSH) racing an APPEND's compare-and-swap on a listed key's
// slot leaves no word without a key's tag (a slot nobody owns, never
// emptied by a later reset while nothing is listed) and grows no other
// key's entry: the APPEND finds its key gone and stops. Two goroutines
// append while the list is reset and the key listed again, 50,000 times
// (before, a stray word showed in every run).
func TestResetDuringAppendLeavesNoStraySlot(t *testing.T) {
	e, _ := newCostEngine(t, Unlimited)
	b, _ := e.AddBucket("a", 0, Unlimited)
	rc := b.ReadCost()
	k := []byte("k")
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				appendBound(rc, k, 1, 0)
			}
		}()
	}
	defer func() { stop.Store(true); wg.Wait() }()
	stray := func(ep uint64) {
		for i := range rc.large.slots {
			if w := rc.large.slots[i].Load(); w != 0 && w&lkTagMask == 0 {
				t.Fatalf("at reset %d, slot %d holds %#x: units %d, class %d, no key's tag", ep, i, w, lkUnits(w), lkClass(w))
			}
		}
	}
	// Under -race 5,000 (the race detector sees the two writers meet the
	// reset on every one; make test counts the 50,000 without it).
	for ep, n := uint64(1), testmc.UnderRace[uint64](50_000, 5_000); ep <= n; ep++ {
		stray(ep)
		rc.Reset(ep)
		stray(ep)
		for !rc.RaiseKey(k, 100_000) {
			rc.TryDrain()
		}
	}
}
