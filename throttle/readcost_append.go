package throttle

// An APPEND or PREPEND grows a value the proxy does not see whole
// (docs/throttling.md, "APPEND and PREPEND"). Its bytes are counted in
// three steps:
//
//   - [ReadCost.ReserveAppend] at each attempt of the write: its bytes
//     join the bucket's bytes in flight (pend), and it returns the
//     most its key can hold when it runs: the key's base (LargestValue, or
//     its entry in the list of large keys when that is larger) plus every
//     APPEND's bytes in flight, its own among them. The caller passes that
//     bound to [ReadCost.RaiseAppend] before the write goes.
//   - [AppendRes.Complete] when memcached has answered it: when it may
//     have stored (success, or an outcome not known) its bytes move from
//     pend onto the key's base (its entry, else LargestValue); when
//     memcached stored nothing (NOT_STORED: the key was missing) they
//     leave pend, and nothing else changes.
//   - [AppendRes.Release] when an attempt does not go (it waits for a
//     raise, is held or refused by the throttle, is answered locally, its
//     client leaves): only what may run counts in flight.
//
// So every value written through the proxy is at most its key's base plus
// the bytes in flight, and each reservation raised its key's bill to that
// sum before its write went: a read never finds a value written through
// one proxy above its bill, whatever order the APPENDs run or answer in.
// One order escapes it: a SET forwarded after an APPEND of its key, on
// another upstream connection, that memcached runs first; the SET raised
// its key to its own value only, and the key holds both. A read of it is
// then a surprise (rule 3), billed what it brought (docs/throttling.md,
// "APPEND and PREPEND", worst cases).
// A NOT_STORED lowers no record, and a FLUSH (a new epoch) ends every
// reservation of the old one: a completion or release of an old epoch
// does nothing.

// AppendRes is one APPEND or PREPEND's reservation of its bytes on its
// bucket's bytes in flight, held from the attempt that goes until
// memcached has answered it (Complete); an attempt that does not go
// releases it (Release). The zero value holds nothing. It is owned by one goroutine (the session's loop), and
// its methods are safe beside any other use of the ReadCost.
type AppendRes struct {
	rc    *ReadCost // nil: holds nothing
	v     int64     // the bytes it appends
	limit int64     // the item size of its key's server (0: not known)
	epoch uint64    // the epoch it was reserved in
}

// Held reports whether r holds a reservation.
func (r *AppendRes) Held() bool { return r.rc != nil }

// ReserveAppend reserves, in r, the v bytes of an APPEND or PREPEND of key
// (nil: not known) on the bucket's bytes in flight, unless r holds them
// already in this epoch (a write that waited and tries again counts its
// bytes once), and returns the most key can hold once it has run: its base
// plus the bytes in flight, at most limit (the item size of its server; 0:
// not known) unless the base is larger. It does not allocate.
func (rc *ReadCost) ReserveAppend(r *AppendRes, key []byte, v, limit int64) int64 {
	v = max(v, 0)
	if r.rc != nil && r.rc != rc {
		r.Release()
	}
	rc.appMu.Lock()
	defer rc.appMu.Unlock()
	rc.appEpochLocked()
	if r.rc == nil || r.epoch != rc.appEpoch {
		rc.pend += v
		*r = AppendRes{rc: rc, v: v, limit: limit, epoch: rc.appEpoch}
	}
	return grownBy(rc.appendBase(key), rc.pend, limit)
}

// RaiseAppend is RaiseKey for an APPEND or PREPEND whose bound
// ReserveAppend gave: it raises what a read of key is billed to cover the
// bound (listing key, or raising the ceiling) and records no size: the
// bytes are in flight until the write completes.
func (rc *ReadCost) RaiseAppend(key []byte, bound int64) bool { return rc.raiseKey(key, bound, true) }

// InFlight returns the bytes of the APPENDs and PREPENDs reserved and not
// yet completed or released, in the current epoch.
func (rc *ReadCost) InFlight() int64 {
	rc.appMu.Lock()
	defer rc.appMu.Unlock()
	rc.appEpochLocked()
	return rc.pend
}

// Complete ends r when memcached has answered its write: stored reports
// whether it may have stored its bytes (a success, or no answer: the
// upstream failed). Stored bytes move onto key's base before they leave
// the bytes in flight, so the bound of no key dips; a refusal (NOT_STORED,
// EEXISTS, ...) only gives them back. key is the write's, as reserved.
func (r *AppendRes) Complete(key []byte, stored bool) {
	rc := r.rc
	if rc == nil {
		return
	}
	rc.appMu.Lock()
	defer rc.appMu.Unlock()
	rc.appEpochLocked()
	if r.epoch == rc.appEpoch {
		if stored {
			rc.foldAppend(key, r.v, r.limit)
		}
		rc.pend -= r.v
	}
	*r = AppendRes{}
}

// Release gives back r's bytes: its write never went.
func (r *AppendRes) Release() { r.Complete(nil, false) }

// appEpochLocked starts the bytes in flight afresh when the epoch moved on
// (a FLUSH: every value and every write before it gone). The caller holds
// appMu.
func (rc *ReadCost) appEpochLocked() {
	if ep := rc.epoch.Load(); ep != rc.appEpoch {
		rc.appEpoch, rc.pend = ep, 0
	}
}

// appendBase returns the most key can hold before the APPENDs in flight:
// LargestValue, or its entry in the list of large keys when it is listed
// with a larger value (its class when the units field is saturated).
func (rc *ReadCost) appendBase(key []byte) int64 {
	base := rc.bytes.Load()
	if key != nil && rc.large.n.Load() > 0 {
		if s, tag := rc.large.find(key); s != nil {
			if w := s.Load(); w&lkTagMask == tag {
				base = max(base, rc.entryBytes(w))
			}
		}
	}
	return base
}

// foldAppend adds v bytes to key's base: on its entry when it is listed,
// else on LargestValue. The caller holds appMu (folds are one at a time;
// SETs and surprises only raise the same records, by compare-and-swap).
func (rc *ReadCost) foldAppend(key []byte, v, limit int64) {
	if key != nil && rc.large.n.Load() > 0 {
		if _, ok := rc.large.grow(key, func(units int64, idx uint64) int64 {
			return rc.valueUnits(grownBy(max(rc.entryBytes(lkWord(0, idx, units)), rc.bytes.Load()), v, limit))
		}); ok {
			return
		}
	}
	for {
		old := rc.bytes.Load()
		if rc.bytes.CompareAndSwap(old, grownBy(old, v, limit)) {
			return
		}
	}
}

// entryBytes returns the most bytes the value of a listed key whose slot
// holds w can hold: its units', or its class's when the units field is
// saturated.
func (rc *ReadCost) entryBytes(w uint64) int64 {
	units := lkUnits(w)
	if units == lkUnitsMax {
		units = rc.classes[lkClass(w)]
	}
	return units*rc.unit - keyRoom
}

// grownBy returns old with v more bytes, at most limit (0: no limit), and
// never below old.
func grownBy(old, v, limit int64) int64 {
	v = max(v, 0)
	if limit > 0 {
		return min(old+v, max(limit, old))
	}
	return old + v
}
