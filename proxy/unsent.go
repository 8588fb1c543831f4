package proxy

// The global budget for response bytes held for clients
// (proxy.max_unsent_bytes).
//
// Each session is bounded on its own: it stops dispatching at
// maxUnsentOutput unsent bytes and is closed past maxResponseBytes. That
// still lets every connection hold up to 64 MiB: 20 authenticated clients
// that pipeline large GETs and never read would take 1.3 GB. So the
// sessions also report what they hold to Server.unsentBytes, and past the
// budget the proxy closes the connections holding the most: a client that
// reads has its bytes in the kernel's socket buffer within a loop pass,
// one that does not keeps them here and grows, so the heaviest holder is
// the one to give way (pausing it would not help: what it holds is
// already here, and only closing the connection frees it).
//
// Accounting is by snapshot: a session's share (session.accounted) is
// brought up to date when its held bytes grow (overCap, after each
// upstream response) and at every tick for the sessions holding some
// (lp.holding), so draining is seen within a tick. Bytes below
// unsentFloor are not counted: most sessions hold a few small responses
// for an instant, and counting them would put a shared atomic on every
// response; this leaves at most unsentFloor per connection outside the
// budget (160 MB at 10,000 connections that all stop reading).
//
// Each loop enforces the budget on its own sessions, and only while it
// holds more than its share (budget / event loops): the loop holding the
// most sheds, not the one that happens to see the total pass the budget.

// unsentFloor is the held response bytes below which a session's share
// of the global budget counts as 0.
const unsentFloor = 16 << 10

// account brings the session's share of Server.unsentBytes up to date with
// n, the response bytes it holds now (unsent()). It reports whether the
// share grew. On the loop.
func (s *session) account(n int) bool {
	if s.released {
		return false
	}
	if n < unsentFloor {
		n = 0
	}
	d := n - s.accounted
	if d == 0 {
		return false
	}
	s.accounted = n
	s.lp.unsentSum += int64(d)
	s.lp.srv.unsentBytes.Add(int64(d))
	if n > 0 && !s.holding {
		s.holding = true
		s.lp.holding = append(s.lp.holding, s)
	}
	return d > 0
}

// releaseUnsent removes the session's share for good (the connection is
// closing). Idempotent.
func (s *session) releaseUnsent() {
	s.released = true
	if s.accounted != 0 {
		s.lp.unsentSum -= int64(s.accounted)
		s.lp.srv.unsentBytes.Add(-int64(s.accounted))
		s.accounted = 0
	}
}

// overBudget reports whether the sessions hold more than max_unsent_bytes
// together, and this loop more than its share of it.
func (lp *loop) overBudget() bool {
	srv := lp.srv
	return srv.unsentBytes.Load() > srv.opts.maxUnsent && lp.unsentSum > srv.opts.maxUnsent/int64(srv.opts.eventLoops)
}

// refreshUnsent brings the shares of the loop's holding sessions up to
// date and forgets those that hold nothing now. On the loop.
func (lp *loop) refreshUnsent() {
	kept := lp.holding[:0]
	for _, s := range lp.holding {
		if !s.released && !s.closed {
			s.account(s.unsent())
		}
		if s.accounted > 0 {
			kept = append(kept, s)
		} else {
			s.holding = false
		}
	}
	clear(lp.holding[len(kept):])
	lp.holding = kept
}

// shedUnsent enforces max_unsent_bytes: while the budget is exceeded and
// this loop holds more than its share, it closes the loop's session
// holding the most response bytes. On the loop.
func (lp *loop) shedUnsent() {
	if !lp.overBudget() {
		return
	}
	lp.refreshUnsent()
	srv := lp.srv
	for lp.overBudget() {
		var top *session
		for _, s := range lp.holding {
			if !s.released && (top == nil || s.accounted > top.accounted) {
				top = s
			}
		}
		if top == nil {
			return
		}
		n := srv.unsentShed.Add(1)
		srv.log.Warn().Str("remote", top.remote).Int("response_bytes", top.accounted).
			Int64("held_total", srv.unsentBytes.Load()).Int64("max_unsent_bytes", srv.opts.maxUnsent).
			Uint64("closed_total", n).Msg("clients hold too many unread responses; closing the connection holding the most")
		top.quitting = true
		_ = top.c.Close()
		top.releaseUnsent()
	}
}
