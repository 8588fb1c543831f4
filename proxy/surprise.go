package proxy

import (
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// Rules 3 and 5 of the read ceiling (docs/throttling.md, "Design for
// issue 28").
//
// Rule 3: a read that brings more than its bill (a surprise: a value
// written around the proxy, a fleet's lag) raises its bucket's ceiling at
// once, and its excess is paid through admission, as a command of that
// cost, before the response is delivered: the response waits in its slot,
// the session dispatches nothing more, and the payment is re-tried at the
// time the engine computes (a wakeEntry with owe set) or when a settle of
// the bucket gives units back. No gauge is overrun; the tenant pays by
// waiting. Unthrottled callers pay at once.
//
// Rule 5: a settle that gives units back (every read billed its ceiling
// and costing less) re-tries, in the same pass, the first held session of
// that bucket on the loop and, when the units went back to the free pool,
// the first held session of every bucket on the loop, so that a bucket
// whose bill is larger than its burst is not left waiting for a time
// computed before the refund.

// surprised is called with a read's response in (sl.gotKV counted): it
// reports whether the response must wait in its slot for its excess to be
// paid. It raises the bucket's ceiling and pays at once when the bucket
// admits it. On the loop.
func (sl *slot) surprised(value int) bool {
	if !sl.excess(value) {
		return false
	}
	s := sl.s
	if s.owing == 0 && s.payFor(sl) {
		return false
	}
	s.owing++
	return true
}

// excess reports whether sl's read, its answer in, brought more than its
// bill: it then raises the bucket's ceiling (a value of value bytes) and
// sets what the read owes (sl.owe). A read whose session closed before
// its answer came owes the same: settle makes it its bucket's debt, never
// a charge on the gauge it was admitted on (the free pool's, maybe).
func (sl *slot) excess(value int) bool {
	bill := sl.grant.ReadBill()
	if bill == 0 || sl.bkt == nil {
		return false
	}
	units := throttle.ReadUnits(int64(sl.gotKV), sl.s.lp.srv.opts.readUnitSize)
	if units <= bill {
		return false
	}
	sl.bkt.tb.ReadCost().Surprise(units, int64(value))
	sl.owe = units - bill
	return true
}

// payFor admits the excess sl owes against its bucket; it reports whether
// it was admitted (sl.extra holds its Grant), or else schedules a re-try
// at the engine's time.
func (s *session) payFor(sl *slot) bool {
	mode := throttle.Blocking
	if s.mode() == throttle.Unthrottled {
		mode = throttle.Unthrottled
	}
	c := throttle.Cost{Known: sl.owe}
	var g throttle.Grant
	var wait time.Duration
	if l := sl.leased; l != nil {
		g, wait = l.lease.AdmitCost(&s.oweWaiter, mode, c)
		s.lp.touch(l)
	} else {
		g, wait = sl.bkt.tb.AdmitCost(&s.oweWaiter, mode, c)
	}
	if g.Domain == throttle.Held {
		if wait != throttle.InfDuration {
			now := s.lp.srv.throttle.Now()
			s.oweSeq++ // the re-try this one asks for stands; earlier ones are void
			heapPush(s.lp, wakeEntry{at: now + wait, s: s, seq: s.oweSeq, owe: true})
		}
		return false
	}
	sl.extra = g
	sl.owe = 0
	return true
}

// keep builds resp into the slot, which stays unanswered until its excess
// is paid (payOwed).
func (sl *slot) keep(resp response) {
	s := sl.s
	n := len(sl.resp)
	sl.resp = s.codec.appendResponse(sl.resp, sl.req, resp)
	s.slotBytes += len(sl.resp) - n
	s.overCap()
}

// payOwed pays, in order, the excess of the session's slots that wait for
// it, delivering each paid one; once none owes any more, the session
// dispatches again. On the loop.
func (s *session) payOwed() {
	if s.owing == 0 || s.closed {
		return
	}
	for i := s.qh; i < len(s.q) && s.owing > 0; i++ {
		sl := s.q[i]
		if sl.owe == 0 {
			continue
		}
		if !s.payFor(sl) {
			break
		}
		sl.done = true
		s.owing--
	}
	s.advance()
	if s.owing == 0 {
		s.oweWaiter.Cancel()
		if s.pause == running {
			s.resume()
		}
	}
}

// noteRefund records that a settle of bucket b on the loop gave units
// back to domain d (rule 5: wakeRefunded re-tries its held sessions).
func (lp *loop) noteRefund(b *bucket, d throttle.Domain) {
	if d == throttle.FreePool {
		lp.poolRefund = true
	}
	for _, x := range lp.refunded {
		if x == b {
			return
		}
	}
	lp.refunded = append(lp.refunded, b)
}

// wakeRefunded re-tries, after a pass whose settles gave units back, the
// first held session (lowest place in line) of each bucket refunded, and
// of every bucket when the free pool was; sessions whose surprise waits
// to be paid are re-tried likewise. On the loop.
func (lp *loop) wakeRefunded() {
	if len(lp.refunded) == 0 && !lp.poolRefund {
		return
	}
	first := lp.firstHeld[:0]
	for _, e := range lp.holds {
		if !e.live() || e.s.bkt == nil || !lp.poolRefund && !lp.wasRefunded(e.s.bkt) {
			continue
		}
		k := -1
		for i := range first {
			if first[i].s.bkt == e.s.bkt && first[i].owe == e.owe {
				k = i
				break
			}
		}
		switch {
		case k < 0:
			first = append(first, e)
		case e.place-1 < first[k].place-1:
			first[k] = e
		}
	}
	clear(lp.refunded)
	lp.refunded, lp.poolRefund = lp.refunded[:0], false
	for i, e := range first {
		first[i] = wakeEntry{}
		if !e.live() {
			continue
		}
		if e.owe {
			e.s.payOwed()
		} else if e.s.setPause(running) {
			e.s.resume()
		}
	}
	lp.firstHeld = first[:0]
}

func (lp *loop) wasRefunded(b *bucket) bool {
	for _, x := range lp.refunded {
		if x == b {
			return true
		}
	}
	return false
}
