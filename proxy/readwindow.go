package proxy

import "github.com/kvthrottle/kvthrottle/proto/binary"

// readWindow is the one proxy type for "the reads a bucket may have in
// flight from a loop" (a lane's): their expected response bytes, bounded
// by maxReadsInFlight (and their count by maxLaneReads on connections
// shared with other buckets), and the sessions waiting for room in it.
// What the reads cost is the throttle's to know (throttle.ReadCost, the
// bucket's ceiling, billed at admission): the window only bounds what
// their responses stand ahead of a neighbour's and the memory they take,
// with expected sizes learned from the bucket's reads and capped by the
// ceiling. Only its loop touches it.
type readWindow struct {
	bytes    int    // expected response bytes of the reads in flight
	reads    int    // reads in flight
	readSize int    // response bytes a read of the bucket brings here (learned); 0: none answered yet
	waiting  int    // sessions paused until a read of theirs fits (session.laneWait)
	full     uint64 // the loop.resumePaused pass in which a waiting session found no room
}

// learnSize moves an expected response size toward n: at once to a larger
// one, by an eighth of the difference to a smaller one.
func learnSize(size *int, n int) {
	if n >= *size {
		*size = n
	} else {
		*size -= (*size - n) >> 3
	}
}

// reserve counts a slot just queued among the session's reads in flight
// when it is a read still to be answered.
func (s *session) reserve(sl *slot) {
	if sl.done || !isRead(sl.req.op) {
		return
	}
	sl.reserved = true
	s.readsOut++
	if s.bkt == nil {
		return
	}
	l := s.lane()
	sl.lane = l
	sl.flight = s.expectedRead()
	l.bytes += sl.flight
	l.reads++
}

// unreserve stops counting a finished slot among the reads in flight, and
// learns the size of its response, for the session and its lane, when it
// found its item: misses and errors, which cost nothing to ask for, say
// nothing of the size of the bucket's values.
func (s *session) unreserve(sl *slot) {
	if !sl.reserved {
		return
	}
	sl.reserved = false
	s.readsOut--
	n := binary.HeaderLen + 4 + sl.gotKV
	if sl.hit {
		learnSize(&s.readSize, n)
	}
	if l := sl.lane; l != nil {
		l.bytes -= sl.flight
		l.reads--
		if sl.hit {
			learnSize(&l.readSize, n)
		}
		sl.lane, sl.flight = nil, 0
	}
}

// expectedRead is the response bytes the session's next read is expected
// to bring: the larger of what the session's and its bucket's recent
// reads on this loop brought, at most what its key's bill allows (the
// throttle's estimator of a read's cost, throttle.ReadCost.KeyBound: the
// bucket's ceiling, or the key's class when it is listed as large; the
// bucket's bound when the key is not known), and that bill's bytes while
// neither has found an item; the largest a read can be for a session
// without a bucket.
func (s *session) expectedRead() int {
	n := s.readSize
	if s.bkt == nil {
		if n == 0 {
			return s.lp.srv.opts.maxReadResp
		}
		return n
	}
	u := s.readCap
	if u == 0 {
		u = s.bkt.tb.ReadCost().Bound()
	}
	c := s.readBytes(u)
	if n = max(n, s.lane().readSize); n == 0 || n > c {
		return c
	}
	return n
}

// readBytes is the largest response a read of u read units brings: key
// and value, with the header and the flags.
func (s *session) readBytes(u int64) int {
	return binary.HeaderLen + 4 + int(min(u*s.lp.srv.opts.readUnitSize, 1<<40))
}

// flightRoom reports whether the session may start one more read in its
// bucket's lane: no earlier session waits for room (unless this is one),
// fewer than maxLaneReads are in flight when the lane shares the loop's
// upstream connections, and the read's expected response
// fits under maxReadsInFlight with theirs, or none is in flight. A session refused here waits (laneWait)
// and resumes in turn as the lane's reads settle (loop.resumePaused runs
// after every batch of responses).
func (s *session) flightRoom() bool {
	if s.bkt == nil {
		return true
	}
	l := s.lane()
	if !s.laneWait && l.waiting > 0 || l.full == s.lp.pass {
		return false
	}
	if l.reads == 0 {
		return true
	}
	if l.group == nil && l.reads >= maxLaneReads {
		return false
	}
	return l.bytes+s.expectedRead() <= maxReadsInFlight
}

// waitForLane records that the session pauses for room in its lane, when
// that is why it pauses before request r; it keeps its turn until it has
// dispatched r (session.onTraffic), closes, or is found unable to go on
// for another reason while the lane has room (loop.resumePaused).
func (s *session) waitForLane(r *request) {
	if s.laneWait || s.bkt == nil || !isRead(r.op) || s.flightRoom() {
		return
	}
	s.joinLaneLine()
}

// joinLaneLine takes the session, paused, a place in its bucket's lane's
// line (s.bkt not nil, not in line yet).
func (s *session) joinLaneLine() {
	s.laneWait = true
	l := s.lane()
	l.waiting++
	if l.reads == 0 {
		// No response of the bucket is coming to resume it: those
		// ahead of it in line may go now, and then it may.
		s.lp.requestResume()
	}
}

// leaveLaneWait ends the session's wait for room in its lane, if it waits.
func (s *session) leaveLaneWait() {
	if s.laneWait {
		s.laneWait = false
		s.ln.waiting--
	}
}
