package upstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/internal/connbridge"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// connect starts a dial in a goroutine. The result comes back on the loop:
// success through the engine's OnOpen (HandleOpen), failure through
// Execute.
func (c *Conn) connect() {
	c.state = stateConnecting
	c.dialedAt = time.Now()
	c.dialGen++
	c.tlsDial = c.cfg.dialer.tlsOn()
	gen := c.dialGen
	addr, timeout, loop, d, meta := c.cfg.Addr, c.cfg.Timeout, c.loop, c.cfg.dialer, c.isMeta
	go func() {
		fail := func(err error) {
			_ = loop.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
				if gen == c.dialGen && c.state == stateConnecting {
					c.down(fmt.Errorf("connect %s: %w", addr, err))
				}
				return nil
			}))
		}
		nc, b, err := d.dial(addr, timeout, meta)
		if err != nil {
			fail(err)
			return
		}
		var p *pendingBridge
		if b != nil {
			// HandleOpen takes the bridge; down closes it if the dial is
			// given up first. A bridge of an earlier dial never taken is
			// closed here.
			p = &pendingBridge{gen: gen, b: b}
			if old := c.pend.Swap(p); old != nil {
				old.b.Close()
			}
		}
		dropBridge := func() {
			if p != nil {
				c.pend.CompareAndSwap(p, nil)
				b.Close()
			}
		}
		ch, err := loop.Enroll(gnet.NewContext(context.Background(), c), nc)
		if err != nil {
			nc.Close()
			dropBridge()
			fail(err)
			return
		}
		select {
		case res := <-ch:
			if res.Err != nil {
				dropBridge()
				fail(res.Err)
			}
		case <-d.done():
			// The Pool is closed (its engine has stopped): gnet may never
			// answer an Enroll queued as its loop exited.
			dropBridge()
		}
	}()
}

// pendingBridge is the bridge of a TLS dial, from the dial goroutine to
// HandleOpen (Conn.pend).
type pendingBridge struct {
	gen uint64 // the dial's Conn.dialGen
	b   *connbridge.Bridge
}

// dropPending closes the bridge of a TLS dial not yet taken by HandleOpen.
func (c *Conn) dropPending() {
	if p := c.pend.Swap(nil); p != nil {
		p.b.Close()
	}
}

// HandleOpen must be called from the engine's OnOpen for a connection whose
// context is c.
func (c *Conn) HandleOpen(gc gnet.Conn) {
	if c.closed || c.state != stateConnecting {
		c.dropPending()
		_ = gc.Close()
		return
	}
	if c.tlsDial {
		// The socketpair's loop side of the dial in progress: its
		// bridge must be the one pending. Anything else is an earlier
		// dial's, given up (CheckTimeout).
		p := c.pend.Swap(nil)
		if p == nil || p.gen != c.dialGen {
			if p != nil {
				p.b.Close()
			}
			_ = gc.Close()
			return
		}
		c.bridge = p.b
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

// Reasons given to requests that never reached the server.
const (
	reasonUnavailable = "upstream unavailable"
	reasonMetaOnConn  = "internal error: meta command on a binary connection"
)

// MayHaveRun reports whether memcached may have run a request whose
// Waiter's Fail gave reason: any reason but those of a request never
// written to the server (reasonUnavailable, reasonMetaOnConn), so that a
// reason added later counts as may have run.
func MayHaveRun(reason string) bool { return reason != reasonUnavailable && reason != reasonMetaOnConn }

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
	if c.bridge != nil {
		// Ends the TLS connection at once (its loop side, closed above,
		// would end it too, after a close_notify).
		c.bridge.Close()
		c.bridge = nil
	}
	c.dropPending()
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
	c.metaNeed = 0
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

// Close closes the connection, and its meta sibling, for good: requests
// in flight fail, new ones fail at once.
func (c *Conn) Close() {
	if c.closed {
		return
	}
	c.closed = true
	if c.meta != nil {
		c.meta.Close()
	}
	c.down(errors.New("closed"))
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
	if c.meta != nil {
		c.meta.CheckTimeout(now)
	}
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
	s := c.front().sent
	if s != 0 && now.UnixNano()-max(s, c.answerAt) > int64(c.cfg.Timeout) {
		c.down(fmt.Errorf("request to %s %w after %v", c.cfg.Addr, errTimedOut, c.cfg.Timeout))
		return
	}
	if c.bridge != nil && s != 0 && now.UnixNano()-max(s, c.answerAt) > int64(tlsNudgeAfter) {
		c.nudge()
	}
}

// tlsNudgeAfter is how long the oldest request on a TLS connection waits
// with no answer from the server before CheckTimeout nudges it.
const tlsNudgeAfter = 20 * time.Millisecond

// nudge sends a no-op of the proxy's own (NOOP, or mn on a meta
// connection), answered in order like a quiet request's fence. memcached
// 1.6.18 with TLS reads one TLS record at a time and, when its buffer
// takes only part of one (a pipeline, or the bytes after a value), keeps
// the rest in OpenSSL and waits for its socket to become readable again:
// the requests in it wait until more bytes arrive. The no-op's bytes are
// those bytes. Costs a few bytes per stalled interval; on the loop.
func (c *Conn) nudge() {
	if len(c.out) == 0 {
		if c.isMeta {
			c.out = append(c.out, metaFence...)
			c.push(entry{})
		} else {
			c.opaque++
			c.out = binary.AppendFrame(c.out, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpNoop, Opaque: c.opaque}, nil, nil, nil, nil)
			c.push(entry{opaque: c.opaque})
			c.lastQuiet = false
		}
	}
	c.Flush()
}
