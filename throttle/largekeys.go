package throttle

import (
	"hash/maphash"
	"sync/atomic"
)

// largeKeys is a bucket's short list of large keys (docs/throttling.md,
// "A short list of large keys"): up to maxLargeKeys keys whose values
// passed the class of all the others, each with the class of its largest
// value (what a read of it is billed) and that value's units (where an
// APPEND to it starts). A read of a listed key is billed its class; every
// other read is billed the bucket's ceiling.
//
// The table is open-addressed with linear probing, one atomic word per
// slot: 36 bits of the key's hash (its top bit always set, so never zero:
// 35 bits of it), the units (20 bits, saturating: a saturated field means
// the class bounds the value) and the class index (8 bits). Readers take no lock; entries
// are listed and their classes raised only under ReadCost.raiseMu (a
// listing, a reset), their units grown by compare-and-swap by any writer,
// and are never removed but by a reset, so a probe ends at the first empty
// slot. A collision of hashes can only bill an unlisted key a listed key's
// class: more, never less.
type largeKeys struct {
	n     atomic.Int32 // keys listed: 0 lets reads skip the hash
	top   atomic.Uint64
	slots [largeKeySlots]atomic.Uint64
}

const (
	maxLargeKeys  = 64
	largeKeySlots = 2 * maxLargeKeys // a power of two: half empty at most
	lkClassBits   = 8
	lkUnitsBits   = 20
	lkClassMask   = 1<<lkClassBits - 1
	lkUnitsMax    = 1<<lkUnitsBits - 1
	lkTagMask     = ^uint64(1<<(lkClassBits+lkUnitsBits) - 1)
)

// keySeed hashes keys for every bucket of the process: a tenant cannot
// choose keys that collide in another process (and a collision only
// over-bills its own reads).
var keySeed = maphash.MakeSeed()

// lkTag returns the key's hash as stored in a slot (the other bits clear,
// never zero) and its first slot.
func lkTag(key []byte) (tag uint64, at int) {
	h := maphash.Bytes(keySeed, key)
	return (h | 1<<63) & lkTagMask, int(h & (largeKeySlots - 1))
}

func lkClass(w uint64) uint64 { return w & lkClassMask }
func lkUnits(w uint64) int64  { return int64(w>>lkClassBits) & lkUnitsMax }

// lkWord packs a slot's word.
func lkWord(tag, idx uint64, units int64) uint64 {
	return tag | uint64(min(units, lkUnitsMax))<<lkClassBits | idx
}

// find returns key's slot and tag; the slot is nil when key is not listed.
func (lk *largeKeys) find(key []byte) (*atomic.Uint64, uint64) {
	tag, at := lkTag(key)
	for i := 0; i < largeKeySlots; i++ {
		s := &lk.slots[(at+i)&(largeKeySlots-1)]
		switch w := s.Load(); {
		case w == 0:
			return nil, tag
		case w&lkTagMask == tag:
			return s, tag
		}
	}
	return nil, tag
}

// class returns the class index listed for key, and whether it is listed.
func (lk *largeKeys) class(key []byte) (uint64, bool) {
	if s, _ := lk.find(key); s != nil {
		return lkClass(s.Load()), true
	}
	return 0, false
}

// list lists key at class idx with a value of units, or raises its class
// and units to them; it reports false when the list is full and key is
// not in it. The caller holds ReadCost.raiseMu.
func (lk *largeKeys) list(key []byte, idx uint64, units int64) bool {
	tag, at := lkTag(key)
	for i := 0; i < largeKeySlots; i++ {
		s := &lk.slots[(at+i)&(largeKeySlots-1)]
		w := s.Load()
		switch {
		case w == 0:
			if lk.n.Load() >= maxLargeKeys {
				return false
			}
			s.Store(lkWord(tag, idx, units))
			lk.n.Add(1)
		case w&lkTagMask != tag:
			continue
		default:
			for !s.CompareAndSwap(w, lkWord(tag, max(idx, lkClass(w)), max(units, lkUnits(w)))) {
				w = s.Load()
			}
		}
		if lk.top.Load() < idx {
			lk.top.Store(idx)
		}
		return true
	}
	return false
}

// grow raises the units recorded for key, if listed, to next(units, idx)
// (at least the units it had) and reports the new units and whether key
// is listed. idx is key's class index; units is lkUnitsMax when the field
// is saturated (the class then bounds the value, not the units). Any
// writer may call it: the units grow by compare-and-swap. A reset that
// empties the slot meanwhile (and a listing that fills it again, with
// another key) ends it: key is not listed then.
func (lk *largeKeys) grow(key []byte, next func(units int64, idx uint64) int64) (int64, bool) {
	s, tag := lk.find(key)
	if s == nil {
		return 0, false
	}
	for {
		w := s.Load()
		if w&lkTagMask != tag {
			return 0, false
		}
		u := max(next(lkUnits(w), lkClass(w)), lkUnits(w))
		if u == lkUnits(w) || s.CompareAndSwap(w, lkWord(w&lkTagMask, lkClass(w), u)) {
			return u, true
		}
	}
}

// reset empties the list. The caller holds ReadCost.raiseMu.
func (lk *largeKeys) reset() {
	if lk.n.Load() == 0 {
		return
	}
	for i := range lk.slots {
		lk.slots[i].Store(0)
	}
	lk.n.Store(0)
	lk.top.Store(0)
}
