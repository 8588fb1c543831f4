package proxy

import (
	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

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
// client's next request r: too many commands pending, too many response
// bytes unsent, or, r being a read, no room for its response.
func (s *session) mustPause(r *request) bool {
	if s.bkt != nil && isRead(r.op) {
		s.readCap = s.bkt.tb.ReadCost().KeyBound(r.key)
	}
	return s.pending() >= maxPending || s.unsent() > maxUnsentOutput ||
		isRead(r.op) && (!s.readRoom(maxResponseBytes) || !s.flightRoom())
}

// canResume reports whether an output-paused session may dispatch again.
// Room for a read is enough: responses arrive in batches, each batch
// resumes the session at most once (loop.resumePaused), and a client
// pipelining more reads than fit keeps as many in flight as fit.
func (s *session) canResume() bool {
	return s.outputRoom() && s.flightRoom()
}

// outputRoom reports whether an output-paused session's client has read
// enough of its responses to go on: its commands pending, its response
// bytes unsent, and room for one more read under maxResponseBytes.
func (s *session) outputRoom() bool {
	return s.pending() <= maxPending/2 && s.unsent() <= maxUnsentOutput/2 && s.readRoom(maxResponseBytes)
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

// checkBuffered bounds the client's unprocessed input, at the end of each
// pass over it. A paused session holding max_held_input_bytes or more
// stops reading its client (stopReading, readgate.go): the client is
// paced by its socket, never closed for it. Otherwise the bound is
// max_held_input_bytes (preAuthMaxInput before authentication), plus the
// size of the frame at the head when it is still arriving (so a frame up
// to max_frame_bytes, or preAuthMaxBody, can always be received); past it
// the connection is closed. That happens to a client that has not
// authenticated and sends more than it may (connlimits.go), and to a
// paused one only when its loop cannot stop reading (no gate); a running
// session buffers no more than the request still arriving.
func (s *session) checkBuffered() gnet.Action {
	n := s.c.InboundBuffered()
	limit := s.lp.srv.opts.maxHeldInput
	if s.needAuth {
		limit = preAuthMaxInput
	} else if s.pause != running && n >= limit && s.stopReading() {
		return gnet.None
	}
	if n <= limit {
		return gnet.None
	}
	cx := s.codecCtx(s.maxBody())
	if start, err := s.peekStart(cx); err == nil {
		limit += s.codec.requestLen(start, cx)
	}
	if n > limit {
		s.lp.srv.log.Warn().Str("remote", s.remote).Int("buffered", n).Int("limit", limit).
			Bool("held", s.isHeld()).Bool("output_paused", s.outPaused()).Bool("authenticated", !s.needAuth).
			Msg("client input buffer limit exceeded; closing connection")
		return gnet.Close
	}
	return gnet.None
}

// unpause restarts dispatching after an upstream connection has room
// again; called on the loop.
func (s *session) unpause() {
	if s.closed || s.pause != waitingUpstream {
		return
	}
	if s.setPause(running) {
		s.resume()
	}
}
