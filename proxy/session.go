package proxy

import (
	"errors"
	"fmt"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// A client command's life, one file per stage (as twemproxy's nc_request.c
// and nc_response.c): session.go holds the session, its opening and
// closing, and onTraffic, the loop that decodes the client's requests
// (codec.go: the protocol-neutral forms; binarycodec.go) and dispatches
// them; request.go dispatches one command (answered by the proxy itself,
// or admitted by the throttle and forwarded upstream); state.go names why
// a session dispatches nothing for now; hold.go parks a session whose
// bucket may not run its next command yet, and wakes it; offloop.go runs a
// command's work off the event loop; response.go queues each command's
// slot, takes the upstream's answers and puts them out in request order;
// pause.go paces a client that sends more than it reads. Authentication
// (auth.go, authqueue.go), the admin opcodes (admin.go), HELLO, STAT and
// VERSION (hello.go, stat.go, clientfacing.go) and the connection limits
// (connlimits.go, unsent.go, lane.go) serve them.

// session is one client connection. It decodes the client's requests
// (codec.go), answers local commands, admits metered commands through the
// throttle engine, forwards them upstream, and writes the responses back
// in request order. Only its loop touches it.
type session struct {
	lp    *loop
	c     clientConn     // the client: its gnet.Conn, or tls over it
	tls   *tlsClientConn // the client's TLS, decrypted on the loop (tlsconn.go); nil: plaintext
	codec codec          // the client's protocol (codec.go)
	req   request        // the request being dispatched (onTraffic)

	text   textCodec // the text protocol's codec, when the client speaks it (codec points here)
	picked bool      // the protocol is chosen (by the first byte)
	skip   int       // input bytes still to drop (what a refused text command swallows)
	// skipPace: skip is the value of a write refused as too large,
	// dropped at the pace of this bucket's discard gauge (toolarge.go);
	// nil: dropped as it comes.
	skipPace *bucket

	listenerBucket string // the bucket of the [[listener]] the client connected to; "" for proxy.listen

	unpauseFn func() // s.unpause, for upstream.Conn.NotifyRoom

	q  []*slot // commands not yet answered to the client, oldest first
	qh int     // q[qh] is the oldest

	out       []byte        // response bytes to write at the next flush
	dirty     bool          // queued on lp.dirty
	pause     pauseState    // why it dispatches nothing now, or running (state.go)
	closed    bool          // the client connection is gone (set once; orthogonal to pause)
	quitting  bool          // close once every queued response is written (set once; orthogonal to pause)
	slotBytes int           // response bytes waiting in slots behind an earlier command
	readsOut  int           // reads in flight (slot.reserved)
	pathOut   [numPaths]int // commands in flight upstream per kind of connection (order.go)
	readSize  int           // response bytes a read is expected to bring; 0: none answered yet (unreserve)
	readCap   int64         // read units that bound the next read's response (its key's bill: mustPause); 0: unknown
	ln        *lane         // its bucket's lane on the loop (lane.go); nil until needed, and after a bucket change
	laneWait  bool          // holds its turn in its lane's line (state.go), counted in ln.waiting
	framed    bool          // a binary request magic has arrived: bad input gets Einval, not a text line
	readOff   bool          // its socket is out of its loop's read interest (readgate.go); only while paused

	user        *bucketcfg.User // nil until SASL succeeds
	tlsUser     *bucketcfg.User // the user its verified client certificate names (tls.go); nil: none
	check       checkWait       // the password check its login waits for (auth.go); zero: none
	src         string          // authSource of the client, set while it counts as unauthenticated, and after a failed SASL AUTH
	overTLS     bool            // the connection came through the TLS listener (tls.go), which sets it before the first byte
	scram       *scramConv      // a SCRAM conversation between SASL AUTH and STEP (scram.go); nil: none
	authFails   uint8           // SASL AUTHs refused on this connection (auth.go)
	authMech    uint8           // the mechanism of the SASL AUTH under way (authMechPlain ...), for kvthrottle_auth_total
	authFailed  bool            // a SASL login failed, none succeeded since: no home bucket (logout)
	bkt         *bucket         // selected bucket; nil: none
	nonBlocking bool            // HELLO feature 0x1b
	reportUnits bool            // HELLO feature ReportUnitUsage: responses carry their units

	// Throttling.
	waiter throttle.Waiter // place in the bucket's FIFO line while held
	// surprises (surprise.go): slots whose answer waits for the payment
	// of what they cost beyond their bill, and the place of that payment
	owing     int
	oweWaiter throttle.Waiter
	oweSeq    uint64        // identifies the current payment re-try in lp.holds
	heldAt    time.Duration // engine time the current command was first held
	holdSeq   uint64        // identifies the current entry in lp.holds
	// app: the current command's reservation of its bytes, an APPEND or
	// PREPEND's (throttle.ReadCost.ReserveAppend, ceilingraise.go), held
	// from its raise until its slot takes it as it goes; an attempt that
	// does not go (a raise's wait, a hold, a local answer, the client
	// gone) releases it, and the next reserves again
	app    throttle.AppendRes
	remote string

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

// clientConn is what a session uses of its client's connection: a
// gnet.Conn, or a *tlsClientConn over one, whose methods behave as
// gnet.Conn's (Peek and Discard with n <= 0 meaning everything). Only the
// session's loop calls them.
type clientConn interface {
	Peek(n int) ([]byte, error)
	Discard(n int) (int, error)
	InboundBuffered() int
	OutboundBuffered() int
	Write(b []byte) (int, error)
	Close() error
	Fd() int
}

func newSession(lp *loop, c gnet.Conn, listenerBucket string) *session {
	s := &session{lp: lp, c: c, codec: binaryCodec{}, remote: c.RemoteAddr().String(), listenerBucket: listenerBucket}
	s.unpauseFn = s.unpause // bound once: a method value made per wait would allocate
	lp.sessions[s] = struct{}{}
	ten := lp.srv.ten.Load()
	if name := s.homeBucket(ten); name != "" {
		s.setBucket(ten.bucket(name))
	}
	return s
}

// onTraffic decodes (s.codec) and dispatches every whole request buffered
// for the client, unless the session is paused. A request's first byte
// must start one of the codec's (else notRequest), and while a large
// request arrives its start (the codec's peekLen bytes) tells how much
// more is coming.
func (s *session) onTraffic() gnet.Action {
	s.touch()
	if s.quitting {
		_, _ = s.c.Discard(-1)
		return gnet.None
	}
	if s.pause != running || s.owing > 0 {
		// (a session whose surprises wait to be paid dispatches nothing:
		// surprise.go)
		return s.checkBuffered()
	}
	if s.skip > 0 {
		if n := s.dropPaced(s.c.InboundBuffered()); n > 0 {
			_, _ = s.c.Discard(n)
		}
		if s.skip > 0 {
			return s.checkBuffered()
		}
	}
	if !s.picked {
		// The first byte tells the protocol, as memcached tells it: a
		// binary request magic, or else text.
		b, err := s.c.Peek(1)
		if err != nil {
			return gnet.None
		}
		s.picked = true
		// (A binary response magic stays binary: the client is confused,
		// and gets Einval, notRequest.)
		if m := binary.Magic(b[0]); !m.IsRequest() && !m.IsResponse() {
			s.codec = &s.text
		}
	}
	maxBody := s.maxBody() // small until the client authenticates
	// While a large request is still arriving, do nothing: peeking the
	// whole buffer on every read would copy it again and again.
	cx := s.codecCtx(maxBody)
	hdr, err := s.peekStart(cx)
	if len(hdr) > 0 && !s.codec.starts(hdr[0]) {
		// No request is coming: answer now, not when a header or a body
		// has arrived.
		s.notRequest(hdr)
		s.flush()
		return gnet.None
	}
	if err != nil {
		return gnet.None
	} else if n := s.codec.requestLen(hdr, cx); n > s.c.InboundBuffered() {
		return s.checkBuffered()
	}
	buf, _ := s.c.Peek(-1)
	off := 0
	r := &s.req // a field, not a local: the codec gets a pointer to it
	for off < len(buf) {
		if !s.codec.starts(buf[off]) {
			s.notRequest(buf[off:])
			break
		}
		s.framed = true
		n, err := s.codec.decode(buf[off:], s.codecCtx(maxBody), r)
		var refused *codecReply
		if err != nil {
			refused = asRefusal(err)
		}
		if refused != nil {
			// Input the protocol refuses the way memcached does (answered
			// below, after the same output bounds as any command).
			*r = request{op: binary.OpNoop}
			err = nil
		}
		if err != nil {
			if s.needAuth && errors.Is(err, binary.ErrFrameTooLarge) {
				err = fmt.Errorf("%w before authentication: authenticate first", err)
			}
			s.badFrame(r, err)
			break
		}
		if n == 0 && !r.more && refused == nil {
			break
		}
		if s.needAuth && (s.pending() >= preAuthMaxPending || s.unsent() > preAuthMaxOutput) {
			s.lp.srv.log.Info().Str("remote", s.remote).Int("pending", s.pending()).Int("unsent", s.unsent()).
				Msg("unauthenticated client sends more than it reads; closing connection")
			s.quitting = true
			*r = request{}
			s.lp.requestFlush() // what it sent upstream already
			return gnet.Close
		}
		if s.mustPause(r) {
			// The client is not reading its responses (or pipelines
			// without bound): stop reading its requests until they drain.
			// What it holds counts against max_unsent_bytes from now on,
			// answers made by the proxy itself included.
			s.setPause(outputPaused)
			s.lp.paused = append(s.lp.paused, s)
			s.waitForLane(r)
			if s.account(s.unsent()) {
				s.lp.shedUnsent()
			}
			break
		}
		if refused != nil {
			// Its answer, then on with the next command (or closed).
			if len(refused.reply) > 0 {
				s.local(reqHead{}, func(b []byte) []byte { return append(b, refused.reply...) })
			}
			if refused.close {
				s.quit()
				off = len(buf)
				break
			}
			if avail := len(buf) - off; refused.skip > avail {
				s.skip = refused.skip - avail
				off = len(buf)
				break
			}
			off += refused.skip
			continue
		}
		if !s.dispatch(r) {
			break
		}
		s.app.Release() // (answered locally: a command that went gave it to its slot)
		if r.more || r.last {
			s.codec.partDone(r.last)
		}
		s.leaveLaneWait() // its turn is taken, whether the request went upstream or not
		off += n
		if r.swallow > 0 { // a write refused as too large: its value goes unread
			s.skip, s.skipPace = r.swallow, s.bkt
			off += s.dropPaced(len(buf) - off)
			if s.skip > 0 {
				break
			}
		}
		if s.quitting || s.pause != running {
			break
		}
	}
	// r aliases the input buffer, which it must not pin.
	*r = request{}
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

// peekStart peeks the start of the next request: the codec's peekLen
// bytes (asked again with what they show, while it wants more), or
// everything buffered when fewer have arrived (err then says so) or the
// codec tells requests by their whole first line.
func (s *session) peekStart(cx codecCtx) ([]byte, error) {
	n := s.codec.peekLen(nil, cx)
	if n <= 0 {
		return s.c.Peek(-1)
	}
	for {
		b, err := s.c.Peek(n)
		if err != nil {
			b, _ = s.c.Peek(-1)
			return b, errShortPeek
		}
		if more := s.codec.peekLen(b, cx); more > n {
			n = more
			continue
		}
		return b, nil
	}
}

// errShortPeek: fewer bytes than the codec's peekLen are buffered.
var errShortPeek = errors.New("request start not yet buffered")

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

// quit makes the session close once every queued response is written.
func (s *session) quit() {
	s.quitting = true
	s.markDirty()
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
		if len(s.lp.touched) > 0 {
			s.lp.settleLeases() // the statistics count what the client is told of
		}
		if s.readOff {
			had := s.c.OutboundBuffered() > 0
			_, _ = s.c.Write(s.out)
			s.afterWrite(had)
		} else {
			_, _ = s.c.Write(s.out)
		}
		s.out = s.out[:0]
	}
	if cap(s.out) > outKeepBusy || cap(s.out) > outKeepIdle && s.pending() == 0 {
		s.out = nil // a large response's buffer is not kept by an idle session
	}
	if s.pending() == 0 && (s.quitting || s.lp.srv.draining.Load() && !s.isHeld() && s.drained()) {
		_ = s.c.Close()
	}
}

// The output buffer a session keeps once written: up to outKeepBusy while
// it has commands in flight (the next responses are coming), up to
// outKeepIdle when it has none, so that a connection that once read a
// large value does not pin its buffer while idle.
const (
	outKeepBusy = 1 << 20
	outKeepIdle = 16 << 10
)

// drained reports whether the client has nothing more to say for now: no
// input buffered by gnet, nor any still in the socket (sent while this
// event-loop pass ran; it is read, answered, and the session closed then).
func (s *session) drained() bool {
	return s.c.InboundBuffered() == 0 && unreadBytes(s.c.Fd()) == 0
}

// close is called when the client connection is gone. Slots still in
// flight upstream are released when they resolve.
func (s *session) close() {
	s.orphan()
	s.closed = true
	delete(s.lp.sessions, s)
	s.unhold()
	s.app.Release()
	s.oweWaiter.Cancel()
	s.setBucket(nil)
	for i := s.qh; i < len(s.q); i++ {
		sl := s.q[i]
		s.q[i] = nil
		if sl.done || sl.owe > 0 { // (an unpaid surprise's excess is billed as debt)
			s.finish(sl)
		}
	}
	s.q, s.qh = nil, 0
	s.out = nil
	s.leaveCheck()
}

// asRefusal returns err's *codecReply, or nil. Apart from the decode loop
// so that its target escapes only when a decode fails (errors.As takes
// it as an interface): the loop allocates nothing per request.
func asRefusal(err error) *codecReply {
	var r *codecReply
	if errors.As(err, &r) {
		return r
	}
	return nil
}
