package proxy

import (
	"context"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// raiseCeiling makes the reads of r's key in bucket b billed enough to
// cover the value r writes (throttle.ReadCost.RaiseKey: the key listed
// among the bucket's large keys, or the ceiling raised), before r is
// forwarded (docs/throttling.md, "The ceiling"): so no read billed under
// the old class can find it. APPEND and PREPEND (ms modes A and P) write
// the size their key can reach: its base and every APPEND's bytes in flight
// (ReadCost.ReserveAppend: its bytes reserved once per command, at most the
// item size of its server; its slot completes the reservation when
// memcached answers: finishAppend). It reports
// whether r may go now; otherwise the session waits (pause state
// waitingCeiling) until the reads admitted under the old class have
// settled (at most one round trip; once per class the ceiling or a listed
// key crosses in an epoch of a bucket) and the raised class is saved in
// the state file (ceilingsave.go), and r is dispatched again then. The
// wait is not a throttle hold: it has no wake-up time on the engine's
// clock, counts neither as throttled nor in the throttle's wait (the
// events that end it wake it: wakeCeiling), and gives up the session's
// place in its bucket's line (the reads it waits for may need that line
// to pay for a surprise). On the loop.
func (s *session) raiseCeiling(b *bucket, r *request) bool {
	srv := s.lp.srv
	rc := b.tb.ReadCost()
	size := int64(len(r.value))
	raise := rc.RaiseKey
	if s.appends(r) {
		size = max(rc.ReserveAppend(&s.app, r.key, size, s.lp.pool.ItemSizeMaxFor(r.key)), 1)
		raise = rc.RaiseAppend
	}
	pending, gen := rc.Pending(), rc.Generation()
	if raise(r.key, size) {
		if pending || rc.Generation() != gen {
			// the raise others waited for is through, or this write
			// listed its key (others waited while it did)
			srv.wakeCeiling()
		}
		if b.ceilingSaved() {
			return true
		}
		srv.saveCeilings() // and wait for it: wakeCeiling when saved
	}
	s.waiter.Cancel()
	s.setPause(waitingCeiling)
	s.lp.ceilWait = append(s.lp.ceilWait, ceilWaiter{s: s, b: b})
	return false
}

// finishAppend completes the reservation of sl's APPEND or PREPEND, when
// memcached has answered it or its upstream failed: its bytes fold onto
// its key's size unless it stored nothing (memcached answered any status
// but success: NOT_STORED when the key was missing, as in the "append,
// else add" idiom of lists; EEXISTS; ... Or it was never written
// upstream: upstream.MayHaveRun). On the loop.
func (sl *slot) finishAppend() {
	if sl.app.Held() {
		sl.app.Complete(sl.appKey, !sl.noStore)
	}
}

// ceilWaiter is a session waiting for a raise of bucket b's ceiling.
type ceilWaiter struct {
	s *session
	b *bucket
}

// wakeCeiling re-tries, on every loop, the writes waiting for a raise of
// their bucket's ceiling: called when a wait may have ended (the last read
// billed under the old class settled, a save of the ceilings completed, a
// change of limits or of state: wakeAll). Safe from any goroutine.
func (srv *Server) wakeCeiling() {
	srv.eachLoop(func(lp *loop) {
		_ = lp.el.Execute(context.Background(), lp.ceilRun)
	})
}

// retryCeiling resumes the loop's sessions waiting for a ceiling (each
// re-tries its write, and waits again if the raise is not through), in
// the order they began to wait. On the loop.
func (lp *loop) retryCeiling(context.Context) error {
	lp.resumeCeiling(func(ceilWaiter) bool { return true })
	lp.flushClients()
	return nil
}

// retryCeilingDue is the safety net of a wake missed, at each tick (real
// time): it resumes the waiters whose wait has ended, without asking for
// another save while one is under way.
func (lp *loop) retryCeilingDue() {
	srv := lp.srv
	lp.resumeCeiling(func(w ceilWaiter) bool {
		return w.s.closed || w.b.tb.ReadCost().TryDrain() && (w.b.ceilingSaved() || !srv.ceilSaving.Load())
	})
}

// resumeCeiling resumes the waiters for which ready reports true and
// keeps the others waiting; a resumed session that waits again is queued
// anew. A closed session leaves the queue.
func (lp *loop) resumeCeiling(ready func(ceilWaiter) bool) {
	n, kept := len(lp.ceilWait), 0
	for i := 0; i < n; i++ {
		w := lp.ceilWait[i]
		switch {
		case w.s.pause != waitingCeiling:
		case !ready(w):
			lp.ceilWait[kept] = w
			kept++
		case w.s.setPause(running):
			w.s.resume() // may append to lp.ceilWait
		}
	}
	rest := copy(lp.ceilWait[kept:], lp.ceilWait[n:])
	clear(lp.ceilWait[kept+rest:])
	lp.ceilWait = lp.ceilWait[:kept+rest]
}

// appends reports whether r adds its value to the one stored: APPEND,
// PREPEND, and meta ms in mode A or P.
func (s *session) appends(r *request) bool {
	switch r.op {
	case binary.OpAppend, binary.OpAppendQ, binary.OpPrepend, binary.OpPrependQ:
		return true
	}
	return r.meta && metaAppends(s.text.meta.tail)
}

// metaAppends reports whether a meta command line's flags (tail: the
// tokens after the key) set the M flag to mode A or P (append, prepend).
func metaAppends(tail []byte) bool {
	for i := 0; i+1 < len(tail); i++ {
		if tail[i] == 'M' && (i == 0 || tail[i-1] == ' ') && (tail[i+1] == 'A' || tail[i+1] == 'P') {
			return true
		}
	}
	return false
}
