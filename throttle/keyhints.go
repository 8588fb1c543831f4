package throttle

import (
	"hash/maphash"
	"sync/atomic"
)

// Key hints (docs/throttling.md, "Design for issue 28", rule 1b): what a
// read of a key the bucket has seen brought last, so that it is billed that
// and not the bucket's ceiling. Without them a bucket holding one large
// value beside small ones pays the large one's units up front for every
// read, and when that passes its burst it runs one read per round trip.
//
// A hint is not a fact: a value written around this instance, two keys
// whose hashes share an entry, or a write racing the read can make a read
// bring more than its bill. The caller pays that excess before it
// delivers the read (a surprise, rule 3), so a wrong hint delays the
// reading bucket and overruns no gauge.

// KeyHash is a key's hash for the hint table ([HashKey]); 0 stands for no
// key (the read is billed the ceiling).
type KeyHash uint64

// hintSeed is the process's seed: a tenant cannot choose keys that share
// an entry (and could gain nothing by it but its own waits).
var hintSeed = maphash.MakeSeed()

// HashKey returns the hash of key (as the client names it, without the
// bucket's namespace) for [Cost.Key] and [ReadCost.Record]; never 0. It
// does not allocate.
func HashKey(key []byte) KeyHash {
	if h := KeyHash(maphash.Bytes(hintSeed, key)); h != 0 {
		return h
	}
	return 1
}

// The table: hintEntries direct-mapped entries, each the tag (the hash's
// top 64 - hintUnitBits bits) and the units (the low hintUnitBits bits, at
// least 1: an entry of 0 is empty), indexed by the hash's low hintIndexBits
// bits.
const (
	hintIndexBits = 12
	hintEntries   = 1 << hintIndexBits
	hintUnitBits  = 24
	hintMaxUnits  = 1<<hintUnitBits - 1
)

type hintTable [hintEntries]atomic.Uint64

func hintTag(h KeyHash) uint64 { return uint64(h) >> hintUnitBits << hintUnitBits }

func hintSlot(t *hintTable, h KeyHash) *atomic.Uint64 { return &t[uint64(h)&(hintEntries-1)] }

// hint returns the units the table holds for h, 0 when it holds none.
func (rc *ReadCost) hint(h KeyHash) int64 {
	t := rc.hints.Load()
	if t == nil || h == 0 {
		return 0
	}
	e := hintSlot(t, h).Load()
	if e == 0 || e&^hintMaxUnits != hintTag(h) {
		return 0
	}
	return int64(e & hintMaxUnits)
}

// bill returns the units a read of key h is billed when the ceiling is
// ceil: its hint when the table holds one below the ceiling, else the
// ceiling.
func (rc *ReadCost) bill(ceil int64, h KeyHash) int64 {
	if u := rc.hint(h); u > 0 && u < ceil {
		return u
	}
	return ceil
}

// Bill returns the units a read of key h would be billed now: its hint,
// when the bucket has one below its ceiling, else the ceiling.
func (rc *ReadCost) Bill(h KeyHash) int64 { return rc.bill(rc.Ceiling(), h) }

// table returns the hint table, allocating it on first use.
func (rc *ReadCost) table() *hintTable {
	if t := rc.hints.Load(); t != nil {
		return t
	}
	rc.hints.CompareAndSwap(nil, new(hintTable))
	return rc.hints.Load()
}

// Record notes that a read of key h brought units (its key and value, or 1
// for a miss): the key's next reads are billed that. A read whose answer
// does not tell the value's size (an error, a meta get without its value)
// must not be recorded. It takes no lock, and writes only when the entry
// changes.
func (rc *ReadCost) Record(h KeyHash, units int64) {
	if h == 0 {
		return
	}
	e := hintSlot(rc.table(), h)
	if units < 1 || units > hintMaxUnits {
		rc.forget(e, h)
		return
	}
	if n := hintTag(h) | uint64(units); e.Load() != n {
		e.Store(n)
	}
}

// RecordWrite notes, before a write of key h is forwarded, that a read of
// the key may bring units: its hint becomes the larger of what it held and
// units (a write that memcached refuses, a failed add or cas, leaves the
// old value, which no smaller hint must under-bill). It takes no lock.
func (rc *ReadCost) RecordWrite(h KeyHash, units int64) {
	if h == 0 {
		return
	}
	e := hintSlot(rc.table(), h)
	if units > hintMaxUnits {
		rc.forget(e, h)
		return
	}
	for {
		old := e.Load()
		n := hintTag(h) | uint64(max(units, 1))
		if old&^hintMaxUnits == hintTag(h) && int64(old&hintMaxUnits) >= units {
			return
		}
		if e.CompareAndSwap(old, n) {
			return
		}
	}
}

// Forget drops the hint of key h: its reads are billed the ceiling (an
// APPEND or PREPEND grows its value by a size the proxy does not know).
func (rc *ReadCost) Forget(h KeyHash) {
	if t := rc.hints.Load(); t != nil && h != 0 {
		rc.forget(hintSlot(t, h), h)
	}
}

// forget empties e if it holds h's hint.
func (rc *ReadCost) forget(e *atomic.Uint64, h KeyHash) {
	if old := e.Load(); old != 0 && old&^hintMaxUnits == hintTag(h) {
		e.CompareAndSwap(old, 0)
	}
}

// clearHints empties the table (a new epoch: every value is gone).
func (rc *ReadCost) clearHints() {
	if t := rc.hints.Load(); t != nil {
		for i := range t {
			t[i].Store(0)
		}
	}
}
