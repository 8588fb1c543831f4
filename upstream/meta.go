package upstream

import (
	"fmt"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// Meta commands (mg ms md ma me) cannot travel on a binary connection:
// memcached fixes a connection's protocol at its first byte. Each Conn
// therefore has a text sibling, created at the first Meta call, to the
// same server on the same loop, which carries the meta commands routed to
// that Conn. The sibling shares the Conn's fate where the loop sees it:
// Flush, CheckTimeout and Close reach it through the Conn, and Inflight
// counts its requests. Its own socket comes and goes like any Conn's.
//
// Framing replies: a reply may echo the command's key (k, ME) as memcached
// stored it, raw even when asked for in base64; a key stored through the
// binary protocol may hold spaces and line ends. The entry keeps that
// key's length, so that the echo is read as one token however it looks
// (text.ParseMetaReply): no tenant can forge replies with its keys.
//
// Matching replies: memcached answers meta commands in order, one reply
// each, except that the q flag hides some replies (EN of mg, HD of ms,
// md and ma, and VA of an ma that did not create its counter). After
// each quiet command the sibling sends an mn of its own: a reply that
// arrives while a quiet command is the oldest in flight is that command's
// unless it is the MN, which says the command completed silently.

// MetaWaiter receives the outcome of a meta command sent with
// ForwardMeta: DeliverMeta with memcached's reply, Silent when the q flag
// hid it, or Fail, on the owning event loop, exactly once.
type MetaWaiter interface {
	Waiter
	// DeliverMeta receives memcached's reply, parsed (Line, Value, the
	// echoed key's place); r and its slices alias the connection's input
	// buffer and are valid only during the call.
	DeliverMeta(r *text.MetaResponse)
}

// metaFence is the mn the meta sibling sends after a quiet command.
var metaFence = []byte("mn\r\n")

// Meta returns the text connection that carries c's meta commands (see
// above), creating it at the first call. On the owning loop; it never
// returns nil.
func (c *Conn) Meta() *Conn {
	if c.meta == nil {
		c.meta = New(c.cfg, c.loop)
		c.meta.isMeta = true
		if c.closed {
			c.meta.Close()
		}
	}
	return c.meta
}

// ForwardMeta appends a meta command to the connection's output and
// registers w for its outcome; c must be a Meta connection. line is the
// command line with its "\r\n", its key already in the bucket's namespace;
// data is an ms's data block with its "\r\n" (nil for other commands);
// quiet reports the q flag. rawKeyLen is the length of the key memcached
// stores when line names it in base64 (0 otherwise): its reply may echo
// that key raw, with any bytes in it (text.ParseMetaReply). If the
// connection is down, w.Fail is called at once and ErrUnavailable is
// returned. Bytes are written at the next Flush.
func (c *Conn) ForwardMeta(line, data []byte, quiet bool, rawKeyLen int, w MetaWaiter) error {
	if !c.isMeta {
		w.Fail(binary.StatusEinternal, reasonMetaOnConn)
		return fmt.Errorf("upstream: ForwardMeta on the binary connection to %s", c.cfg.Addr)
	}
	if !c.ready(w) {
		return ErrUnavailable
	}
	c.out = append(c.out, line...)
	c.out = append(c.out, data...)
	if rawKeyLen < 0 || rawKeyLen > 255 {
		rawKeyLen = 0 // memcached takes no key this long
	}
	c.push(entry{quiet: quiet, w: w, rawKey: uint8(rawKeyLen)})
	if quiet {
		c.out = append(c.out, metaFence...)
		c.push(entry{})
	}
	return nil
}

// handleMetaTraffic is HandleTraffic for a meta connection: it delivers
// every whole reply to its waiter.
func (c *Conn) handleMetaTraffic(gc gnet.Conn) gnet.Action {
	if c.metaNeed > gc.InboundBuffered() {
		// A large VA is still arriving: do not re-read what is buffered.
		return gnet.None
	}
	c.metaNeed = 0
	buf, _ := gc.Peek(-1)
	off := 0
	if c.cfg.Observe != nil {
		c.now = time.Now().UnixNano()
	}
	for off < len(buf) {
		rawKey := 0
		if c.n > 0 {
			rawKey = int(c.front().rawKey)
		}
		n, err := text.ParseMetaReply(buf[off:], rawKey, &c.mresp)
		if err != nil {
			c.down(fmt.Errorf("bad meta reply from %s: %w", c.cfg.Addr, err))
			return gnet.None
		}
		if n == 0 {
			if c.mresp.Need > 0 {
				c.metaNeed = c.mresp.Need
			}
			break
		}
		off += n
		if err := c.matchMeta(&c.mresp); err != nil {
			c.down(err)
			return gnet.None
		}
		if c.gc != gc {
			return gnet.None
		}
	}
	if off > 0 {
		_, _ = gc.Discard(off)
	}
	c.mresp = text.MetaResponse{Flags: c.mresp.Flags[:0]}
	c.roomCheck()
	if c.cfg.AfterRead != nil {
		c.cfg.AfterRead()
	}
	return gnet.None
}

// matchMeta hands reply r to the request it answers (see above).
func (c *Conn) matchMeta(r *text.MetaResponse) error {
	c.answered++
	mn := string(r.Code) == text.MetaMN
	for c.n > 0 {
		e := c.front()
		switch {
		case e.w == nil: // the mn after a quiet command
			if !mn {
				return fmt.Errorf("meta reply %q from %s where the MN of a fence was due", r.Line, c.cfg.Addr)
			}
			c.pop()
			return nil
		case mn && e.quiet:
			c.pop().w.Silent()
			continue
		case mn:
			return fmt.Errorf("MN from %s for a command that was not mn", c.cfg.Addr)
		}
		if c.cfg.Observe != nil && e.sent != 0 {
			c.cfg.Observe(float64(c.now-e.sent) / 1e9)
		}
		w := c.pop().w.(MetaWaiter)
		w.DeliverMeta(r)
		return nil
	}
	return fmt.Errorf("unexpected meta reply %q from %s", r.Line, c.cfg.Addr)
}
