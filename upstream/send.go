package upstream

import (
	"errors"
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// ErrUnavailable is the cause reported when a request cannot be sent.
var ErrUnavailable = errors.New("upstream unavailable")

// Forward appends the request f to the connection's output with a fresh
// opaque, the key replaced by prefix+key, classic magic and no framing
// extras, and registers w for its outcome. The caller must have checked
// that prefix+key is at most binary.MaxKeyLen bytes. If the connection is
// down, w.Fail is called at once (before Forward returns) and ErrUnavailable
// is returned. Bytes are written at the next Flush.
func (c *Conn) Forward(f *binary.Frame, prefix []byte, w Waiter) error {
	if !c.ready(w) {
		return ErrUnavailable
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

// ready starts a connect when the connection is idle, or down with its
// backoff elapsed, and reports whether a request may be queued; when not,
// it has failed w.
func (c *Conn) ready(w Waiter) bool {
	if c.state == stateDown || c.closed {
		if c.closed || time.Now().Before(c.retryAt) {
			w.Fail(binary.StatusEtmpfail, c.unavailableReason())
			return false
		}
		c.state = stateIdle
	}
	if c.state == stateIdle {
		c.connect()
	}
	return true
}

// unavailableReason is the reason clients get: generic on purpose, since
// tenants need not learn server addresses or socket errors (the proxy logs
// those through OnState).
func (c *Conn) unavailableReason() string {
	return reasonUnavailable
}

// Flush writes the buffered requests to the server when connected, and
// those of its meta sibling. A batch
// that ends with a quiet request gets a trailing NOOP of the proxy's own so
// that the quiet requests are resolved. It is cheap to call when there is
// nothing to write.
func (c *Conn) Flush() {
	if c.meta != nil {
		c.meta.Flush()
	}
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
