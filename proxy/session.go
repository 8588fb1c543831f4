package proxy

import (
	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// session is one client connection. It decodes the client's frames,
// answers local commands, forwards the rest upstream, and writes the
// responses back in request order. Only its loop touches it.
type session struct {
	lp *loop
	c  gnet.Conn

	q  []*slot // commands not yet answered to the client, oldest first
	qh int     // q[qh] is the oldest

	out      []byte // response bytes to write at the next flush
	dirty    bool   // queued on lp.dirty
	closed   bool   // the client connection is gone
	quitting bool   // close once every queued response is written
	waiting  bool   // paused until an upstream connection has room

	prefix []byte // key namespace of the session's bucket
}

func newSession(lp *loop, c gnet.Conn) *session {
	s := &session{lp: lp, c: c}
	lp.sessions[s] = struct{}{}
	return s
}

// slot is one command in a session's response queue. It is the
// upstream.Waiter of forwarded commands.
type slot struct {
	s      *session
	req    binary.Header // the client's request header
	done   bool
	resp   []byte // response bytes, while an earlier command is pending
	strip  int    // bytes of key prefix to strip from responses
	sentKV int    // key+value bytes the client sent (write units)
	gotKV  int    // key+value bytes returned (read units)
}

func (s *session) pending() int { return len(s.q) - s.qh }

// onTraffic decodes and dispatches every whole frame buffered for the
// client, unless the session is paused.
func (s *session) onTraffic() gnet.Action {
	if s.quitting {
		_, _ = s.c.Discard(-1)
		return gnet.None
	}
	if s.waiting {
		return s.checkBuffered()
	}
	buf, _ := s.c.Peek(-1)
	off := 0
	maxBody := s.lp.srv.opts.MaxFrameBytes
	for off < len(buf) {
		f, n, err := binary.Decode(buf[off:], maxBody)
		if err != nil {
			s.badFrame(&f, err)
			break
		}
		if n == 0 {
			break
		}
		if !s.dispatch(&f) {
			break
		}
		off += n
		if s.quitting || s.waiting {
			break
		}
	}
	if off > 0 { // Discard(0) would drop everything buffered
		_, _ = s.c.Discard(off)
	}
	s.lp.flushUpstreams()
	s.flush()
	if s.quitting {
		return gnet.None
	}
	return s.checkBuffered()
}

// checkBuffered enforces the bound on unprocessed input.
func (s *session) checkBuffered() gnet.Action {
	if n := s.c.InboundBuffered(); n > s.lp.srv.opts.MaxBufferedInput {
		s.lp.srv.log.Warn().Str("remote", s.c.RemoteAddr().String()).Int("buffered", n).
			Int("limit", s.lp.srv.opts.MaxBufferedInput).Msg("client input buffer limit exceeded; closing connection")
		return gnet.Close
	}
	return gnet.None
}

// badFrame answers an invalid header with Einval when a response is
// possible, then closes the connection once earlier responses are out.
func (s *session) badFrame(f *binary.Frame, err error) {
	s.lp.srv.log.Info().Str("remote", s.c.RemoteAddr().String()).Err(err).Msg("invalid frame from client; closing connection")
	if f.Magic.Valid() {
		s.local(func(b []byte) []byte { return binary.AppendError(b, &f.Header, binary.StatusEinval, err.Error()) })
	}
	s.quit()
}

// quit makes the session close once every queued response is written.
func (s *session) quit() {
	s.quitting = true
	s.markDirty()
}

// dispatch handles one whole client frame. It returns false when the frame
// was not consumed and must be retried later (the session is paused).
func (s *session) dispatch(f *binary.Frame) bool {
	if !f.Magic.IsRequest() {
		s.badFrame(f, errNotRequest)
		return true
	}
	switch op := f.Opcode; op {
	case binary.OpNoop:
		s.localStatus(f, binary.StatusSuccess, "")
	case binary.OpQuit:
		s.localStatus(f, binary.StatusSuccess, "")
		s.quit()
	case binary.OpQuitQ:
		s.quit()
	case binary.OpHello:
		s.hello(f)
	default:
		if !op.Memcached() {
			s.localStatus(f, binary.StatusUnknownCommand, "unknown command "+op.String())
			return true
		}
		return s.forward(f)
	}
	return true
}

// forward sends f to the upstream server of its key.
func (s *session) forward(f *binary.Frame) bool {
	key := f.Key()
	if len(s.prefix)+len(key) > binary.MaxKeyLen {
		s.localStatus(f, binary.StatusEinval, "key too long")
		return true
	}
	u := s.lp.pick(key)
	if u.Full() {
		s.waiting = true
		u.NotifyRoom(s.resume)
		return false
	}
	sl := s.lp.getSlot()
	sl.s = s
	sl.req = f.Header
	sl.strip = len(s.prefix)
	sl.sentKV = len(key) + len(f.Value())
	s.enqueue(sl)
	s.lp.srv.inflight.Add(1)
	_ = u.Forward(f, s.prefix, sl) // a failure has already answered sl
	return true
}

// resume restarts dispatching after a pause; called on the loop.
func (s *session) resume() {
	if s.closed || !s.waiting {
		return
	}
	s.waiting = false
	_ = s.c.Wake(nil)
}

func (s *session) enqueue(sl *slot) {
	if s.qh > 0 && s.qh == len(s.q) {
		s.q, s.qh = s.q[:0], 0
	}
	s.q = append(s.q, sl)
}

// local queues a response produced by the proxy itself, in order.
func (s *session) local(appendResp func([]byte) []byte) {
	if s.pending() == 0 {
		s.out = appendResp(s.out)
		s.markDirty()
		return
	}
	sl := s.lp.getSlot()
	sl.s = s
	sl.done = true
	sl.resp = appendResp(sl.resp)
	s.enqueue(sl)
	s.lp.srv.inflight.Add(1)
}

func (s *session) localStatus(f *binary.Frame, st binary.Status, reason string) {
	h := f.Header
	s.local(func(b []byte) []byte { return binary.AppendError(b, &h, st, reason) })
}

func (s *session) markDirty() {
	if !s.dirty {
		s.dirty = true
		s.lp.dirty = append(s.lp.dirty, s)
	}
}

// flush writes the session's output to the client.
func (s *session) flush() {
	s.dirty = false
	if s.closed {
		return
	}
	if len(s.out) > 0 {
		_, _ = s.c.Write(s.out)
		if cap(s.out) > 1<<20 {
			s.out = nil
		} else {
			s.out = s.out[:0]
		}
	}
	if s.pending() == 0 && (s.quitting || s.lp.srv.draining.Load() && s.c.InboundBuffered() == 0) {
		_ = s.c.Close()
	}
}

// close is called when the client connection is gone. Slots still in
// flight upstream are released when they resolve.
func (s *session) close() {
	s.closed = true
	delete(s.lp.sessions, s)
	for i := s.qh; i < len(s.q); i++ {
		sl := s.q[i]
		s.q[i] = nil
		if sl.done {
			s.lp.srv.inflight.Add(-1)
			s.lp.putSlot(sl)
		}
	}
	s.q, s.qh = nil, 0
	s.out = nil
}

// advance moves every answered command at the head of the queue to the
// output.
func (s *session) advance() {
	for s.qh < len(s.q) && s.q[s.qh].done {
		sl := s.q[s.qh]
		s.q[s.qh] = nil
		s.qh++
		s.out = append(s.out, sl.resp...)
		s.finish(sl)
	}
	if s.qh == len(s.q) {
		s.q, s.qh = s.q[:0], 0
	} else if head := s.q[s.qh]; len(head.resp) > 0 {
		// A streaming response (STAT) that began while an earlier command
		// was pending: what it has so far goes out now, the rest directly.
		s.out = append(s.out, head.resp...)
		head.resp = head.resp[:0]
	}
	s.markDirty()
}

// finish accounts for a completed command and recycles its slot.
func (s *session) finish(sl *slot) {
	s.lp.srv.inflight.Add(-1)
	s.lp.putSlot(sl)
}

func (sl *slot) isHead() bool { s := sl.s; return s.qh < len(s.q) && s.q[s.qh] == sl }

// Deliver implements upstream.Waiter.
func (sl *slot) Deliver(f *binary.Frame, done bool) {
	s := sl.s
	sl.gotKV += int(f.KeyLen) - sl.strip + len(f.Value())
	if s.closed {
		if done {
			s.finish(sl)
		}
		return
	}
	if sl.isHead() {
		s.out = sl.appendResponse(s.out, f)
	} else {
		sl.resp = sl.appendResponse(sl.resp, f)
	}
	if done {
		sl.done = true
		s.advance()
	} else {
		s.markDirty()
	}
}

// Silent implements upstream.Waiter.
func (sl *slot) Silent() {
	s := sl.s
	if s.closed {
		s.finish(sl)
		return
	}
	sl.done = true
	s.advance()
}

// Fail implements upstream.Waiter.
func (sl *slot) Fail(st binary.Status, reason string) {
	s := sl.s
	if s.closed {
		s.finish(sl)
		return
	}
	sl.resp = binary.AppendError(sl.resp, &sl.req, st, reason)
	sl.done = true
	s.advance()
}

// appendResponse appends the client's view of an upstream response: the
// client's opaque, and the key without the bucket prefix.
func (sl *slot) appendResponse(dst []byte, f *binary.Frame) []byte {
	n := len(dst)
	if sl.strip == 0 || f.KeyLen == 0 {
		dst = append(dst, f.Raw...)
		binary.SetOpaque(dst[n:], sl.req.Opaque)
		return dst
	}
	key := f.Key()
	if len(key) >= sl.strip {
		key = key[sl.strip:]
	}
	h := f.Header
	h.Opaque = sl.req.Opaque
	return binary.AppendFrame(dst, h, nil, f.Extras(), key, f.Value())
}
