package proxy

import (
	"cmp"
	"container/heap"
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// hold parks the session in pause state to (held, or heldOnReads to
// re-try also when one of its reads settles) until the throttle engine
// lets its bucket run again: nothing more of the connection is dispatched,
// its input stays buffered (up to max_held_input_bytes, then the client
// is not read: checkBuffered, readgate.go), and the loop wakes
// it at the time the engine computed. A wait of InfDuration is only ended
// by a change of limits (wakeHeld).
func (s *session) hold(to pauseState, wait time.Duration) {
	now := s.lp.srv.throttle.Now()
	if s.heldAt == 0 {
		s.heldAt = max(now, 1)
	}
	s.setPause(to)
	s.holdSeq++
	if wait == throttle.InfDuration {
		return
	}
	s.lp.schedule(s, now+wait)
}

// throttled handles a metered command r its bucket b may not run yet, the
// engine asking it to wait: a non-blocking client (HELLO feature 0x1b) is
// answered EWouldThrottle; a command whose hold would pass
// throttle.max_hold (counted from when it was first held) is answered
// Etmpfail at once and gives up its place; any other is held. It returns
// whether r was consumed (answered), as dispatch does. A session with
// reads in flight also re-tries when one of its own commands completes
// (finish): a read's settle gives back what its ceiling overbilled.
func (s *session) throttled(r *request, b *bucket, wait time.Duration) bool {
	srv := s.lp.srv
	if s.mode() == throttle.NonBlocking {
		s.nextTick(r, binary.StatusEWouldThrottle, wait)
		return true
	}
	if limit := srv.opts.maxHold; limit > 0 {
		var soFar time.Duration
		if s.heldAt != 0 {
			soFar = srv.throttle.Now() - s.heldAt
		}
		if wait == throttle.InfDuration || soFar+wait > limit {
			b.tb.Refuse(&s.waiter)
			s.heldAt = 0
			s.nextTick(r, binary.StatusEtmpfail, wait)
			return true
		}
	}
	to := held
	if s.readsOut > 0 {
		// A read of its own settling gives units back (its bill is the
		// bucket's ceiling): re-try then too.
		to = heldOnReads
	}
	s.hold(to, wait)
	return false
}

// nextTick answers r with status st and the body {"next_tick_us":N}: the
// real microseconds until the bucket would admit it, or -1 when only a
// change of limits can.
func (s *session) nextTick(r *request, st binary.Status, wait time.Duration) {
	us := int64(-1)
	if wait != throttle.InfDuration {
		us = int64((wait + time.Microsecond - 1) / time.Microsecond)
	}
	body := append(s.lp.scratch[:0], `{"next_tick_us":`...)
	body = strconv.AppendInt(body, us, 10)
	body = append(body, '}')
	s.lp.scratch = body
	s.localValue(r, st, body)
}

// wakeEntry is a held session's wake-up time (engine time) and its place
// in its bucket's line when it was held.
type wakeEntry struct {
	at    time.Duration
	place uint64
	s     *session
	seq   uint64 // the session's holdSeq, or its oweSeq for a payment's re-try
	owe   bool   // a re-try of the payment of the session's surprises (surprise.go), not of a held command
}

// live reports whether the entry still stands for a held session, or for
// a session whose surprises wait to be paid.
func (e *wakeEntry) live() bool {
	if e.owe {
		return e.s.owing > 0 && e.s.oweSeq == e.seq && !e.s.closed
	}
	return e.s.isHeld() && e.s.holdSeq == e.seq && !e.s.closed
}

type wakeHeap []wakeEntry

func (h wakeHeap) Len() int           { return len(h) }
func (h wakeHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h wakeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *wakeHeap) Push(x any)        { *h = append(*h, x.(wakeEntry)) }
func (h *wakeHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = wakeEntry{}
	*h = old[:len(old)-1]
	return e
}

// schedule wakes s at engine time at. One timer per loop, armed for the
// earliest entry; its callback only hands the work to the loop.
func (lp *loop) schedule(s *session, at time.Duration) {
	heapPush(lp, wakeEntry{at: at, place: s.waiter.Place(), s: s, seq: s.holdSeq})
}

// heapPush adds e to the loop's wake-ups and arms its timer.
func heapPush(lp *loop, e wakeEntry) {
	heap.Push(&lp.holds, e)
	lp.arm()
}

// arm sets the loop's timer for the earliest of its held sessions' wake
// times and the next expiry of its leases (leaseDue).
func (lp *loop) arm() {
	at := lp.leaseDue
	if len(lp.holds) > 0 && (at == 0 || lp.holds[0].at < at) {
		at = lp.holds[0].at
	}
	if at == 0 {
		return
	}
	if lp.armed && lp.armedAt <= at {
		return
	}
	// Armed for the reading, not for a delay from now: on a fake clock
	// moved meanwhile, the delay would fire past at.
	lp.armed, lp.armedAt = true, at
	if lp.timer == nil {
		lp.timer = lp.srv.throttle.AtFunc(at, lp.timerFired)
	} else {
		lp.srv.throttle.ResetAt(lp.timer, at)
	}
}

func (lp *loop) timerFired() {
	_ = lp.el.Execute(context.Background(), lp.wakeRun)
}

// compactHolds drops entries of sessions that closed or were woken
// another way (a change of limits), so the heap does not keep them, and
// their connections, until their time comes.
func (lp *loop) compactHolds() {
	if len(lp.holds) < 256 {
		return
	}
	stale := 0
	for _, e := range lp.holds {
		if !e.live() {
			stale++
		}
	}
	if stale <= len(lp.holds)/2 {
		return
	}
	live := lp.holds[:0]
	for _, e := range lp.holds {
		if e.live() {
			live = append(live, e)
		}
	}
	clear(lp.holds[len(live):])
	lp.holds = live
	heap.Init(&lp.holds)
}

// wakeDue resumes every held session whose time has come, in the order of
// their places in their buckets' lines: a session whose wait was a re-try
// (its bucket's reads in flight gate it: throttle's unknownPoll) may be
// due later than sessions behind it, and would otherwise ask the engine
// after them, and find the room taken, every time. On the loop.
func (lp *loop) wakeDue(context.Context) error {
	lp.armed = false
	now := lp.srv.throttle.Now()
	due := lp.due[:0]
	for len(lp.holds) > 0 && lp.holds[0].at <= now {
		if e := heap.Pop(&lp.holds).(wakeEntry); e.live() {
			due = append(due, e)
		}
	}
	if lp.leaseDue != 0 && lp.leaseDue <= now {
		lp.expireLeases() // stock no longer ours goes back before the woken ask
	}
	slices.SortFunc(due, func(a, b wakeEntry) int {
		return cmp.Compare(a.place-1, b.place-1) // no place (0) last
	})
	for i, e := range due {
		due[i] = wakeEntry{}
		if s := e.s; e.live() {
			lp.srv.wakeDelay.observe(now - e.at)
			if e.owe {
				s.payOwed()
			} else if s.setPause(running) {
				s.resume()
			}
		}
	}
	lp.due = due[:0]
	lp.arm()
	lp.flushClients()
	return nil
}

// wakeAll resumes every held session of the loop, so each asks the engine
// again (after a change of limits, a FLUSH, another instance's state), and
// every session waiting for a FLUSH, re-tries the payments of surprises
// (payOwed: one whose bucket had no rate to pay with has no wake-up time),
// and re-tries the writes waiting for a raise of a ceiling; on the loop.
//
// They ask in the order of their places in their buckets' lines (as
// wakeDue: no place last; then in the order they were first held), not
// in the sessions map's order: after a fleet grant raised a hard limit,
// resuming them in the map's order admitted two of a bucket's held
// commands on one run and three on another (TestFleetHardLimitFollowsTheLoad
// on fake clocks).
func (lp *loop) wakeAll(context.Context) error {
	owing := lp.sessionsWhere(func(s *session) bool { return s.owing > 0 }, func(a, b *session) int {
		return cmp.Compare(a.oweWaiter.Place()-1, b.oweWaiter.Place()-1)
	})
	for i, s := range owing {
		owing[i] = nil
		s.payOwed()
	}
	lp.woken = owing[:0]
	held := lp.sessionsWhere((*session).wakeable, func(a, b *session) int {
		if c := cmp.Compare(a.waiter.Place()-1, b.waiter.Place()-1); c != 0 {
			return c
		}
		return cmp.Compare(a.heldAt, b.heldAt)
	})
	for i, s := range held {
		held[i] = nil
		if s.wakeable() && s.setPause(running) {
			s.resume()
		}
	}
	lp.woken = held[:0]
	lp.resumeCeiling(func(ceilWaiter) bool { return true }) // a FLUSH or another instance may have ended their wait
	lp.flushClients()
	return nil
}

// sessionsWhere returns the loop's sessions for which keep reports true,
// sorted by order, in lp.woken's storage (the caller clears each entry it
// takes, and hands the storage back).
func (lp *loop) sessionsWhere(keep func(*session) bool, order func(a, b *session) int) []*session {
	ss := lp.woken[:0]
	for s := range lp.sessions {
		if keep(s) {
			ss = append(ss, s)
		}
	}
	slices.SortFunc(ss, order)
	return ss
}

// wakeHeld makes every loop re-admit its held sessions. Safe from any
// goroutine.
func (srv *Server) wakeHeld() {
	srv.eachLoop(func(lp *loop) {
		_ = lp.el.Execute(context.Background(), gnet.RunnableFunc(lp.wakeAll))
	})
}

// throttleWait records how long a held command waited before admission.
func (srv *Server) throttleWait(b *bucket, d time.Duration) {
	if b.wait != nil {
		b.wait.Observe(d.Seconds())
	}
}

// delayHist is a lock-free histogram of wake-up delays (how late a held
// session was woken after the time the engine computed), in 50 µs bins up
// to 50 ms; the last bin holds everything later.
type delayHist struct {
	bins [1001]atomic.Uint64
}

const delayBin = 50 * time.Microsecond

func (h *delayHist) observe(d time.Duration) {
	i := int(d / delayBin)
	if i < 0 {
		i = 0
	}
	if i >= len(h.bins) {
		i = len(h.bins) - 1
	}
	h.bins[i].Add(1)
}

// quantile returns the upper edge of the bin holding quantile q, and the
// number of observations.
func (h *delayHist) quantile(q float64) (time.Duration, uint64) {
	var n uint64
	for i := range h.bins {
		n += h.bins[i].Load()
	}
	if n == 0 {
		return 0, 0
	}
	rank := uint64(q*float64(n) + 0.5)
	var seen uint64
	for i := range h.bins {
		seen += h.bins[i].Load()
		if seen >= rank && seen > 0 {
			return time.Duration(i+1) * delayBin, n
		}
	}
	return time.Duration(len(h.bins)) * delayBin, n
}

// WakeDelay returns quantile q of how late held sessions were woken after
// the time the throttle engine computed for them, and how many wake-ups
// were measured. The contract is under 5 ms at the 99th percentile.
func (srv *Server) WakeDelay(q float64) (time.Duration, uint64) { return srv.wakeDelay.quantile(q) }
