package throttle

import (
	"sync"
	"sync/atomic"
)

// ReadCost is the one estimator of what a bucket's reads may cost (docs
// "Design for issue 28"): the bucket's **ceiling**, a class of read units
// that bounds every value of the bucket's current namespace epoch, plus the
// exact largest value in bytes. Every read is billed the ceiling when
// admitted ([Bucket.AdmitCost]) and given back the difference when settled,
// so no read is billed below what it can cost.
//
// The classes are 1, 2, 4, ..., up to the largest power of two below M
// (Config.MaxReadUnits), then M, then doublings of M (items larger than
// the proxy was told of). The ceiling changes only thus:
//   - [ReadCost.Raise]: a write about to be forwarded raises it to cover its
//     value before it goes. When that crosses a class, the write must wait
//     until every read admitted under the old class has settled (Raise
//     reports false until then; [ReadCost.TryDrain] ends the wait), so a
//     read never finds a value written through the proxy above its bill;
//   - [ReadCost.Surprise]: a read that brought more than its bill (a value
//     written around the proxy) raises it at once;
//   - [ReadCost.Reset]: a FLUSH (a new epoch, every value gone) resets it
//     to class 1; [ReadCost.Restore] sets it from saved state.
//
// Nothing lowers it otherwise. All methods are safe for concurrent use; the
// read path (admission, settle) writes only per-lease memory.
type ReadCost struct {
	// state packs the class index (bits 0-7), a raise waiting for the
	// reads of the previous generation to drain (bit 8) and the
	// generation (bits 9-): one more at each raise that crosses a class
	// and at each reset.
	state atomic.Uint64
	bytes atomic.Int64 // the largest value of the epoch, in bytes
	epoch atomic.Uint64

	classes []int64 // units of each class
	unit    int64   // read unit size
	maxItem int64   // largest value a server stores (an APPEND's sum is capped there)

	// reads in flight by generation parity: those admitted through the
	// bucket (shared), and the per-lease counters (each written by its
	// lease's owner only)
	flight [2]atomic.Int64
	mu     sync.Mutex
	leases atomic.Pointer[[]*Lease]
}

const (
	rcIdxMask  = 0xff
	rcPending  = 1 << 8
	rcGenShift = 9
)

// keyRoom is the longest key memcached stores: a value of v bytes reads
// back as at most keyRoom + v bytes.
const keyRoom = 250

func (rc *ReadCost) init(maxRead, unit int64) {
	rc.unit = unit
	rc.maxItem = maxRead*unit - keyRoom
	for c := int64(1); c < maxRead; c *= 2 {
		rc.classes = append(rc.classes, c)
	}
	for c := maxRead; c <= 1<<30 && len(rc.classes) < rcIdxMask; c *= 2 {
		rc.classes = append(rc.classes, c)
	}
}

func rcGen(st uint64) uint64 { return st >> rcGenShift }

// Ceiling returns the units a read of the bucket is billed now.
func (rc *ReadCost) Ceiling() int64 { return rc.classes[rc.state.Load()&rcIdxMask] }

// LargestValue returns the largest value, in bytes, the ceiling knows of
// in the current epoch.
func (rc *ReadCost) LargestValue() int64 { return rc.bytes.Load() }

// classFor returns the index of the least class of at least units.
func (rc *ReadCost) classFor(units int64) uint64 {
	for i, c := range rc.classes {
		if c >= units {
			return uint64(i)
		}
	}
	return uint64(len(rc.classes) - 1)
}

// valueUnits returns the read units of a value of v bytes under the
// longest key.
func (rc *ReadCost) valueUnits(v int64) int64 { return ReadUnits(keyRoom+v, rc.unit) }

// Raise is called before a write with a value of v bytes is forwarded
// (appended: APPEND or PREPEND, whose bytes add to the value they extend,
// capped at the largest item). It reports whether the write may go now:
// false while a raise of the ceiling waits for reads admitted under the
// old class to settle (this one's, or another write's); the caller waits
// and calls Raise again (after reads of the bucket settle, or TryDrain
// reports true). It takes no lock and does not allocate.
func (rc *ReadCost) Raise(v int64, appended bool) bool {
	if appended {
		for {
			old := rc.bytes.Load()
			n := min(old+max(v, 0), max(rc.maxItem, old))
			if n == old || rc.bytes.CompareAndSwap(old, n) {
				v = n
				break
			}
		}
	} else {
		atomicMax(&rc.bytes, v)
	}
	need := rc.classFor(rc.valueUnits(v))
	for {
		st := rc.state.Load()
		if st&rcPending != 0 {
			return rc.TryDrain() && rc.Raise(v, false)
		}
		if need <= st&rcIdxMask {
			return true
		}
		n := (rcGen(st)+1)<<rcGenShift | rcPending | need
		if rc.state.CompareAndSwap(st, n) {
			return rc.TryDrain()
		}
	}
}

// Pending reports whether a raise waits for reads to drain.
func (rc *ReadCost) Pending() bool { return rc.state.Load()&rcPending != 0 }

// TryDrain ends a pending raise when every read admitted under the
// previous generation has settled; it reports whether no raise is pending
// any more. Writes waiting in Raise should be re-tried when it reports
// true after a settle.
func (rc *ReadCost) TryDrain() bool {
	st := rc.state.Load()
	if st&rcPending == 0 {
		return true
	}
	p := (rcGen(st) - 1) & 1
	n := rc.flight[p].Load()
	if ls := rc.leases.Load(); ls != nil {
		for _, l := range *ls {
			n += l.flight[p].Load()
		}
	}
	if n > 0 {
		return false
	}
	return rc.state.CompareAndSwap(st, st&^rcPending) || !rc.Pending()
}

// Surprise raises the ceiling at once to cover a read of units (its key
// and value) that brought more than it was billed, and records its value
// of v bytes.
func (rc *ReadCost) Surprise(units, v int64) {
	atomicMax(&rc.bytes, v)
	need := rc.classFor(units)
	for {
		st := rc.state.Load()
		if need <= st&rcIdxMask || rc.state.CompareAndSwap(st, st&^rcIdxMask|need) {
			return
		}
	}
}

// Reset starts the new epoch of a FLUSH: every value is gone, the ceiling
// is class 1.
func (rc *ReadCost) Reset(epoch uint64) { rc.Restore(epoch, 1) }

// Restore sets the epoch and the ceiling to the least class of at least
// units (from a state file, a fleet's store, or a start).
func (rc *ReadCost) Restore(epoch uint64, units int64) {
	idx := rc.classFor(units)
	rc.epoch.Store(epoch)
	rc.bytes.Store(0)
	for {
		st := rc.state.Load()
		if rc.state.CompareAndSwap(st, (rcGen(st)+1)<<rcGenShift|idx) {
			return
		}
	}
}

// Snapshot returns the epoch and the ceiling in units, as Restore takes
// them.
func (rc *ReadCost) Snapshot() (epoch uint64, units int64) {
	return rc.epoch.Load(), rc.Ceiling()
}

// admitRead counts a read in flight in c (one of the parity pairs),
// under a generation that cannot be raised from without seeing it, and
// returns the units to bill and the counter to settle.
func (rc *ReadCost) admitRead(c *[2]atomic.Int64) (int64, *atomic.Int64) {
	for {
		st := rc.state.Load()
		f := &c[rcGen(st)&1]
		f.Add(1)
		if st2 := rc.state.Load(); rcGen(st2) == rcGen(st) {
			// A raise crossing this generation comes after this load,
			// and sees the count. A Surprise may have raised the class
			// meanwhile: the later reading bills it.
			return rc.classes[st2&rcIdxMask], f
		}
		f.Add(-1)
	}
}

// register adds a lease's counters to those TryDrain reads.
func (rc *ReadCost) register(l *Lease) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var ls []*Lease
	if old := rc.leases.Load(); old != nil {
		ls = append(ls, *old...)
	}
	ls = append(ls, l)
	rc.leases.Store(&ls)
}

func atomicMax(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}
