package upstream

import (
	"fmt"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// HandleTraffic must be called from the engine's OnTraffic for a
// connection whose context is c. It delivers every complete response to
// its waiter.
func (c *Conn) HandleTraffic(gc gnet.Conn) gnet.Action {
	if gc != c.gc {
		return gnet.Close
	}
	if c.isMeta {
		return c.handleMetaTraffic(gc)
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
