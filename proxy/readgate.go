package proxy

// Back-pressure on a paused session's client. A session that dispatches
// nothing for now (held by the throttle, waiting for upstream room, for
// order, for off-loop work or for its output: state.go) keeps what its
// client sends unprocessed. Up to proxy.max_held_input_bytes of it is
// buffered by gnet; past that the session stops reading its socket, so
// what the client sends next waits in the kernel's socket buffers, and
// once they are full the client's writes block, exactly as when memcached
// itself is slow. Nothing the client sent is dropped and the connection is
// not closed: a client pipelining noreply sets into a bucket at its hard
// limit is paced to that limit (issue 27). The session reads again as
// soon as it runs (setPause).
//
// gnet v2.9.8 has no way to stop reading a connection: in its default,
// level-triggered mode a loop reads whatever arrives into the
// connection's inbound buffer and calls OnTraffic. The options weighed:
//
//   - gnet's API. Conn has no pause or read-interest method (SetReadBuffer
//     sets SO_RCVBUF, which only shrinks the kernel's share); EventLoop's
//     Enroll and Register add connections, nothing takes one out; the
//     EdgeTriggeredIO option makes a loop read each readable connection
//     until EAGAIN (or EdgeTriggeredIOChunk, then it queues another read
//     of its own, which ignores any interest change), so it reads more,
//     not less. SO_RCVLOWAT cannot hide a full socket from epoll (Linux
//     reports it readable when the window closes) and grows SO_RCVBUF.
//   - TLS clients need nothing of their own: their records are read by
//     gnet and decrypted on the loop (tlsconn.go; no socketpair), so the
//     gate below stops them as it stops plaintext clients.
//   - Chosen: take the socket out of its loop's epoll read interest
//     (EPOLL_CTL_MOD without EPOLLIN), and put it back when the session
//     runs. The kernel then simply stops telling gnet about input, and
//     every other event keeps working: errors and hang-ups (a reset
//     client is still closed), and room to write (gnet's outbound buffer
//     still drains). The epoll descriptor is gnet's, read by reflection
//     on the pinned version with a check when each loop starts
//     (readgate_linux.go); when the check fails, held connections are
//     closed at the bound as before, and the log says so.
//
// gnet itself turns input interest back on in two places, and the gate
// takes it back: when a write leaves output in its outbound buffer (in
// the session's own Write call: flush re-applies the gate at once), and
// when that outbound buffer has drained (inside gnet's event handling:
// the next OnTraffic, one read of at most the loop's read buffer, 64 KiB,
// sees the session paused and stops reading again).
//
// So a paused session holds at most max_held_input_bytes plus one read
// buffer of its client's input, plus one read buffer each time the
// client drains its responses while it stays paused (responses to
// commands sent before it paused: a held session has no new ones).
// Connections are still closed for input only before authentication
// (preAuthMaxInput, connlimits.go) and for a frame over max_frame_bytes.

// stopReading takes the client's socket out of its loop's read interest
// when it is not already, keeping the write interest gnet needs for its
// unsent output. It reports false when the loop has no gate (or the
// change failed): the caller falls back to the old bound. On the loop,
// for a paused session only.
func (s *session) stopReading() bool {
	g := &s.lp.gate
	if s.readOff {
		return true
	}
	if !g.ok() {
		return false
	}
	if err := g.set(s.c.Fd(), false, s.c.OutboundBuffered() > 0); err != nil {
		s.lp.srv.log.Error().Err(err).Str("remote", s.remote).
			Msg("cannot stop reading a paused client; this event loop closes held clients past max_held_input_bytes from now on")
		return false
	}
	s.readOff = true
	s.lp.srv.readStops.Add(1)
	return true
}

// startReading puts a stopped socket back in its loop's read interest;
// a session that cannot read again is closed (it would never run). Called
// when the session runs again (setPause).
func (s *session) startReading() {
	if !s.readOff {
		return
	}
	s.readOff = false
	if err := s.lp.gate.set(s.c.Fd(), true, s.c.OutboundBuffered() > 0); err != nil {
		s.lp.srv.log.Error().Err(err).Str("remote", s.remote).Msg("cannot read a resumed client again; closing connection")
		s.quitting = true
		_ = s.c.Close()
	}
}

// readRearmed notes that gnet has read the socket: it turned input
// interest back on (after its outbound buffer drained), or the event was
// reported before the gate closed. The pass that follows stops reading
// again if the session is still paused (checkBuffered). From OnTraffic.
func (s *session) readRearmed() { s.readOff = false }

// afterWrite re-applies the gate after a write that started gnet's
// outbound buffer (gnet then asks for input and output interest). had is
// whether the buffer held output before the write.
func (s *session) afterWrite(had bool) {
	if had || s.c.OutboundBuffered() == 0 {
		return
	}
	if err := s.lp.gate.set(s.c.Fd(), false, true); err != nil {
		s.lp.srv.log.Error().Err(err).Str("remote", s.remote).Msg("cannot stop reading a paused client after a write")
		s.readOff = false // gnet's interest (input and output) stands
	}
}
