package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// session is one client connection. It decodes the client's frames,
// answers local commands, admits metered commands through the throttle
// engine, forwards them upstream, and writes the responses back in request
// order. Only its loop touches it.
type session struct {
	lp *loop
	c  gnet.Conn

	q  []*slot // commands not yet answered to the client, oldest first
	qh int     // q[qh] is the oldest

	out       []byte // response bytes to write at the next flush
	dirty     bool   // queued on lp.dirty
	closed    bool   // the client connection is gone
	quitting  bool   // close once every queued response is written
	waiting   bool   // paused: an upstream connection is full, or a password check or admin change runs
	outPaused bool   // paused: too many responses pending or unsent (lp.paused)
	slotBytes int    // response bytes waiting in slots behind an earlier command
	readsOut  int    // reads in flight (slot.reserved)
	readSize  int    // response bytes a read is expected to bring; 0: none answered yet (unreserve)
	ln        *lane  // its bucket's lane on the loop (lane.go); nil until needed, and after a bucket change
	laneWait  bool   // paused until a read fits in its lane, counted in ln.waiting
	framed    bool   // a binary request magic has arrived: bad input gets Einval, not a text line

	user        *bucketcfg.User // nil until SASL succeeds
	checking    bool            // its password is being checked (queued for or on the auth worker)
	src         string          // authSource of the client, set while it counts as unauthenticated, and after a failed SASL AUTH
	authFails   uint8           // SASL AUTHs refused on this connection (auth.go)
	bkt         *bucket         // selected bucket; nil: none
	nonBlocking bool            // HELLO feature 0x1b
	reportUnits bool            // HELLO feature ReportUnitUsage: responses carry their units

	// Throttling.
	waiter  throttle.Waiter // place in the bucket's FIFO line while held
	held    bool            // waiting for the throttle engine
	onReads bool            // held until the bucket's reads in flight settle: re-try when one of ours does
	heldAt  time.Duration   // engine time the current command was first held
	holdSeq uint64          // identifies the current entry in lp.holds
	remote  string

	// Connection limits (connlimits.go, unsent.go).
	needAuth   bool          // must authenticate and has not yet: pre-authentication bounds apply
	openedAt   time.Duration // loop clock when the connection opened (auth_timeout)
	lastActive time.Duration // loop clock at the last input or upstream response (idle_timeout)
	links      [2]sessLink   // places in lp.unauth and lp.idle
	accounted  int           // response bytes counted in Server.unsentBytes
	holding    bool          // in lp.holding
	released   bool          // closing: no longer counted in Server.unsentBytes
	evicted    bool          // closed to make room: no longer counted in Server.conns
}

func newSession(lp *loop, c gnet.Conn) *session {
	s := &session{lp: lp, c: c, remote: c.RemoteAddr().String()}
	lp.sessions[s] = struct{}{}
	ten := lp.srv.ten.Load()
	if name := ten.cfg.Proxy.DefaultBucket; name != "" {
		s.setBucket(ten.bucket(name))
	}
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
	bkt    *bucket
	grant  throttle.Grant // the command's bill, settled when it completes; Domain Held: not metered
	units  bool           // ReportUnitUsage was on when the command was sent
	sentKV int            // key+value bytes the client sent (write units)
	gotKV  int            // key+value bytes returned (read units)
	hit    bool           // a read found its item (lane.go learns sizes from hits only)

	reserved bool  // counted in session.readsOut until finished
	lane     *lane // the lane its expected response is counted in (lane.go); nil: none
	flight   int   // its expected response bytes counted in lane.bytes
}

func (s *session) pending() int { return len(s.q) - s.qh }

// onTraffic decodes and dispatches every whole frame buffered for the
// client, unless the session is paused.
func (s *session) onTraffic() gnet.Action {
	s.touch()
	if s.quitting {
		_, _ = s.c.Discard(-1)
		return gnet.None
	}
	if s.waiting || s.held || s.outPaused {
		return s.checkBuffered()
	}
	maxBody := s.maxBody() // small until the client authenticates
	// While a large request is still arriving, do nothing: peeking the
	// whole buffer on every read would copy it again and again.
	hdr, err := s.c.Peek(binary.HeaderLen)
	if err != nil {
		hdr, _ = s.c.Peek(-1) // less than a header
	}
	if len(hdr) > 0 && !binary.Magic(hdr[0]).IsRequest() {
		// No binary request is coming: answer now, not when a header or
		// a body has arrived.
		s.notRequest(hdr)
		s.flush()
		return gnet.None
	}
	if err != nil {
		return gnet.None
	} else if n := binary.PendingFrameLen(hdr, maxBody); n > s.c.InboundBuffered() {
		return s.checkBuffered()
	}
	buf, _ := s.c.Peek(-1)
	off := 0
	for off < len(buf) {
		if !binary.Magic(buf[off]).IsRequest() {
			s.notRequest(buf[off:])
			break
		}
		s.framed = true
		f, n, err := binary.Decode(buf[off:], maxBody)
		if err != nil {
			if s.needAuth && errors.Is(err, binary.ErrFrameTooLarge) {
				err = fmt.Errorf("%w before authentication: authenticate first", err)
			}
			s.badFrame(&f, err)
			break
		}
		if n == 0 {
			break
		}
		if s.needAuth && (s.pending() >= preAuthMaxPending || s.unsent() > preAuthMaxOutput) {
			s.lp.srv.log.Info().Str("remote", s.remote).Int("pending", s.pending()).Int("unsent", s.unsent()).
				Msg("unauthenticated client sends more than it reads; closing connection")
			s.quitting = true
			s.lp.requestFlush() // what it sent upstream already
			return gnet.Close
		}
		if s.mustPause(&f) {
			// The client is not reading its responses (or pipelines
			// without bound): stop reading its requests until they drain.
			// What it holds counts against max_unsent_bytes from now on,
			// answers made by the proxy itself included.
			s.outPaused = true
			s.lp.paused = append(s.lp.paused, s)
			s.waitForLane(&f)
			if s.account(s.unsent()) {
				s.lp.shedUnsent()
			}
			break
		}
		if !s.dispatch(&f) {
			break
		}
		s.leaveLaneWait() // its turn is taken, whether the frame went upstream or not
		off += n
		if s.quitting || s.waiting || s.held {
			break
		}
	}
	if off > 0 { // Discard(0) would drop everything buffered
		_, _ = s.c.Discard(off)
	}
	s.lp.requestFlush()
	s.flush()
	if s.quitting {
		return gnet.None
	}
	return s.checkBuffered()
}

// Bounds on a client's responses: commands in flight or awaiting their
// turn, and response bytes the client has not read. Past either, the
// session stops dispatching until they fall to half.
const (
	maxPending      = 4096
	maxUnsentOutput = 4 << 20
)

// maxResponseBytes is the hard cap on one client's response bytes held by
// the proxy (unsent, or waiting for an earlier response): a client holding
// more is disconnected (overCap).
//
// Reads are paced to stay under it (readRoom): a read (GET, GAT and their
// variants) is dispatched only while the bytes held plus the expected
// responses of the reads in flight, its own included, fit (one read always
// may run). A read is expected to be as large as the client's recent reads
// (readSize), and as large as any read can be (throttle.max_item_bytes)
// until one has been answered. So a client that pipelines large reads and
// stops reading is paused, holding at most this much, with at most this
// much of its responses ahead of its neighbours' on the upstream connection
// they share. One whose reads were small and turn large can have more in
// flight: it is disconnected at the cap, and the rest of its responses are
// dropped as they arrive (in a throttled bucket, the throttle's budget for
// reads of unknown cost bounds them too).
const maxResponseBytes = 64 << 20

// unsent is the response bytes the client has not been sent or has not
// read: in the session's output and in gnet's outbound buffer.
func (s *session) unsent() int { return len(s.out) + s.c.OutboundBuffered() + s.slotBytes }

// maxReadResponse is the largest response a read can bring when memcached
// stores items of up to maxItem bytes: the header, the flags, the key, the
// value, and the framing extras that report its units.
func maxReadResponse(maxItem int) int {
	return binary.HeaderLen + 4 + binary.MaxKeyLen + maxItem + 8
}

// isRead reports whether op's response may carry a value.
func isRead(op binary.Opcode) bool {
	cls := op.Class()
	return cls == binary.ClassRead || cls == binary.ClassReadWrite
}

// readRoom reports whether one more read fits under limit with the
// response bytes held and the expected responses of the reads in flight.
func (s *session) readRoom(limit int) bool {
	if s.readsOut == 0 {
		return true
	}
	return s.unsent()+(s.readsOut+1)*s.expectedRead() <= limit
}

// mustPause reports whether the session must stop dispatching before the
// client's next frame f: too many commands pending, too many response
// bytes unsent, or, f being a read, no room for its response.
func (s *session) mustPause(f *binary.Frame) bool {
	return s.pending() >= maxPending || s.unsent() > maxUnsentOutput ||
		isRead(f.Opcode) && (!s.readRoom(maxResponseBytes) || !s.flightRoom())
}

// canResume reports whether an output-paused session may dispatch again.
// Room for a read is enough: responses arrive in batches, each batch
// resumes the session at most once (loop.resumePaused), and a client
// pipelining more reads than fit keeps as many in flight as fit.
func (s *session) canResume() bool {
	return s.pending() <= maxPending/2 && s.unsent() <= maxUnsentOutput/2 && s.readRoom(maxResponseBytes) && s.flightRoom()
}

// overCap closes the connection when its response bytes pass the hard cap;
// otherwise it counts them against proxy.max_unsent_bytes, which may close
// the connections of the loop holding the most (unsent.go). It reports
// whether this session was closed. Called as each upstream response
// arrives, which also counts as activity for idle_timeout.
func (s *session) overCap() bool {
	s.touch()
	n := s.unsent()
	if n > maxResponseBytes {
		s.lp.srv.log.Warn().Str("remote", s.remote).Int("response_bytes", n).Int("limit", maxResponseBytes).
			Msg("client does not read its responses; closing connection")
		s.quitting = true
		_ = s.c.Close()
		return true
	}
	if s.account(n) {
		s.lp.shedUnsent()
	}
	return s.released
}

// resume re-runs dispatch on the loop outside a gnet callback (after a
// pause or a hold ends).
func (s *session) resume() {
	if s.closed {
		return
	}
	if s.onTraffic() == gnet.Close {
		_ = s.c.Close()
	}
}

// checkBuffered enforces the bound on unprocessed input: max_held_input_bytes
// (preAuthMaxInput before authentication), plus the size of the frame at
// the head when it is still arriving (so a frame up to max_frame_bytes, or
// preAuthMaxBody, can always be received).
func (s *session) checkBuffered() gnet.Action {
	n := s.c.InboundBuffered()
	limit := s.lp.srv.opts.maxHeldInput
	if s.needAuth {
		limit = preAuthMaxInput
	}
	if n <= limit {
		return gnet.None
	}
	if hdr, err := s.c.Peek(binary.HeaderLen); err == nil {
		limit += binary.PendingFrameLen(hdr, s.maxBody())
	}
	if n > limit {
		s.lp.srv.log.Warn().Str("remote", s.remote).Int("buffered", n).Int("limit", limit).
			Bool("held", s.held).Bool("output_paused", s.outPaused).Bool("authenticated", !s.needAuth).
			Msg("client input buffer limit exceeded; closing connection")
		return gnet.Close
	}
	return gnet.None
}

// badFrame answers an invalid header (bad magic, body too large,
// inconsistent lengths) with Einval, then closes the connection once
// earlier responses are out.
func (s *session) badFrame(f *binary.Frame, err error) {
	srv := s.lp.srv
	srv.logBadInput.event(&srv.log, zerolog.InfoLevel).Str("remote", s.remote).Err(err).Msg("invalid frame from client; closing connection")
	s.localStatus(f, binary.StatusEinval, err.Error())
	s.quit()
}

var errNotRequest = errors.New("frame is not a request (bad magic)")

// quit makes the session close once every queued response is written.
func (s *session) quit() {
	s.quitting = true
	s.markDirty()
}

// dispatch handles one whole client frame. It returns false when the frame
// was not consumed and must be retried later (the session paused).
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
	case binary.OpSASLListMechs:
		h := f.Header
		s.local(func(b []byte) []byte {
			return binary.AppendResponse(b, &h, binary.StatusSuccess, nil, nil, []byte("PLAIN"))
		})
	case binary.OpSASLAuth:
		s.saslAuth(f)
	case binary.OpSASLStep:
		s.localStatus(f, binary.StatusAuthError, "only single-step PLAIN is supported")
	case binary.OpSelectBucket:
		s.selectBucket(f)
	case binary.OpSetBucketThrottleProperties, binary.OpSetNodeThrottleProperties:
		s.admin(f)
	case binary.OpStat:
		return s.stat(f)
	case binary.OpVersion:
		return s.version(f)
	case binary.OpVerbosity:
		// Not forwarded: memcached (1.6) has no binary VERBOSITY and, after
		// its UnknownCommand, swallows the first bytes of the next request
		// on the connection, which every tenant of the loop shares.
		if !s.isAdmin() {
			s.localStatus(f, binary.StatusEaccess, "VERBOSITY needs the admin privilege")
			return true
		}
		s.localStatus(f, binary.StatusNotSupported, "VERBOSITY is not supported through kvthrottle")
	case binary.OpFlush, binary.OpFlushQ:
		return s.flushBucket(f)
	default:
		if !op.Memcached() {
			s.localStatus(f, binary.StatusUnknownCommand, "unknown command "+op.String())
			return true
		}
		if s.bkt == nil {
			s.noBucket(f)
			return true
		}
		return s.forward(f, s.bkt)
	}
	return true
}

func (s *session) isAdmin() bool { return s.user != nil && s.user.IsAdmin() }

// noBucket answers a data command of a session without a bucket.
func (s *session) noBucket(f *binary.Frame) {
	if s.user == nil {
		s.localStatus(f, binary.StatusEaccess, "authentication required")
		return
	}
	s.localStatus(f, binary.StatusEaccess, "no bucket selected")
}

// setBucket moves the session to b (nil: none).
func (s *session) setBucket(b *bucket) {
	if s.bkt == b {
		return
	}
	s.waiter.Cancel()
	s.leaveLaneWait()
	s.ln = nil
	if s.bkt != nil {
		s.bkt.conns.Add(-1)
	}
	s.bkt = b
	if b != nil {
		b.conns.Add(1)
	}
}

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

// forward sends f upstream in bucket b's namespace (b nil: no namespace,
// not metered), after admission when f is metered.
func (s *session) forward(f *binary.Frame, b *bucket) bool {
	if err := binary.ValidateRequest(f); err != nil {
		// memcached would answer Einval and close the shared upstream
		// connection, failing other clients' requests: answer here.
		s.localStatus(f, binary.StatusEinval, err.Error())
		return true
	}
	key := f.Key()
	var prefix []byte
	if b != nil {
		prefix = *b.prefix.Load()
		if b.gone.Load() {
			s.localStatus(f, binary.StatusEaccess, "bucket removed")
			s.quit()
			return true
		}
	}
	if len(prefix)+len(key) > binary.MaxKeyLen {
		s.localStatus(f, binary.StatusEinval, "key too long")
		return true
	}
	u := s.lp.pool.Pick(key)
	if u.Full() {
		s.waiting = true
		u.NotifyRoom(s.unpause)
		return false
	}
	var grant throttle.Grant
	if b != nil && f.Opcode.Class().Metered() {
		// Billed in advance: a write's units (known now), a read's
		// expected units; settled when the response is in (finish).
		cost := s.lp.srv.cost(f.Opcode.Class(), len(key)+len(f.Value()))
		g, wait := b.tb.AdmitCost(&s.waiter, s.mode(), cost)
		if g.Domain == throttle.Held {
			return s.throttled(f, b, g, wait)
		}
		if s.heldAt != 0 {
			s.lp.srv.throttleWait(b, s.lp.srv.throttle.Now()-s.heldAt)
			s.heldAt = 0
		}
		grant = g
		if cost.Known > 0 {
			b.writeUnits.Add(uint64(cost.Known))
		}
	}
	sl := s.lp.getSlot()
	sl.s = s
	sl.req = f.Header
	sl.strip = len(prefix)
	sl.bkt = b
	sl.grant = grant
	sl.units = s.reportUnits
	sl.sentKV = len(key) + len(f.Value())
	s.enqueue(sl)
	s.lp.srv.inflight.Add(1)
	_ = u.Forward(f, prefix, sl) // a failure has already answered sl
	return true
}

// unpause restarts dispatching after an upstream connection has room
// again; called on the loop.
func (s *session) unpause() {
	if s.closed || !s.waiting {
		return
	}
	s.waiting = false
	s.resume()
}

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
	if s.pending() == 0 && (s.quitting || s.lp.srv.draining.Load() && !s.held && s.drained()) {
		_ = s.c.Close()
	}
}

// drained reports whether the client has nothing more to say for now: no
// input buffered by gnet, nor any still in the socket (sent while this
// event-loop pass ran; it is read, answered, and the session closed then).
func (s *session) drained() bool {
	return s.c.InboundBuffered() == 0 && unreadBytes(s.c.Fd()) == 0
}

// close is called when the client connection is gone. Slots still in
// flight upstream are released when they resolve.
func (s *session) close() {
	s.closed = true
	delete(s.lp.sessions, s)
	s.held = false
	s.setBucket(nil)
	for i := s.qh; i < len(s.q); i++ {
		sl := s.q[i]
		s.q[i] = nil
		if sl.done {
			s.finish(sl)
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
		if s.held && s.onReads && !s.closed {
			s.onReads = false
			s.lp.retry = append(s.lp.retry, s)
		}
	}
	s.lp.srv.inflight.Add(-1)
	s.lp.putSlot(sl)
}

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
	if f.Status() == binary.StatusSuccess {
		sl.hit = true
	}
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
