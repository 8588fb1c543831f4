// Package upstream holds kvthrottle's connections to memcached servers.
//
// Each gnet event loop owns one Conn per server. Client requests from every
// session of that loop are pipelined on it with rewritten opaques, and the
// responses are matched back to the Waiter that sent each request. All
// methods of Conn must be called on the owning event loop, except where a
// comment says otherwise; the package takes no lock on the request path.
//
// Quiet commands: memcached answers requests on a connection in order and
// sends nothing for a GETQ miss or a SETQ success. When a response arrives
// for a later request, every earlier quiet request still waiting is known
// to have completed silently. Conn appends a NOOP of its own to every batch
// that ends with a quiet request, so no quiet request stays unresolved.
package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// Waiter receives the outcome of one request sent upstream. Its methods are
// called on the owning event loop, exactly once per request except Deliver,
// which a STAT request receives once per stat line (done false) and once
// for the terminating frame (done true). A frame passed to Deliver aliases
// the connection's input buffer: copy what must outlive the call.
type Waiter interface {
	Deliver(f *binary.Frame, done bool)
	// Silent: a quiet request completed without a response.
	Silent()
	// Fail: the request will get no response from memcached (the
	// connection is down, died or timed out); reason is short and
	// human-readable, and says so when the request had been written to
	// the server and so may have run.
	Fail(status binary.Status, reason string)
}

// Config is the static configuration of a Conn.
type Config struct {
	// Addr is the memcached server as host:port.
	Addr string
	// Timeout bounds a connect, and how long the oldest request written
	// to the server may wait for its response, counted from when it was
	// written or, if later, from when the server last answered (a server
	// answers in order: a request waits only once those before it are
	// answered, and a long pipeline of large responses that keeps
	// arriving is not a dead server). Zero means 2 s.
	Timeout time.Duration
	// MaxInflight bounds the requests in flight on the connection (sent
	// or buffered). Zero means 4096.
	MaxInflight int
	// AfterRead, when not nil, is called on the loop after each batch of
	// responses has been delivered (the proxy flushes client output there).
	AfterRead func()
	// OnState, when not nil, is called on the loop when the connection
	// goes up or down.
	OnState func(c *Conn, up bool, err error)
	// Observe, when not nil, receives each request's round trip in
	// seconds (from the write of its batch to its response).
	Observe func(seconds float64)
}

type state uint8

const (
	stateIdle       state = iota // never connected, or backoff elapsed
	stateConnecting              // a dial is in progress; requests queue
	stateUp                      // connected
	stateDown                    // failed; new requests fail until the backoff elapses
)

type entry struct {
	opaque uint32
	quiet  bool
	stream bool // STAT: several responses, the last with an empty key
	w      Waiter
	sent   int64 // unix nanoseconds when flushed, 0 while buffered
}

// Conn is one pipelined connection to a memcached server, owned by one
// event loop. The zero value is not usable; use New.
type Conn struct {
	cfg   Config
	loop  gnet.EventLoop
	gc    gnet.Conn
	state state

	out       []byte // requests not yet written
	lastQuiet bool   // the last request appended to out is quiet
	ring      []entry
	head, n   int // ring[head] is the oldest of n entries
	unsent    int // entries at the tail whose sent time is 0
	opaque    uint32

	failures  int       // consecutive failed connects / deaths
	retryAt   time.Time // while down: when the next connect may start
	closed    bool
	dialGen   uint64    // incremented per dial, so stale results are ignored
	dialedAt  time.Time // when the current dial started
	lastErr   error
	now       int64        // unix ns at the start of the current read batch
	frame     binary.Frame // the response being delivered (a field: waiters get a pointer to it)
	waitingUp []func()     // callbacks to run when room frees up

	answered   uint64 // response frames matched, ever
	seenAnswer uint64 // answered as of the last CheckTimeout
	answerAt   int64  // unix ns: the CheckTimeout that first saw answered at its current value
}

// New returns a Conn for cfg owned by loop. It does not connect until the
// first request or Connect.
func New(cfg Config, loop gnet.EventLoop) *Conn {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 4096
	}
	return &Conn{cfg: cfg, loop: loop, ring: make([]entry, 64)}
}

// Addr returns the server address.
func (c *Conn) Addr() string { return c.cfg.Addr }

// Up reports whether the connection is established.
func (c *Conn) Up() bool { return c.state == stateUp }

// Inflight returns the number of requests sent or buffered and not yet
// answered.
func (c *Conn) Inflight() int { return c.n }

// Full reports whether the connection holds MaxInflight requests; callers
// should wait (see NotifyRoom) before sending more.
func (c *Conn) Full() bool { return c.n >= c.cfg.MaxInflight }

// NotifyRoom registers fn to run on the loop once the connection has room
// for more requests again (or fails). Each fn runs once.
func (c *Conn) NotifyRoom(fn func()) { c.waitingUp = append(c.waitingUp, fn) }

// ErrUnavailable is the cause reported when a request cannot be sent.
var ErrUnavailable = errors.New("upstream unavailable")

// Forward appends the request f to the connection's output with a fresh
// opaque, the key replaced by prefix+key, classic magic and no framing
// extras, and registers w for its outcome. The caller must have checked
// that prefix+key is at most binary.MaxKeyLen bytes. If the connection is
// down, w.Fail is called at once (before Forward returns) and ErrUnavailable
// is returned. Bytes are written at the next Flush.
func (c *Conn) Forward(f *binary.Frame, prefix []byte, w Waiter) error {
	if c.state == stateDown || c.closed {
		if c.closed || time.Now().Before(c.retryAt) {
			w.Fail(binary.StatusEtmpfail, c.unavailableReason())
			return ErrUnavailable
		}
		c.state = stateIdle
	}
	if c.state == stateIdle {
		c.connect()
	}
	c.opaque++
	h := binary.Header{
		Magic:    binary.MagicRequest,
		Opcode:   f.Opcode,
		DataType: f.DataType,
		VBucket:  f.VBucket,
		Opaque:   c.opaque,
		CAS:      f.CAS,
	}
	extras, key, value := f.Extras(), f.Key(), f.Value()
	h.ExtLen = uint8(len(extras))
	h.KeyLen = uint16(len(prefix) + len(key))
	h.BodyLen = uint32(len(extras) + int(h.KeyLen) + len(value))
	n := len(c.out)
	need := binary.HeaderLen + int(h.BodyLen)
	if cap(c.out)-n < need {
		nb := make([]byte, n, 2*cap(c.out)+need)
		copy(nb, c.out)
		c.out = nb
	}
	c.out = c.out[:n+binary.HeaderLen]
	h.Put(c.out[n:])
	c.out = append(c.out, extras...)
	c.out = append(c.out, prefix...)
	c.out = append(c.out, key...)
	c.out = append(c.out, value...)
	c.push(entry{opaque: c.opaque, quiet: f.Opcode.Quiet(), stream: f.Opcode == binary.OpStat, w: w})
	c.lastQuiet = f.Opcode.Quiet()
	return nil
}

// unavailableReason is the reason clients get: generic on purpose, since
// tenants need not learn server addresses or socket errors (the proxy logs
// those through OnState).
func (c *Conn) unavailableReason() string {
	return "upstream unavailable"
}

func (c *Conn) push(e entry) {
	if c.n == len(c.ring) {
		nr := make([]entry, 2*len(c.ring))
		for i := 0; i < c.n; i++ {
			nr[i] = c.ring[(c.head+i)%len(c.ring)]
		}
		c.ring, c.head = nr, 0
	}
	c.ring[(c.head+c.n)%len(c.ring)] = e
	c.n++
	c.unsent++
}

func (c *Conn) front() *entry { return &c.ring[c.head] }

func (c *Conn) pop() entry {
	e := c.ring[c.head]
	c.ring[c.head] = entry{}
	c.head = (c.head + 1) % len(c.ring)
	c.n--
	if c.unsent > c.n {
		c.unsent = c.n
	}
	return e
}

// Flush writes the buffered requests to the server when connected. A batch
// that ends with a quiet request gets a trailing NOOP of the proxy's own so
// that the quiet requests are resolved. It is cheap to call when there is
// nothing to write.
func (c *Conn) Flush() {
	if c.state != stateUp || len(c.out) == 0 {
		return
	}
	if c.lastQuiet {
		c.opaque++
		c.out = binary.AppendFrame(c.out, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpNoop, Opaque: c.opaque}, nil, nil, nil, nil)
		c.push(entry{opaque: c.opaque})
		c.lastQuiet = false
	}
	now := time.Now().UnixNano()
	for i := c.n - c.unsent; i < c.n; i++ {
		c.ring[(c.head+i)%len(c.ring)].sent = now
	}
	c.unsent = 0
	if _, err := c.gc.Write(c.out); err != nil {
		// gnet closes the connection on a write error; OnClose fails the
		// in-flight requests.
		c.lastErr = err
	}
	c.out = c.out[:0]
	if cap(c.out) > maxKeptOut {
		c.out = nil // one huge request must not pin its size for good
	}
}

// maxKeptOut is the largest request buffer kept between batches.
const maxKeptOut = 1 << 20

// connect starts a dial in a goroutine. The result comes back on the loop:
// success through the engine's OnOpen (HandleOpen), failure through
// Execute.
func (c *Conn) connect() {
	c.state = stateConnecting
	c.dialedAt = time.Now()
	c.dialGen++
	gen := c.dialGen
	addr, timeout, loop := c.cfg.Addr, c.cfg.Timeout, c.loop
	go func() {
		fail := func(err error) {
			_ = loop.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
				if gen == c.dialGen && c.state == stateConnecting {
					c.down(fmt.Errorf("connect %s: %w", addr, err))
				}
				return nil
			}))
		}
		nc, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			fail(err)
			return
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		ch, err := loop.Enroll(gnet.NewContext(context.Background(), c), nc)
		if err != nil {
			nc.Close()
			fail(err)
			return
		}
		if res := <-ch; res.Err != nil {
			fail(res.Err)
		}
	}()
}

// HandleOpen must be called from the engine's OnOpen for a connection whose
// context is c.
func (c *Conn) HandleOpen(gc gnet.Conn) {
	if c.closed || c.state != stateConnecting {
		_ = gc.Close()
		return
	}
	c.gc = gc
	c.state = stateUp
	c.failures = 0
	c.lastErr = nil
	if c.cfg.OnState != nil {
		c.cfg.OnState(c, true, nil)
	}
	c.Flush()
}

// HandleClose must be called from the engine's OnClose for a connection
// whose context is c. It fails every request in flight.
func (c *Conn) HandleClose(gc gnet.Conn, err error) {
	if gc != c.gc {
		return
	}
	if err == nil {
		err = io.EOF
	}
	c.down(fmt.Errorf("connection to %s lost: %w", c.cfg.Addr, err))
}

// Reasons given with Etmpfail to requests that had been written to the
// server when the connection failed: memcached may have run them.
const (
	reasonTimedOut = "upstream timed out; the command may have run"
	reasonLost     = "upstream connection lost; the command may have run"
)

// errTimedOut is wrapped by the error CheckTimeout brings the connection
// down with.
var errTimedOut = errors.New("timed out")

// down marks the connection failed: every request in flight fails with
// Etmpfail (the reason says whether it may have run), new requests fail
// until a jittered backoff elapses.
func (c *Conn) down(err error) {
	wasUp := c.state == stateUp
	if c.gc != nil {
		gc := c.gc
		c.gc = nil
		_ = gc.Close()
	}
	c.state = stateDown
	c.lastErr = err
	c.failures++
	// 50 ms doubling to 400 ms, jittered to half..full: a server back on its
	// port gets traffic again within half a second.
	backoff := 50 * time.Millisecond << min(c.failures-1, 3)
	backoff = backoff/2 + rand.N(backoff/2+1)
	c.retryAt = time.Now().Add(backoff)
	c.out = c.out[:0]
	c.lastQuiet = false
	unsent, sent := c.unavailableReason(), reasonLost
	if errors.Is(err, errTimedOut) {
		sent = reasonTimedOut
	}
	for c.n > 0 {
		e := c.pop()
		switch {
		case e.w == nil:
		case e.sent != 0:
			// Written to the server: it may have run (a write may be
			// applied); the client must not take Etmpfail for "not done".
			e.w.Fail(binary.StatusEtmpfail, sent)
		default:
			e.w.Fail(binary.StatusEtmpfail, unsent)
		}
	}
	c.wakeWaiters()
	if c.cfg.OnState != nil && (wasUp || c.failures == 1) {
		c.cfg.OnState(c, false, err)
	}
	if c.cfg.AfterRead != nil {
		c.cfg.AfterRead()
	}
}

// Close closes the connection for good: requests in flight fail, new ones
// fail at once.
func (c *Conn) Close() {
	if c.closed {
		return
	}
	c.down(errors.New("closed"))
	c.closed = true
}

// connectDeadline is how long a connect may take in all: the dial's own
// timeout and as much again for handing the socket to the loop.
func connectDeadline(timeout time.Duration) time.Duration { return 2 * timeout }

// CheckTimeout fails the connection when its oldest flushed request has
// waited longer than the timeout (Config.Timeout: since it was written, or
// since the server last answered, as seen by an earlier call), or a
// connect has taken longer. Call it periodically on the loop: answers are
// noticed at the call after they arrive, so the period adds to the
// timeout.
func (c *Conn) CheckTimeout(now time.Time) {
	if c.state == stateConnecting && now.Sub(c.dialedAt) > connectDeadline(c.cfg.Timeout) {
		// The dial is bounded by the timeout; what follows it (registering
		// the socket with the loop) takes no time, unless it failed without
		// a word: do not let requests queue behind it forever.
		c.down(fmt.Errorf("connect %s: not established after %v", c.cfg.Addr, connectDeadline(c.cfg.Timeout)))
		return
	}
	if c.state != stateUp {
		return
	}
	if c.answered != c.seenAnswer {
		// The server answered since the last check: the request oldest
		// now has waited for its own response only since then.
		c.seenAnswer, c.answerAt = c.answered, now.UnixNano()
	}
	if c.n == 0 {
		return
	}
	if s := c.front().sent; s != 0 && now.UnixNano()-max(s, c.answerAt) > int64(c.cfg.Timeout) {
		c.down(fmt.Errorf("request to %s %w after %v", c.cfg.Addr, errTimedOut, c.cfg.Timeout))
	}
}

// HandleTraffic must be called from the engine's OnTraffic for a
// connection whose context is c. It delivers every complete response to
// its waiter.
func (c *Conn) HandleTraffic(gc gnet.Conn) gnet.Action {
	if gc != c.gc {
		return gnet.Close
	}
	// While a large response is still arriving, do nothing: peeking the
	// whole buffer on every read would copy it again and again.
	if hdr, err := gc.Peek(binary.HeaderLen); err != nil {
		return gnet.None
	} else if n := binary.PendingFrameLen(hdr, 0); n > gc.InboundBuffered() {
		return gnet.None
	}
	buf, _ := gc.Peek(-1)
	off := 0
	if c.cfg.Observe != nil {
		c.now = time.Now().UnixNano()
	}
	for {
		// Decoding into a field, not a local, keeps the frame off the
		// heap: waiters receive a pointer to it through an interface.
		var n int
		var err error
		c.frame, n, err = binary.Decode(buf[off:], 0)
		if err != nil {
			c.down(fmt.Errorf("bad response from %s: %w", c.cfg.Addr, err))
			return gnet.None
		}
		if n == 0 {
			break
		}
		off += n
		if err := c.match(&c.frame); err != nil {
			c.down(err)
			return gnet.None
		}
		if c.gc != gc { // a waiter's reaction brought the connection down
			return gnet.None
		}
	}
	if off > 0 { // Discard(0) would drop everything buffered
		_, _ = gc.Discard(off)
	}
	c.frame = binary.Frame{}
	// Sessions waiting for room resume only now, outside the decode loop,
	// so their new requests cannot re-enter it.
	c.roomCheck()
	if c.cfg.AfterRead != nil {
		c.cfg.AfterRead()
	}
	return gnet.None
}

func (c *Conn) match(f *binary.Frame) error {
	if !f.Magic.IsResponse() {
		return fmt.Errorf("request magic from server %s", c.cfg.Addr)
	}
	c.answered++
	for c.n > 0 {
		e := c.front()
		if e.opaque == f.Opaque {
			done := !e.stream || f.KeyLen == 0 || f.Status() != binary.StatusSuccess
			w := e.w
			if c.cfg.Observe != nil && e.sent != 0 {
				c.cfg.Observe(float64(c.now-e.sent) / 1e9)
			}
			if done {
				c.pop()
			}
			if w != nil {
				w.Deliver(f, done)
			}
			return nil
		}
		if !e.quiet {
			return fmt.Errorf("response opaque %d from %s does not match request %d", f.Opaque, c.cfg.Addr, e.opaque)
		}
		w := c.pop().w
		if w != nil {
			w.Silent()
		}
	}
	return fmt.Errorf("unexpected response (opaque %d) from %s", f.Opaque, c.cfg.Addr)
}

func (c *Conn) roomCheck() {
	if len(c.waitingUp) > 0 && c.n <= c.cfg.MaxInflight/2 {
		c.wakeWaiters()
	}
}

func (c *Conn) wakeWaiters() {
	ws := c.waitingUp
	c.waitingUp = nil
	for _, fn := range ws {
		fn()
	}
}
