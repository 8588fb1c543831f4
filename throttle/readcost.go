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
// Beside the ceiling it keeps a short list of large keys (up to 64, each
// with the class of its largest value): a read of a listed key is billed
// the larger of the ceiling and its class, so one large value does not
// raise the bill of every read of the bucket.
//
// The classes are 1, 2, 4, ..., up to the largest power of two below M
// (Config.MaxReadUnits), then M, then doublings of M (items larger than
// the proxy was told of). The ceiling and the list change only thus:
//   - [ReadCost.RaiseKey]: a write about to be forwarded lists its key at
//     the class of its value, or raises the ceiling when the list is full,
//     before it goes. When that raises what a read of the key is billed,
//     the write must wait until every read admitted before has settled
//     (RaiseKey reports false until then; [ReadCost.TryDrain] ends the
//     wait), so a read never finds a value written through the proxy
//     above its bill;
//   - [ReadCost.RaiseAppend]: the same for an APPEND or PREPEND, whose
//     value's size is its key's base plus the bytes of every APPEND in
//     flight ([ReadCost.ReserveAppend], readcost_append.go);
//   - [ReadCost.Surprise]: a read that brought more than its bill (a value
//     written around the proxy) raises it at once;
//   - [ReadCost.Reset]: a FLUSH (a new epoch, every value gone) resets it
//     to class 1 and empties the list; [ReadCost.Restore] sets it from
//     saved state (the list empty: saved state holds the bound alone).
//
// Nothing lowers it otherwise. All methods are safe for concurrent use; the
// read path (admission, settle) writes only per-lease memory.
type ReadCost struct {
	// state packs the class index (bits 0-7), a raise waiting for the
	// reads of the previous generation to drain (bit 8), a listing under
	// way (bit 9) and the generation (bits 10-): one more at each raise
	// that crosses a class, each listing, and each reset.
	state atomic.Uint64
	bytes atomic.Int64 // the largest value of the epoch, in bytes
	epoch atomic.Uint64

	classes []int64 // units of each class
	unit    int64   // read unit size

	// reads in flight by generation parity: those admitted through the
	// bucket (shared), and the per-lease counters (each written by its
	// lease's owner only)
	flight [2]atomic.Int64
	mu     sync.Mutex
	leases atomic.Pointer[[]*Lease]

	// raiseMu orders the raises that start a drain, the listings and the
	// resets; reads and the writes that raise nothing take no lock.
	raiseMu sync.Mutex
	large   largeKeys

	// appMu guards the bytes of the APPENDs and PREPENDs in flight
	// (pend) of epoch appEpoch, and orders their folds
	// (readcost_append.go) and the resets. Taken after raiseMu (restore),
	// never before it.
	appMu    sync.Mutex
	appEpoch uint64
	pend     int64
}

const (
	rcIdxMask  = 0xff
	rcPending  = 1 << 8
	rcListing  = 1 << 9
	rcGenShift = 10
)

// keyRoom is the longest key memcached stores: a value of v bytes reads
// back as at most keyRoom + v bytes.
const keyRoom = 250

func (rc *ReadCost) init(maxRead, unit int64) {
	rc.unit = unit
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

// Bound returns the most a read of the bucket is billed now: the ceiling,
// or a listed key's class (what state files and the fleet's store keep).
func (rc *ReadCost) Bound() int64 {
	c := rc.Ceiling()
	if rc.large.n.Load() > 0 {
		c = max(c, rc.classes[rc.large.top.Load()])
	}
	return c
}

// KeyBound returns what a read of key is billed now: the ceiling, or the
// key's class when it is listed above it.
func (rc *ReadCost) KeyBound(key []byte) int64 {
	k, _ := rc.classOf(key, rc.state.Load())
	return rc.classes[k]
}

// Listed returns how many keys the list of large keys holds.
func (rc *ReadCost) Listed() int { return int(rc.large.n.Load()) }

// LargestValue returns a bound, in bytes, of every value of the current
// epoch but those of keys listed above the ceiling and the bytes of the
// APPENDs in flight: the largest written or read, or what the ceiling
// holds when restored, grown by what APPENDs to keys not listed stored.
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

// Raise is RaiseKey for a write whose key is not known: it raises the
// ceiling itself.
func (rc *ReadCost) Raise(v int64) bool { return rc.RaiseKey(nil, v) }

// RaiseKey is called before a write of key with a value of v bytes is
// forwarded (an APPEND or PREPEND calls RaiseAppend). When what a read of key
// is billed does not cover the value, it lists key at the value's class
// (or raises its class), or raises the ceiling when the list is full or
// key is nil. It reports whether the write may go now: false while a raise
// waits for the reads admitted before it to settle (this one's, or another
// write's), or while another write lists its key; the caller waits and
// calls RaiseKey again (after reads of the bucket settle, or TryDrain
// reports true). A write that raises nothing takes no lock and does not
// allocate.
func (rc *ReadCost) RaiseKey(key []byte, v int64) bool { return rc.raiseKey(key, v, false) }

// raiseKey is RaiseKey, and RaiseAppend when app is set: then v is the
// bound ReserveAppend gave, and nothing is recorded of it.
func (rc *ReadCost) raiseKey(key []byte, v int64, app bool) bool {
	units := rc.valueUnits(v)
	need := rc.classFor(units)
	for {
		st := rc.state.Load()
		if st&rcPending != 0 {
			if !rc.TryDrain() {
				return false
			}
			continue
		}
		if st&rcListing != 0 {
			return false // another write's listing: a few instructions
		}
		cur, above := rc.classOf(key, st)
		if need > cur {
			return rc.raiseTo(key, need, v, app)
		}
		switch {
		case app: // its bytes are in flight until it completes
		case above:
			rc.large.grow(key, func(int64, uint64) int64 { return units })
		default:
			atomicMax(&rc.bytes, v)
		}
		if rc.state.Load() == st {
			return true // (no listing began after the entry was read)
		}
	}
}

// classOf returns the class index a read of key is billed under state st,
// and whether key is listed above the ceiling.
func (rc *ReadCost) classOf(key []byte, st uint64) (uint64, bool) {
	c := st & rcIdxMask
	if key == nil || rc.large.n.Load() == 0 {
		return c, false
	}
	if k, ok := rc.large.class(key); ok && k > c {
		return k, true
	}
	return c, false
}

// raiseTo makes a read of key billed at least class need (listing key, or
// raising the ceiling and recording the value of v bytes as the largest),
// and starts the wait for the reads admitted before to settle. It reports
// what RaiseKey does. For an APPEND (app) it records no size: a key it
// lists has units 0 (LargestValue bounds it until the APPEND's bytes fold
// onto its entry: AppendRes.Complete).
func (rc *ReadCost) raiseTo(key []byte, need uint64, v int64, app bool) bool {
	record := func() {
		if !app {
			atomicMax(&rc.bytes, v)
		}
	}
	units := rc.valueUnits(v)
	if app {
		units = 0
	}
	rc.raiseMu.Lock()
	defer rc.raiseMu.Unlock()
	st := rc.state.Load()
	switch {
	case st&(rcPending|rcListing) != 0:
		return false
	case need <= st&rcIdxMask:
		record()
		return true // a surprise raised the ceiling meanwhile
	}
	if key != nil && rc.state.CompareAndSwap(st, st|rcListing) {
		// The entry is written before the generation moves on: a read
		// of the new generation finds it, one of the old is waited for.
		listed := rc.large.list(key, need, units)
		for {
			st = rc.state.Load()
			n := st &^ rcListing
			if listed {
				n = (rcGen(st)+1)<<rcGenShift | rcPending | st&rcIdxMask
			}
			if rc.state.CompareAndSwap(st, n) {
				break
			}
		}
		if listed {
			return rc.TryDrain()
		}
	}
	// The list is full, or key unknown: the ceiling covers the value, and
	// the value is recorded before the write can go, so that a later
	// APPEND to key starts from it.
	record()
	for {
		st = rc.state.Load()
		if need <= st&rcIdxMask {
			return true
		}
		n := (rcGen(st)+1)<<rcGenShift | rcPending | need
		if rc.state.CompareAndSwap(st, n) {
			return rc.TryDrain()
		}
	}
}

// Generation counts the raises that crossed a class, the listings and the
// resets so far: a write that saw it move while it went may have ended
// another write's wait (RaiseKey reports false during a listing).
func (rc *ReadCost) Generation() uint64 { return rcGen(rc.state.Load()) }

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
// of v bytes (v <= 0: not known, the most a read of units can hold).
func (rc *ReadCost) Surprise(units, v int64) {
	if v <= 0 {
		v = units*rc.unit - keyRoom
	}
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
// is class 1, the list of large keys empty.
func (rc *ReadCost) Reset(epoch uint64) { rc.restore(epoch, 0, 0) }

// Restore sets the epoch and the ceiling to the least class of at least
// units (from a state file, a fleet's store, or a start), the list of
// large keys empty. The values of the epoch are not known: each counts as
// the most a read of the ceiling's class can hold.
func (rc *ReadCost) Restore(epoch uint64, units int64) {
	idx := rc.classFor(units)
	rc.restore(epoch, idx, rc.classes[idx]*rc.unit-keyRoom)
}

func (rc *ReadCost) restore(epoch uint64, idx uint64, largest int64) {
	rc.raiseMu.Lock()
	defer rc.raiseMu.Unlock()
	// The APPENDs in flight of the old epoch end here: a completion that
	// read the old epoch folds before the records are reset, one after
	// finds the new epoch and does nothing.
	rc.appMu.Lock()
	defer rc.appMu.Unlock()
	rc.appEpoch, rc.pend = epoch, 0
	rc.epoch.Store(epoch)
	rc.bytes.Store(largest)
	// The ceiling moves first, marked as a listing: until the list is
	// empty, a read is billed the larger of the new ceiling and a listed
	// class (never less than either), and a write waits, as it does for
	// any listing, rather than trust an entry about to go.
	rc.setState(func(st uint64) uint64 { return (rcGen(st)+1)<<rcGenShift | rcListing | idx })
	rc.large.reset()
	rc.setState(func(st uint64) uint64 { return st &^ rcListing })
}

// setState replaces the state st with next(st), atomically.
func (rc *ReadCost) setState(next func(uint64) uint64) {
	for {
		st := rc.state.Load()
		if rc.state.CompareAndSwap(st, next(st)) {
			return
		}
	}
}

// Snapshot returns the epoch and the bound in units, as Restore takes
// them.
func (rc *ReadCost) Snapshot() (epoch uint64, units int64) {
	return rc.epoch.Load(), rc.Bound()
}

// admitRead counts a read of key (nil: unknown) in flight in c (one of
// the parity pairs), under a generation that cannot be raised from
// without seeing it, and returns the units to bill and the counter to
// settle.
func (rc *ReadCost) admitRead(c *[2]atomic.Int64, key []byte) (int64, *atomic.Int64) {
	for {
		st := rc.state.Load()
		f := &c[rcGen(st)&1]
		f.Add(1)
		if st2 := rc.state.Load(); rcGen(st2) == rcGen(st) {
			// A raise crossing this generation comes after this load,
			// and sees the count; a listing of this generation wrote
			// its entry before. A Surprise may have raised the class
			// meanwhile: the later reading bills it.
			k, _ := rc.classOf(key, st2)
			return rc.classes[k], f
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
