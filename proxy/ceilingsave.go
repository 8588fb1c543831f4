package proxy

import (
	"github.com/kvthrottle/kvthrottle/bucketcfg"
)

// The buckets' read ceilings (throttle.ReadCost) are kept in the state
// file (bucketcfg.State.Ceilings, per bucket the class of its current
// epoch): a write that raises its bucket's ceiling is forwarded only once
// the raised class is saved (raiseCeiling), so that after a restart no
// read is billed below a value written before it. In fleet mode the
// ceilings ride the fleet's state document, merged like the epochs (the
// greater epoch wins, then the larger class: mergeFleetState), so another
// instance learns a raise within a grant period or two; until then its
// reads of such a value are surprises (rule 3).

// ceilingSaved reports whether b's bound (its ceiling, or its largest
// listed key's class), as it stands, is saved.
func (b *bucket) ceilingSaved() bool {
	return b.tb.ReadCost().Bound() <= b.savedCeil.Load()
}

// saveCeilings saves every bucket's ceiling in the state file, off the
// loop (one save at a time; a request during a save makes it run again),
// then wakes the writes that waited for it (wakeCeiling). A save
// that fails is logged and the writes go all the same (a restart then
// bills the reads of their values as surprises, rule 3). Safe from any
// goroutine.
func (srv *Server) saveCeilings() {
	srv.ceilAgain.Store(true)
	if !srv.ceilSaving.CompareAndSwap(false, true) {
		return
	}
	if !srv.jobs.add() {
		srv.ceilSaving.Store(false)
		return
	}
	go func() {
		defer srv.jobs.done()
		for srv.ceilAgain.Swap(false) {
			srv.saveCeilingsOnce()
		}
		srv.ceilSaving.Store(false)
		if srv.ceilAgain.Load() {
			srv.saveCeilings() // asked for after the last pass
		}
		srv.wakeCeiling()
	}()
}

// saveCeilingsOnce writes the buckets' ceilings as they stand.
func (srv *Server) saveCeilingsOnce() {
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	ten := srv.ten.Load()
	next := srv.state.Clone()
	saved := make(map[*bucket]int64, len(ten.buckets))
	for name, b := range ten.buckets {
		ep, c := b.tb.ReadCost().Snapshot()
		next.SetCeiling(name, bucketcfg.Ceiling{Epoch: ep, Class: c})
		saved[b] = c
	}
	if testHookCeilingSave != nil {
		testHookCeilingSave()
	}
	if err := next.Save(srv.opts.statePath); err != nil {
		srv.log.Error().Err(err).Msg("could not persist the buckets' read ceilings; writes go on, a restart may bill their reads late")
	} else {
		srv.state = next
		if srv.fleet != nil {
			srv.fleet.pushEpochs.Store(true) // the ceilings ride with the epochs
		}
	}
	for b, c := range saved {
		atomicMaxInt(&b.savedCeil, c)
	}
}

// atomicMaxInt raises a to v if v is larger.
func atomicMaxInt(a interface {
	Load() int64
	CompareAndSwap(old, new int64) bool
}, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// startSavedCeilings sets the ceiling of every bucket that has one saved
// for its current epoch to that class (New: before the servers' item
// counts are asked, startCeilings).
func (srv *Server) startSavedCeilings(st *bucketcfg.State) {
	for name, b := range srv.ten.Load().buckets {
		if c, ok := st.Ceilings[name]; ok && c.Epoch == b.gen.Load() {
			b.tb.ReadCost().Restore(c.Epoch, c.Class)
			b.savedCeil.Store(c.Class)
		}
	}
}

// restoreCeilings raises every bucket's ceiling to the one st holds for
// its current epoch (a restart, another instance's raise): those values
// may already be stored. The caller holds adminMu, or is New.
func (srv *Server) restoreCeilings(st *bucketcfg.State) {
	for name, b := range srv.ten.Load().buckets {
		c, ok := st.Ceilings[name]
		if !ok || c.Epoch != b.gen.Load() {
			continue
		}
		rc := b.tb.ReadCost()
		if c.Class > rc.Bound() {
			// Values this instance did not write (its own saved bound
			// coming back changes nothing: its large keys are listed).
			rc.Surprise(c.Class, 0)
		}
		atomicMaxInt(&b.savedCeil, c.Class)
	}
}

// testHookCeilingSave, when set (by tests, before the Server starts), runs
// in each save of the ceilings, before the state file is written.
var testHookCeilingSave func()
