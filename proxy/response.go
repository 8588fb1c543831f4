package proxy

import (
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// slot is one command in a session's response queue. It is the
// upstream.Waiter of forwarded commands.
type slot struct {
	s      *session
	req    binary.Header // the client's request header
	done   bool
	resp   []byte // response bytes, while an earlier command is pending
	strip  int    // bytes of key prefix to strip from responses
	bkt    *bucket
	grant  throttle.Grant // the command's bill, settled when it completes; Domain Held: not metered
	units  bool           // ReportUnitUsage was on when the command was sent
	sentKV int            // key+value bytes the client sent (write units)
	gotKV  int            // key+value bytes returned (read units)

	reserved bool  // counted in session.readsOut until finished
	lane     *lane // the lane its expected response is counted in (lane.go); nil: none
	flight   int   // its expected response bytes counted in lane.bytes
}

func (s *session) pending() int { return len(s.q) - s.qh }

func (s *session) enqueue(sl *slot) {
	if s.qh > 0 && s.qh == len(s.q) {
		s.q, s.qh = s.q[:0], 0
	}
	s.q = append(s.q, sl)
	s.reserve(sl)
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
	s.slotBytes += len(sl.resp)
	s.enqueue(sl)
	s.lp.srv.inflight.Add(1)
}

// later queues a slot whose local response comes later, from off-loop
// work; complete it on the loop with completeLater.
func (s *session) later(f *binary.Frame) *slot {
	sl := s.lp.getSlot()
	sl.s = s
	sl.req = f.Header
	s.enqueue(sl)
	s.lp.srv.inflight.Add(1)
	return sl
}

// completeLater answers a slot from later with the response appendResp
// builds; on the loop.
func (s *session) completeLater(sl *slot, appendResp func([]byte) []byte) {
	if s.closed {
		s.finish(sl)
		return
	}
	n := len(sl.resp)
	sl.resp = appendResp(sl.resp)
	s.slotBytes += len(sl.resp) - n
	sl.done = true
	s.advance()
}

func (s *session) localStatus(f *binary.Frame, st binary.Status, reason string) {
	h := f.Header
	s.local(func(b []byte) []byte { return binary.AppendError(b, &h, st, reason) })
}

// advance moves every answered command at the head of the queue to the
// output.
func (s *session) advance() {
	for s.qh < len(s.q) && s.q[s.qh].done {
		sl := s.q[s.qh]
		s.q[s.qh] = nil
		s.qh++
		s.out = append(s.out, sl.resp...)
		s.slotBytes -= len(sl.resp)
		s.finish(sl)
	}
	switch {
	case s.qh == len(s.q):
		s.q, s.qh = s.q[:0], 0
	case s.qh > 64 && s.qh > len(s.q)/2:
		// Overlapping pipelines never empty the queue: compact it.
		n := copy(s.q, s.q[s.qh:])
		clear(s.q[n:])
		s.q, s.qh = s.q[:n], 0
	}
	if s.qh < len(s.q) {
		if head := s.q[s.qh]; len(head.resp) > 0 {
			// A streaming response (STAT) that began while an earlier
			// command was pending: what it has so far goes out now, the
			// rest directly.
			s.out = append(s.out, head.resp...)
			s.slotBytes -= len(head.resp)
			head.resp = head.resp[:0]
		}
	}
	s.markDirty()
}

// finish charges a completed command's units and recycles its slot. A
// session held until its bucket's reads in flight settle re-tries once
// this loop has handled the responses at hand (lp.retry).
func (s *session) finish(sl *slot) {
	s.unreserve(sl)
	if sl.grant.Domain != throttle.Held {
		s.lp.srv.settle(sl)
		if s.pause == heldOnReads && !s.closed {
			s.setPause(held)
			s.lp.retry = append(s.lp.retry, s)
		}
	}
	s.lp.srv.inflight.Add(-1)
	s.lp.putSlot(sl)
}

// settle bills a completed command's units (DESIGN.md section 4) against
// what was billed at admission: its write units, plus the read units of
// the key and value returned. Every metered command is settled exactly
// once, also when it failed or its client went away (at least one unit).
func (srv *Server) settle(sl *slot) {
	var units int64
	cls := sl.req.Opcode.Class()
	if cls != binary.ClassRead { // writes and GAT: the key and value sent
		units = throttle.WriteUnits(int64(sl.sentKV), srv.opts.writeUnitSize)
	}
	if cls != binary.ClassWrite { // reads and GAT: the key and value returned
		r := throttle.ReadUnits(int64(sl.gotKV), srv.opts.readUnitSize)
		sl.bkt.readUnits.Add(uint64(r))
		units += r
	}
	sl.bkt.tb.Settle(sl.grant, units)
}

func (sl *slot) isHead() bool { s := sl.s; return s.qh < len(s.q) && s.q[s.qh] == sl }

// Deliver implements upstream.Waiter.
func (sl *slot) Deliver(f *binary.Frame, done bool) {
	s := sl.s
	if k := int(f.KeyLen) - sl.strip; k > 0 {
		sl.gotKV += k
	}
	sl.gotKV += len(f.Value())
	if s.closed {
		if done {
			s.finish(sl)
		}
		return
	}
	if sl.isHead() {
		s.out = sl.appendResponse(s.out, f)
	} else {
		n := len(sl.resp)
		sl.resp = sl.appendResponse(sl.resp, f)
		s.slotBytes += len(sl.resp) - n
	}
	if done {
		sl.done = true
		s.advance()
	} else {
		s.markDirty()
	}
	s.overCap()
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
	n := len(sl.resp)
	sl.resp = binary.AppendError(sl.resp, &sl.req, st, reason)
	s.slotBytes += len(sl.resp) - n
	sl.done = true
	s.advance()
}

// appendWithUnits appends the client's view of a metered command's response
// with flexible framing (magic 0x18) carrying the read and write units it
// was charged (framing-info IDs 0x01 and 0x02, read and write units), for clients that negotiated
// ReportUnitUsage.
func (sl *slot) appendWithUnits(dst []byte, f *binary.Frame) []byte {
	srv := sl.s.lp.srv
	var ru, wu int64
	switch sl.req.Opcode.Class() {
	case binary.ClassRead:
		ru = throttle.ReadUnits(int64(sl.gotKV), srv.opts.readUnitSize)
	case binary.ClassWrite:
		wu = throttle.WriteUnits(int64(sl.sentKV), srv.opts.writeUnitSize)
	case binary.ClassReadWrite:
		ru = throttle.ReadUnits(int64(sl.gotKV), srv.opts.readUnitSize)
		wu = throttle.WriteUnits(int64(sl.sentKV), srv.opts.writeUnitSize)
	}
	var feBuf [8]byte
	fe := feBuf[:0]
	if ru > 0 {
		fe = binary.AppendFrameInfo(fe, binary.FrameInfoReadUnits, units16(ru))
	}
	if wu > 0 {
		fe = binary.AppendFrameInfo(fe, binary.FrameInfoWriteUnits, units16(wu))
	}
	key := f.Key()
	if len(key) >= sl.strip {
		key = key[sl.strip:]
	}
	h := f.Header
	h.Magic = binary.MagicAltResponse
	h.Opaque = sl.req.Opaque
	return binary.AppendFrame(dst, h, fe, f.Extras(), key, f.Value())
}

// units16 encodes a unit count as the 16-bit big-endian value of a
// framing-info entry, saturating at 65535.
func units16(u int64) []byte {
	if u > 0xffff {
		u = 0xffff
	}
	return []byte{byte(u >> 8), byte(u)}
}

// appendResponse appends the client's view of an upstream response: the
// client's opaque, the key without the bucket prefix, and the units used
// when the client had asked for them (HELLO ReportUnitUsage) before it
// sent the command.
func (sl *slot) appendResponse(dst []byte, f *binary.Frame) []byte {
	n := len(dst)
	if sl.units && sl.grant.Domain != throttle.Held {
		return sl.appendWithUnits(dst, f)
	}
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
