package proxy

import (
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// Bounds on connections that have not authenticated yet (DESIGN.md
// section 2, "nothing unbounded"). A connection must authenticate when it
// opens while proxy.default_bucket is ""; until it does, anyone able to
// reach the port controls it, so it may cost the proxy next to nothing.
//
//   - Frames: before authentication only small frames make sense (HELLO,
//     SASL, NOOP, VERSION, STAT, SelectBucket; a SASL PLAIN message is a
//     user name and a password). A larger frame gets Einval as soon as its
//     header arrives and the connection closes: its body is never
//     buffered. 4 KiB leaves room for any real credential; 64 KiB would
//     let the 9,000 unauthenticated connections of the default
//     max_connections pin over 1 GB.
//   - Input: at most preAuthMaxInput bytes may wait unprocessed (for
//     example pipelined behind SASL AUTH while the password is checked),
//     instead of proxy.max_held_input_bytes, besides a frame still
//     arriving; past it the connection is closed (an authenticated one is
//     no longer read instead: readgate.go).
//   - Output: a client that has more than preAuthMaxOutput bytes of
//     responses not taken by the socket, or preAuthMaxPending commands
//     unanswered, when its next frame is decoded is closed: STAT, error
//     responses and forwarded VERSIONs are larger than their requests, so
//     without this a client that does not read could make the proxy hold
//     megabytes for it. A real client exchanges a few frames before it
//     authenticates (HELLO, SASL list and auth) and reads their answers.
//   - Time: proxy.auth_timeout after it opened, a connection that has not
//     authenticated is closed.
//   - Number: unauthenticated connections may hold at most
//     unauthLimit(max_connections) slots (90%), split evenly between the
//     event loops; the rest is kept for authenticated ones. When its
//     loop's share, or max_connections, is full, a new connection closes
//     the oldest unauthenticated connection of its loop (skipping those
//     whose password is being checked) instead of being refused: a real
//     client arrives unauthenticated too, and only needs milliseconds to
//     authenticate, while an attacker holding the share must open
//     connections faster than the share turns over to push it out before
//     it does. The share is per loop so that the loop admitting a
//     connection can always find the one to close among its own.
//
// Together these pin at most about 16 KiB per unauthenticated connection
// (some 150 MB for the 9,000 allowed by the default max_connections), for
// at most auth_timeout.
//
// Connections on the default bucket (default_bucket not "") have a bucket
// without authenticating: they count as authenticated for all of this.
// idle_timeout applies to every connection.
const (
	preAuthMaxBody    = 4 << 10
	preAuthMaxInput   = binary.HeaderLen + preAuthMaxBody
	preAuthMaxOutput  = 8 << 10
	preAuthMaxPending = 16
)

// unauthLimit is how many unauthenticated connections may be open at once
// out of maxConns: all but a tenth (at least one connection).
func unauthLimit(maxConns int) int64 {
	return int64(max(1, maxConns-maxConns/10))
}

// unauthSourceLimit is how many of a loop's unauthenticated connections
// one source (an IPv4 address or an IPv6 /64, as authSource groups them)
// may hold at once: a quarter of the loop's share, at least 4. One
// flooding host can then neither fill the share nor, by churning, keep
// evicting the clients of other hosts before they authenticate; a new
// connection of a source at its limit pushes out the oldest of its own.
func unauthSourceLimit(perLoop int) int {
	return max(4, perLoop/4)
}

// unauthSources counts a loop's unauthenticated connections by source.
// Only its loop touches it.
type unauthSources map[string]int

// take counts one more connection of src, unless src already holds limit
// (limit < 0: no limit); it reports whether it counted it.
func (u *unauthSources) take(src string, limit int) bool {
	if limit >= 0 && (*u)[src] >= limit {
		return false
	}
	if *u == nil {
		*u = make(unauthSources)
	}
	(*u)[src]++
	return true
}

// release counts one connection of src less.
func (u unauthSources) release(src string) {
	if u[src] <= 1 {
		delete(u, src)
		return
	}
	u[src]--
}

// List indexes of session.links.
const (
	listUnauth = iota // lp.unauth: unauthenticated sessions, oldest first
	listIdle          // lp.idle: sessions by last activity, least recent first
)

// sessLink is a session's place in one sessList.
type sessLink struct {
	prev, next *session
	in         bool
}

// sessList is an intrusive doubly linked list of sessions through
// session.links[k]: insertion, removal and moving to the back are O(1) and
// allocate nothing. Only the owning loop touches it.
type sessList struct {
	head, tail *session
	n          int
	k          int // index into session.links
}

func (l *sessList) pushBack(s *session) {
	ln := &s.links[l.k]
	if ln.in {
		return
	}
	ln.in, ln.prev, ln.next = true, l.tail, nil
	if l.tail != nil {
		l.tail.links[l.k].next = s
	} else {
		l.head = s
	}
	l.tail = s
	l.n++
}

// remove takes s out of the list; it reports whether s was in it.
func (l *sessList) remove(s *session) bool {
	ln := &s.links[l.k]
	if !ln.in {
		return false
	}
	if ln.prev != nil {
		ln.prev.links[l.k].next = ln.next
	} else {
		l.head = ln.next
	}
	if ln.next != nil {
		ln.next.links[l.k].prev = ln.prev
	} else {
		l.tail = ln.prev
	}
	*ln = sessLink{}
	l.n--
	return true
}

func (l *sessList) moveToBack(s *session) {
	if l.tail == s {
		return
	}
	l.remove(s)
	l.pushBack(s)
}

// clock refreshes the loop's coarse clock (the engine clock's reading,
// so that auth_timeout, idle_timeout and silentGrace run on the clock a
// test may inject) and returns it. Sessions stamp their input with lp.now,
// which the tick and OnOpen refresh: reading the clock once per read would
// cost more than the 50 ms resolution is worth.
func (lp *loop) clock() time.Duration {
	lp.now = lp.srv.throttle.Now()
	return lp.now
}

// openSession registers a new session with the connection limits and
// starts its timers; needAuth is whether it must authenticate. On the
// loop, from OnOpen.
func (lp *loop) openSession(s *session, needAuth bool) {
	s.openedAt = lp.now
	s.lastActive = lp.now
	if needAuth {
		s.needAuth = true
		lp.unauth.pushBack(s)
		lp.srv.unauthConns.Add(1)
	}
	if lp.srv.opts.idleTimeout > 0 {
		lp.idle.pushBack(s)
	}
}

// closeSession takes a closing session out of the connection limits'
// books; on the loop, from OnClose. Idempotent.
func (lp *loop) closeSession(s *session) {
	s.leaveUnauth()
	lp.idle.remove(s)
	s.releaseUnsent()
}

// evictRank orders eviction candidates among the unauthenticated: a
// connection already refused goes first (rankRefused), then one that has
// sent nothing for silentGrace since it opened (rankSilent), then any
// other (rankOther), and last one waiting for a password check of its
// user at its address under a failure penalty (rankPenalised); the oldest
// within a rank. A client on its way in sends its first frame (HELLO,
// SASL) within a round trip of opening, so connections opened and left
// silent, as a flood of them is, are closed before it even when they come
// from the same address; a connection just opened is not ranked silent
// yet, so that an attacker whose connections each send a frame cannot push
// out, ahead of them all, a client whose first frame is still on its way.
// A login waiting its turn under a penalty is closed only for another
// such: its check may wait seconds, and one guess on 64 connections must
// not hold the address's share meanwhile, but connections that merely
// send a frame must not close a pool waiting for its turn either. Other
// sessions whose password is being checked, or that are closing, are not
// candidates (rank 0).
func evictRank(s *session) int {
	switch {
	case s.quitting || s.closed || (s.checking() && !s.check.penalised):
		return 0
	case s.checking():
		return rankPenalised
	case s.authFails > 0:
		return rankRefused
	case !s.framed && s.lp.now-s.openedAt >= silentGrace:
		return rankSilent
	}
	return rankOther
}

// The eviction ranks (evictRank): the highest goes first.
const (
	rankPenalised = 1 + iota
	rankOther
	rankSilent
	rankRefused
)

// silentGrace is how long a new connection may stay silent before it
// ranks among the silent for eviction: many round trips, even across
// continents.
const silentGrace = time.Second

// evictUnauthOf makes room for a new connection of src, which holds its
// limit of unauthenticated connections: it closes the best-ranked
// (evictRank) of src's connections among the loop's oldest evictScan*4
// unauthenticated ones, and keeps src's count for the new one. It reports
// whether it found one. On the loop.
func (lp *loop) evictUnauthOf(src string) bool {
	victim := lp.evictCandidate(src, evictScan*4)
	if victim == nil {
		return false
	}
	lp.unauth.remove(victim)
	lp.srv.unauthConns.Add(-1) // src's count passes to the new connection
	lp.evict(victim, "the source holds its share of unauthenticated connections; closing one of its own")
	return true
}

// evictUnauth closes the best-ranked (evictRank) of the loop's oldest
// evictScan unauthenticated sessions, to make room for a new connection;
// it reports whether it found one. A session waiting out the delay of a
// refused SASL AUTH may be evicted, first: otherwise refusals, which cost
// no password check, would keep the share full of connections nobody can
// close. On the loop.
func (lp *loop) evictUnauth() bool {
	victim := lp.evictCandidate("", evictScan)
	if victim == nil {
		return false
	}
	victim.leaveUnauth()
	lp.evict(victim, "unauthenticated connection share full; closing one to admit a new one")
	return true
}

// evictCandidate returns the best-ranked candidate, the oldest within a
// rank, or nil: among the oldest n candidates of the loop when src is "",
// or among src's sessions within the loop's oldest n unauthenticated ones.
// For src, a login waiting its turn under a penalty is taken only when no
// other session of src is a candidate, however far down the list: past
// the n, the scan goes on while it has found no better.
func (lp *loop) evictCandidate(src string, n int) *session {
	var victim *session
	best := 0
	for s := lp.unauth.head; s != nil && (n > 0 || src != "" && best <= rankPenalised); s = s.links[listUnauth].next {
		r := evictRank(s)
		if src != "" {
			n--
			if s.src != src {
				continue
			}
		} else if r > 0 {
			n--
		}
		if r > best {
			victim, best = s, r
			if r == rankRefused {
				break
			}
		}
	}
	return victim
}

// evict closes s, an unauthenticated session taken off lp.unauth, to make
// room for a new connection.
func (lp *loop) evict(s *session, why string) {
	s.quitting = true
	s.evicted = true
	lp.srv.conns.Add(-1) // its place is the new connection's now
	_ = s.c.Close()
	n := lp.srv.unauthEvicted.Add(1)
	lp.srv.log.Debug().Str("remote", s.remote).Msg(why)
	if n%1000 == 1 {
		lp.srv.log.Warn().Int64("unauthenticated_limit", lp.srv.opts.unauthMax).Str("remote", s.remote).
			Uint64("evicted_total", n).Msg("unauthenticated connections fill their share; closing the oldest to admit new ones")
	}
}

// evictScan bounds the candidates evictUnauth looks at for a refused one.
const evictScan = 64

// authenticated records that the session's client has proved who it is
// (SASL succeeded): the pre-authentication bounds and auth_timeout no
// longer apply, and it leaves the unauthenticated share. On the loop;
// idempotent.
func (s *session) authenticated() {
	s.needAuth = false
	s.leaveUnauth()
}

// unauthenticated puts a session that lost its identity (a refused SASL
// re-authentication, with no default bucket) back under the
// pre-authentication bounds, with a fresh auth_timeout. On the loop;
// idempotent.
func (s *session) unauthenticated() {
	if s.needAuth || s.closed {
		return
	}
	s.needAuth = true
	s.openedAt = s.lp.clock()
	s.lp.unauth.pushBack(s)
	s.lp.srv.unauthConns.Add(1)
	if s.src == "" {
		s.src = authSource(s.remote)
	}
	s.lp.unauthSrc.take(s.src, -1) // it has held a place already
}

// leaveUnauth takes the session out of the unauthenticated share (list and
// count). Idempotent.
func (s *session) leaveUnauth() {
	if s.lp.unauth.remove(s) {
		s.lp.srv.unauthConns.Add(-1)
		s.lp.unauthSrc.release(s.src)
	}
}

// maxBody is the largest frame body the session accepts now.
func (s *session) maxBody() int {
	if s.needAuth {
		return preAuthMaxBody
	}
	return s.lp.srv.opts.maxBodyBytes
}

// touch records activity for idle_timeout (input from the client, a
// response for it): the session moves to the back of lp.idle, at most once
// per tick.
func (s *session) touch() {
	if s.lastActive == s.lp.now || !s.links[listIdle].in {
		return
	}
	s.lastActive = s.lp.now
	s.lp.idle.moveToBack(s)
}

// busy reports whether the session has anything going on that makes it
// not idle: a command in flight, held or paused, input waiting, or output
// the client has not read.
func (s *session) busy() bool {
	return s.pending() > 0 || s.pause != running ||
		len(s.out) > 0 || s.c.InboundBuffered() > 0 || s.c.OutboundBuffered() > 0
}

// sweepConns closes the sessions whose auth_timeout or idle_timeout has
// passed; on the loop, at each tick. Both lists are ordered by deadline
// (auth: by opening time, all with the same timeout; idle: by last activity),
// so the sweep looks only at sessions that are due, and 10,000 idle
// connections cost nothing between their deadlines.
func (lp *loop) sweepConns() {
	now := lp.now
	srv := lp.srv
	if d := srv.opts.authTimeout; d > 0 {
		for s := lp.unauth.head; s != nil && now-s.openedAt >= d; s = lp.unauth.head {
			s.leaveUnauth()
			if s.quitting || s.closed {
				continue
			}
			s.quitting = true
			_ = s.c.Close()
			n := srv.authTimeouts.Add(1)
			srv.log.Debug().Str("remote", s.remote).Dur("auth_timeout", d).Msg("connection did not authenticate in time; closing it")
			if n%1000 == 1 {
				srv.log.Warn().Dur("auth_timeout", d).Str("remote", s.remote).Uint64("closed_total", n).
					Msg("connections did not authenticate within auth_timeout; closing them")
			}
		}
	}
	if d := srv.opts.idleTimeout; d > 0 {
		// lastActive is the loop clock before the input, which may have
		// come up to a tick later: a tick more makes sure the client
		// really was silent for d. A busy session due for the check is
		// moved to the back as if it had just been active; the loop ends
		// at the first one not due.
		for s := lp.idle.head; s != nil && now-s.lastActive >= d+tickInterval; s = lp.idle.head {
			switch {
			case s.quitting || s.closed:
				lp.idle.remove(s)
			case s.busy():
				s.lastActive = now
				lp.idle.moveToBack(s)
			default:
				lp.idle.remove(s)
				s.quitting = true
				_ = s.c.Close()
				srv.idleClosed.Add(1)
				srv.log.Debug().Str("remote", s.remote).Dur("idle_timeout", d).Msg("connection idle; closing it")
			}
		}
	}
}
