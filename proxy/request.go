package proxy

import (
	"errors"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
	"github.com/kvthrottle/kvthrottle/upstream"
)

// dispatch handles one client command. It returns false when the command
// was not consumed and must be retried later (the session paused).
func (s *session) dispatch(r *request) bool {
	switch op := r.op; op {
	case binary.OpNoop:
		s.localStatus(r, binary.StatusSuccess, "")
	case binary.OpQuit:
		s.localStatus(r, binary.StatusSuccess, "")
		s.quit()
	case binary.OpQuitQ:
		s.quit()
	case binary.OpHello:
		s.hello(r)
	case binary.OpSASLListMechs:
		s.localValue(r, binary.StatusSuccess, s.saslMechs())
	case binary.OpSASLAuth:
		s.saslAuth(r)
	case binary.OpSASLStep:
		s.scramStep(r)
	case binary.OpSelectBucket:
		s.selectBucket(r)
	case binary.OpSetBucketThrottleProperties, binary.OpSetNodeThrottleProperties:
		s.admin(r)
	case binary.OpStat:
		return s.stat(r)
	case binary.OpVersion:
		return s.version(r)
	case binary.OpVerbosity:
		// Not forwarded: memcached (1.6) has no binary VERBOSITY and, after
		// its UnknownCommand, swallows the first bytes of the next request
		// on the connection, which other sessions share (all the loop's with
		// upstream.conns_per_bucket off, the bucket's otherwise).
		if !s.isAdmin() {
			s.localStatus(r, binary.StatusEaccess, "VERBOSITY needs the admin privilege")
			return true
		}
		s.localStatus(r, binary.StatusNotSupported, "VERBOSITY is not supported through kvthrottle")
	case binary.OpFlush, binary.OpFlushQ:
		return s.flushBucket(r)
	default:
		if !op.Memcached() {
			s.localStatus(r, binary.StatusUnknownCommand, "unknown command "+op.String())
			return true
		}
		if s.bkt == nil {
			s.noBucket(r)
			return true
		}
		return s.forward(r, s.bkt)
	}
	return true
}

func (s *session) isAdmin() bool { return s.user != nil && s.user.IsAdmin() }

// noBucket answers a data command of a session without a bucket.
func (s *session) noBucket(r *request) {
	if s.user == nil {
		s.localStatus(r, binary.StatusEaccess, "authentication required")
		return
	}
	s.localStatus(r, binary.StatusEaccess, "no bucket selected")
}

// badFrame answers an invalid header (bad magic, body too large,
// inconsistent lengths) with Einval, then closes the connection once
// earlier responses are out.
func (s *session) badFrame(r *request, err error) {
	srv := s.lp.srv
	srv.logBadInput.event(&srv.log, zerolog.InfoLevel).Str("remote", s.remote).Err(err).Msg("invalid frame from client; closing connection")
	s.localStatus(r, binary.StatusEinval, err.Error())
	s.quit()
}

var errNotRequest = errors.New("frame is not a request (bad magic)")

// mode is how the throttle engine treats this session.
func (s *session) mode() throttle.Mode {
	switch {
	case s.user != nil && s.user.IsUnthrottled():
		return throttle.Unthrottled
	case s.nonBlocking:
		return throttle.NonBlocking
	}
	return throttle.Blocking
}

// forward sends r upstream in bucket b's namespace (b nil: no namespace,
// not metered), after admission when r is metered.
func (s *session) forward(r *request, b *bucket) bool {
	if r.meta || r.tooLarge {
		// Checked by the parser, as memcached checks it; or checked by
		// the codec, and no frame (toolarge.go).
	} else if err := binary.ValidateRequest(&r.frame); err != nil {
		// memcached would answer Einval and close the shared upstream
		// connection, failing other clients' requests: answer here.
		s.localStatus(r, binary.StatusEinval, err.Error())
		return true
	}
	key := r.key
	var prefix []byte
	if b != nil {
		if b.gone.Load() {
			s.localStatus(r, binary.StatusEaccess, "bucket removed")
			s.quit()
			return true
		}
		if b.flushing.Load() > 0 {
			s.waitFlush()
			return false
		}
		if b.pending.Load() != nil {
			s.lp.srv.applyDueFlush(b)
		}
		prefix = *b.prefix.Load()
	}
	if r.meta && s.text.meta.tooLong(len(prefix)) || !r.meta && len(prefix)+len(key) > binary.MaxKeyLen {
		// The namespace grew (a FLUSH) since the codec checked.
		s.localStatus(r, binary.StatusEinval, reasonKeyTooLong)
		return true
	}
	var u *upstream.Conn
	if g := s.group(b); g != nil {
		u = g.Pick(key)
	} else {
		u = s.lp.pool.Pick(key)
	}
	if r.meta {
		u = u.Meta()
	}
	if s.mustWaitOrder(r.meta) {
		return false
	}
	if u.Full() {
		s.setPause(waitingUpstream)
		u.NotifyRoom(s.unpauseFn)
		return false
	}
	if b != nil && r.op.Class() == binary.ClassWrite && len(r.value) > 0 && !s.raiseCeiling(b, r) {
		s.app.Release() // (an APPEND's bytes count in flight only while it goes)
		return false
	}
	var grant throttle.Grant
	var leased *lane
	if b != nil && r.op.Class().Metered() {
		// Billed in advance: a write's units (known now), a read's
		// expected units; settled when the response is in (finish).
		cost := s.lp.srv.cost(r.op.Class(), len(key)+len(r.value))
		if cost.Read {
			cost.Key = key // (a large key is billed its class)
		}
		if r.tooLarge {
			cost = throttle.Cost{Known: 1} // the refusal and its unlink (toolarge.go)
		}
		g, wait, l := s.admit(b, cost)
		if g.Domain == throttle.Held {
			s.app.Release() // its next attempt reserves again
			return s.throttled(r, b, wait)
		}
		if s.heldAt != 0 {
			s.lp.srv.throttleWait(b, s.lp.srv.throttle.Now()-s.heldAt)
			s.heldAt = 0
		}
		grant, leased = g, l
		if cost.Known > 0 {
			if l != nil {
				l.writeUnits += uint64(cost.Known) // admit touched l: added before the next client write (settleLeases)
			} else {
				b.writeUnits.Add(uint64(cost.Known))
			}
		}
	}
	sl := s.lp.getSlot()
	if s.app.Held() { // an APPEND: its slot completes the reservation
		sl.app, s.app = s.app, throttle.AppendRes{}
		sl.appKey = append(sl.appKey[:0], r.key...)
	}
	sl.s = s
	sl.req = r.head()
	sl.strip = len(prefix)
	sl.bkt = b
	sl.grant, sl.leased = grant, leased
	sl.units = s.reportUnits
	sl.sentKV = len(key) + len(r.value)
	s.enqueue(sl)
	s.lp.addInflight(1)
	if r.tooLarge {
		s.sendRefused(r, sl, u, prefix)
		return true
	}
	s.enterPath(sl, r.meta)
	if r.meta {
		m := &s.text.meta
		rawKey := 0
		if m.b64 {
			rawKey = len(prefix) + len(m.key)
		}
		_ = u.ForwardMeta(s.text.upstreamLine(prefix), m.data, m.quiet, rawKey, sl) // as Forward
		return true
	}
	_ = u.Forward(&r.frame, prefix, sl) // a failure has already answered sl
	return true
}

// reasonKeyTooLong is the reason of the Einval a command gets when its
// key is too long for memcached in its bucket's namespace (a text client
// gets memcached's own words for a key over 250 bytes, errBadCommandLine).
const reasonKeyTooLong = "key too long"

// cost is what a metered command of class cls, with kv bytes of key and
// value sent, is known to cost before it runs (DESIGN.md section 4): a
// write's units, and whether it reads (its read units come with the
// response).
func (srv *Server) cost(cls binary.Class, kv int) throttle.Cost {
	switch cls {
	case binary.ClassRead:
		return throttle.Cost{Read: true}
	case binary.ClassReadWrite: // GAT: both
		return throttle.Cost{Known: throttle.WriteUnits(int64(kv), srv.opts.writeUnitSize), Read: true}
	}
	return throttle.Cost{Known: throttle.WriteUnits(int64(kv), srv.opts.writeUnitSize)}
}

// waitFlush parks the session until its bucket's admitted FLUSHes are in
// effect (waitingFlush), woken by wakeHeld when a FLUSH completes; the
// command is then dispatched again. Not a throttle hold: it is not
// metered as throttle wait. On the loop.
func (s *session) waitFlush() {
	s.setPause(waitingFlush)
	if testHookFlushWait != nil {
		testHookFlushWait()
	}
}

// testHookFlushWait, when set (by tests, before the Server starts), runs
// when a session starts waiting for its bucket's FLUSH.
var testHookFlushWait func()
