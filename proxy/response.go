package proxy

import (
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
	"github.com/kvthrottle/kvthrottle/throttle"
	"github.com/kvthrottle/kvthrottle/upstream"
)

// slot is one command in a session's response queue. It is the
// upstream.Waiter of forwarded commands.
type slot struct {
	s       *session
	req     reqHead // what its answer needs of the client's request
	done    bool
	resp    []byte // response bytes, while an earlier command is pending
	strip   int    // bytes of key prefix to strip from responses
	bkt     *bucket
	grant   throttle.Grant // the command's bill, settled when it completes; Domain Held: not metered
	leased  *lane          // the lane whose lease grant came from (settled with it); nil: the bucket
	units   bool           // ReportUnitUsage was on when the command was sent
	sentKV  int            // key+value bytes the client sent (write units)
	gotKV   int            // key+value bytes returned (read units)
	hit     bool           // succeeded; a read: found its item (lane.go learns sizes from hits only)
	path    upPath         // which kind of upstream connection it went on; none for local answers
	orphan  bool           // its session closed while it was in flight on its bucket's own connections (orphan.go)
	refused bool           // a write refused as too large: 1 unit, answered with the refusal (toolarge.go)

	owe   int64          // a read's units beyond its bill, not yet paid: its answer waits (surprise.go)
	extra throttle.Grant // the admission that paid what it cost beyond its bill

	// app, appKey: an APPEND or PREPEND's reservation of its bytes and
	// its key (the buffer kept with the pooled slot), completed when it
	// finishes (finishAppend); noStore: it stored nothing (memcached
	// answered anything but success, or it was never written upstream)
	app     throttle.AppendRes
	appKey  []byte
	noStore bool

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

// local queues a response to q produced by the proxy itself, in order.
func (s *session) local(q reqHead, appendResp func([]byte) []byte) {
	if s.pending() == 0 {
		n := len(s.out)
		s.out = appendResp(s.out)
		s.passOut(n, q)
		s.markDirty()
		return
	}
	sl := s.lp.getSlot()
	sl.s = s
	sl.req = q
	sl.done = true
	sl.resp = appendResp(sl.resp)
	s.slotBytes += len(sl.resp)
	s.enqueue(sl)
	s.lp.addInflight(1)
}

// later queues a slot whose local response comes later, from off-loop
// work; complete it on the loop with completeLater.
func (s *session) later(r *request) *slot {
	sl := s.lp.getSlot()
	sl.s = s
	sl.req = r.head()
	s.enqueue(sl)
	s.lp.addInflight(1)
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

// localStatus queues the proxy's status-only answer to r: st, and reason
// ("" for none).
func (s *session) localStatus(r *request, st binary.Status, reason string) {
	q := r.head()
	s.local(q, func(b []byte) []byte { return s.codec.appendError(b, q, st, reason) })
}

// localValue queues the proxy's answer to r: st and value, which must stay
// as it is until the answer is queued (heap memory: an interface call
// takes it).
func (s *session) localValue(r *request, st binary.Status, value []byte) {
	q := r.head()
	s.local(q, func(b []byte) []byte {
		return s.codec.appendResponse(b, q, response{op: q.op, status: st, value: value})
	})
}

// passOut takes back what was just appended to the client's output from
// offset n, the reply to q, unless the codec lets it go (codec.passes).
// Every reply reaches the output in request order through here or
// advance.
func (s *session) passOut(n int, q reqHead) {
	if !s.codec.passes(q, s.out[n:]) {
		s.out = s.out[:n]
	}
}

// advance moves every answered command at the head of the queue to the
// output.
func (s *session) advance() {
	for s.qh < len(s.q) && s.q[s.qh].done {
		sl := s.q[s.qh]
		s.q[s.qh] = nil
		s.qh++
		if s.codec.passes(sl.req, sl.resp) {
			s.out = append(s.out, sl.resp...)
		}
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
		if head := s.q[s.qh]; len(head.resp) > 0 && head.owe == 0 {
			// A streaming response (STAT) that began while an earlier
			// command was pending: what it has so far goes out now, the
			// rest directly.
			if s.codec.passes(head.req, head.resp) {
				s.out = append(s.out, head.resp...)
			}
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
	if sl.orphan {
		orphanDone(sl)
	}
	sl.finishAppend()
	s.unreserve(sl)
	s.leavePath(sl)
	if sl.grant.Domain != throttle.Held {
		s.lp.srv.settle(sl)
		if s.pause == heldOnReads && !s.closed {
			s.setPause(held)
			s.lp.retry = append(s.lp.retry, s)
		}
	}
	s.lp.addInflight(-1)
	s.lp.putSlot(sl)
}

// settle bills a completed command's units (DESIGN.md section 4) against
// what was billed at admission: its write units, plus the read units of
// the key and value returned. Every metered command is settled exactly
// once, also when it failed or its client went away (at least one unit).
//
// What a read cost beyond its bill and paid through admission before it
// was delivered (sl.extra, rule 3) is not billed again; what it could not
// pay (its session closed) becomes its bucket's debt. A settle that gives
// units back re-tries the loop's held sessions (rule 5, wakeRefunded); one
// that ends the wait of a raise of the bucket's ceiling wakes the writes
// that waited for it, on every loop (wakeCeiling).
func (srv *Server) settle(sl *slot) {
	countCmd(sl)
	read, write := srv.units(sl)
	units := read + write
	if sl.extra.Domain != throttle.Held {
		units -= sl.extra.Paid() - sl.extra.Debt() // (the debt it paid off was no part of it)
	}
	if sl.owe > 0 {
		// The excess of a surprise whose session closed before paying
		// it (session.close): the bucket's debt, paid by its next
		// command through admission, not charged now to the gauge the
		// read was admitted on (the free pool's, maybe).
		sl.bkt.tb.Owe(sl.owe)
		units -= sl.owe
	}
	if units < sl.grant.Paid() {
		sl.s.lp.noteRefund(sl.bkt, sl.grant.Domain)
	}
	if l := sl.leased; l != nil {
		l.readUnits += uint64(read)
		l.lease.Settle(sl.grant, units)
		sl.s.lp.touch(l)
	} else {
		if read > 0 {
			sl.bkt.readUnits.Add(uint64(read))
		}
		sl.bkt.tb.Settle(sl.grant, units)
	}
	if sl.grant.ReadBill() > 0 {
		if rc := sl.bkt.tb.ReadCost(); rc.Pending() && rc.TryDrain() {
			srv.wakeCeiling()
		}
	}
}

// units returns the read and write units of a metered command: the write
// units of the key and value sent (writes and GAT), the read units of the
// key and value returned (reads and GAT).
func (srv *Server) units(sl *slot) (read, write int64) {
	if sl.refused {
		return 0, 1
	}
	cls := sl.req.op.Class()
	if cls == binary.ClassWrite || cls == binary.ClassReadWrite {
		write = throttle.WriteUnits(int64(sl.sentKV), srv.opts.writeUnitSize)
	}
	if cls == binary.ClassRead || cls == binary.ClassReadWrite {
		read = throttle.ReadUnits(int64(sl.gotKV), srv.opts.readUnitSize)
	}
	return read, write
}

func (sl *slot) isHead() bool { s := sl.s; return s.qh < len(s.q) && s.q[s.qh] == sl }

// Deliver implements upstream.Waiter.
func (sl *slot) Deliver(f *binary.Frame, done bool) {
	s := sl.s
	if k := int(f.KeyLen) - sl.strip; k > 0 {
		sl.gotKV += k
	}
	sl.gotKV += len(f.Value())
	if f.Status() == binary.StatusSuccess {
		sl.hit = true
	} else {
		sl.noStore = true
	}
	if s.closed {
		if sl.orphan {
			s.lp.orphanAnswer(sl, len(f.Raw))
		}
		if done {
			sl.excess(len(f.Value()))
			s.finish(sl)
		}
		return
	}
	if sl.refused {
		sl.refusedAnswer() // memcached answered the unlink: the client gets the refusal
		return
	}
	if done && sl.surprised(len(f.Value())) {
		sl.keep(sl.response(f))
		return
	}
	sl.emit(sl.response(f), done)
}

// DeliverMeta implements upstream.MetaWaiter: memcached's reply to a meta
// command. A read counts the key and the value returned.
func (sl *slot) DeliverMeta(mr *text.MetaResponse) {
	s := sl.s
	sl.gotKV += sl.sentKV + len(mr.Value)
	if code := string(mr.Code); code == text.MetaVA || code == text.MetaHD {
		sl.hit = true
	} else {
		sl.noStore = true
	}
	if s.closed {
		if sl.orphan {
			s.lp.orphanAnswer(sl, len(mr.Value)+len(mr.Code))
		}
		sl.excess(len(mr.Value))
		s.finish(sl)
		return
	}
	r := response{op: sl.req.op, status: binary.StatusSuccess, value: mr.Value, meta: mr, strip: sl.strip, metaRaw: sl.strip + sl.sentKV}
	if sl.units && sl.grant.Domain != throttle.Held {
		r.units = true
		r.readUnits, r.writeUnits = s.lp.srv.units(sl)
	}
	if sl.surprised(len(mr.Value)) {
		sl.keep(r)
		return
	}
	sl.emit(r, true)
}

// emit appends resp, an answer to sl's command, to the client's output
// (or keeps it in the slot until the commands before it are answered);
// done: the command's last answer.
func (sl *slot) emit(resp response, done bool) {
	s := sl.s
	if sl.isHead() {
		n := len(s.out)
		s.out = s.codec.appendResponse(s.out, sl.req, resp)
		s.passOut(n, sl.req)
	} else {
		n := len(sl.resp)
		sl.resp = s.codec.appendResponse(sl.resp, sl.req, resp)
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

// Silent implements upstream.Waiter: a quiet command's silence, a miss
// for a read, a success for anything else.
func (sl *slot) Silent() {
	s := sl.s
	if c := sl.req.op.Class(); c != binary.ClassRead && c != binary.ClassReadWrite {
		sl.hit = true
	}
	if s.closed {
		s.finish(sl)
		return
	}
	sl.done = true
	s.advance()
}

// Fail implements upstream.Waiter.
func (sl *slot) Fail(st binary.Status, reason string) {
	if !upstream.MayHaveRun(reason) {
		sl.noStore = true
	}
	s := sl.s
	if s.closed {
		s.finish(sl)
		return
	}
	n := len(sl.resp)
	sl.resp = s.codec.appendError(sl.resp, sl.req, st, reason)
	s.slotBytes += len(sl.resp) - n
	sl.done = true
	s.advance()
}

// response is the client's view of memcached's answer f: the key without
// the bucket's namespace, and the units the command was charged when the
// client had asked for them (HELLO ReportUnitUsage) before it sent the
// command.
func (sl *slot) response(f *binary.Frame) response {
	key := f.Key()
	if len(key) >= sl.strip {
		key = key[sl.strip:]
	}
	r := response{op: f.Opcode, status: f.Status(), extras: f.Extras(), key: key, value: f.Value(), cas: f.CAS, upstream: f}
	if sl.units && sl.grant.Domain != throttle.Held {
		r.units = true
		r.readUnits, r.writeUnits = sl.s.lp.srv.units(sl)
	}
	return r
}
