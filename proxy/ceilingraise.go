package proxy

import (
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// raisePoll is how long a write waiting for its bucket's ceiling to be
// raised (the reads billed under the old class to settle) waits at most
// before it asks again; a settle that ends the wait wakes it sooner
// (Server.settle, wakeHeld).
const raisePoll = 5 * time.Millisecond

// raiseCeiling raises the ceiling of bucket b (throttle.ReadCost) to cover
// the value r writes, before r is forwarded (docs/throttling.md, "The
// ceiling"): so no read billed under the old class can find it. It reports
// whether r may go now; otherwise the session is held until the reads
// admitted under the old class have settled (at most one round trip, at
// most 9 times per epoch of a bucket) and the raised class is saved in
// the state file (ceilingsave.go), and r is dispatched again then.
// APPEND and PREPEND (ms modes A and P) add their bytes to the largest
// value. On the loop.
func (s *session) raiseCeiling(b *bucket, r *request) bool {
	rc := b.tb.ReadCost()
	pending := rc.Pending()
	if rc.Raise(int64(len(r.value)), s.appends(r)) {
		if pending {
			s.lp.srv.wakeHeld() // the raise others waited for is through
		}
		if b.ceilingSaved() {
			return true
		}
		s.lp.srv.saveCeilings() // and wait for it: wakeHeld when saved
	}
	s.hold(held, raisePoll)
	return false
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
