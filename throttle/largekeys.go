package throttle

import (
	"hash/maphash"
	"sync/atomic"
)

// largeKeys is a bucket's short list of large keys (docs/throttling.md,
// "A short list of large keys"): up to maxLargeKeys keys whose values
// passed the class of all the others, each with the class of its largest
// value. A read of a listed key is billed its class; every other read is
// billed the bucket's ceiling.
//
// The table is open-addressed with linear probing, one atomic word per
// slot: 48 bits of the key's hash (never zero) above the class index.
// Readers take no lock; entries are written only under ReadCost.raiseMu
// (a listing, a reset), and are never removed but by a reset, so a probe
// ends at the first empty slot. A collision of hashes can only bill an
// unlisted key a listed key's class: more, never less.
type largeKeys struct {
	n     atomic.Int32 // keys listed: 0 lets reads skip the hash
	top   atomic.Uint64
	slots [largeKeySlots]atomic.Uint64
}

const (
	maxLargeKeys  = 64
	largeKeySlots = 2 * maxLargeKeys // a power of two: half empty at most
	lkClassBits   = 16
)

// keySeed hashes keys for every bucket of the process: a tenant cannot
// choose keys that collide in another process (and a collision only
// over-bills its own reads).
var keySeed = maphash.MakeSeed()

// lkTag returns the key's hash as stored in a slot (the class bits
// clear, never zero) and its first slot.
func lkTag(key []byte) (tag uint64, at int) {
	h := maphash.Bytes(keySeed, key)
	return (h | 1<<63) &^ (1<<lkClassBits - 1), int(h & (largeKeySlots - 1))
}

// class returns the class index listed for key, and whether it is listed.
func (lk *largeKeys) class(key []byte) (uint64, bool) {
	tag, at := lkTag(key)
	for i := 0; i < largeKeySlots; i++ {
		w := lk.slots[(at+i)&(largeKeySlots-1)].Load()
		switch {
		case w == 0:
			return 0, false
		case w&^(1<<lkClassBits-1) == tag:
			return w & (1<<lkClassBits - 1), true
		}
	}
	return 0, false
}

// list lists key at class idx, or raises its class to idx; it reports
// false when the list is full and key is not in it. The caller holds
// ReadCost.raiseMu.
func (lk *largeKeys) list(key []byte, idx uint64) bool {
	tag, at := lkTag(key)
	for i := 0; i < largeKeySlots; i++ {
		s := &lk.slots[(at+i)&(largeKeySlots-1)]
		switch w := s.Load(); {
		case w == 0:
			if lk.n.Load() >= maxLargeKeys {
				return false
			}
			s.Store(tag | idx)
			lk.n.Add(1)
		case w&^(1<<lkClassBits-1) != tag:
			continue
		case w&(1<<lkClassBits-1) < idx:
			s.Store(tag | idx)
		}
		if lk.top.Load() < idx {
			lk.top.Store(idx)
		}
		return true
	}
	return false
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
