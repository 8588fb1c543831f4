// Package mcclient is a small blocking memcached binary-protocol client
// used by kvthrottle's tests and by `kvthrottle ctl`. It is not safe for
// concurrent use: one goroutine per Client.
package mcclient

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// Client is one connection.
type Client struct {
	conn   net.Conn
	r      *bufio.Reader
	w      *bufio.Writer
	opaque uint32
	// Timeout bounds each call (default DefaultTimeout).
	Timeout time.Duration
}

// DefaultTimeout is a new Client's Timeout. It bounds how long a call may
// make no progress before it fails, not how fast an answer must be: on a
// loaded 2-core machine running several race-instrumented test processes
// at once, a proxy that is not stuck was seen to take over 5 s to answer.
const DefaultTimeout = 30 * time.Second

// Dial connects to addr.
func Dial(addr string) (*Client, error) {
	c, err := net.DialTimeout("tcp", addr, time.Minute) // liveness: a full accept queue drops SYNs
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return &Client{conn: c, r: bufio.NewReaderSize(c, 64<<10), w: bufio.NewWriterSize(c, 64<<10), Timeout: DefaultTimeout}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Conn returns the underlying connection.
func (c *Client) Conn() net.Conn { return c.conn }

// Response is a decoded response frame with its parts copied.
type Response struct {
	mc.Header
	FramingExtras      []byte // flexible framing (magic 0x18) only
	Extras, Key, Value []byte
}

// Status returns the response status.
func (r *Response) Status() mc.Status { return mc.Status(r.VBucket) }

// Request is a frame to send.
type Request struct {
	Opcode             mc.Opcode
	Extras, Key, Value []byte
	CAS                uint64
	Opaque             uint32 // 0: assigned by Send
	FramingExtras      []byte // sent with the flexible magic when not empty
}

// Send queues r (without flushing) and returns its opaque.
func (c *Client) Send(r Request) uint32 {
	if r.Opaque == 0 {
		c.opaque++
		r.Opaque = c.opaque
	}
	magic := mc.MagicRequest
	if len(r.FramingExtras) > 0 {
		magic = mc.MagicAltRequest
	}
	b := mc.AppendFrame(nil, mc.Header{Magic: magic, Opcode: r.Opcode, Opaque: r.Opaque, CAS: r.CAS}, r.FramingExtras, r.Extras, r.Key, r.Value)
	_, _ = c.w.Write(b)
	return r.Opaque
}

// WriteRaw queues raw bytes.
func (c *Client) WriteRaw(b []byte) { _, _ = c.w.Write(b) }

// Flush writes queued requests.
func (c *Client) Flush() error {
	_ = c.conn.SetWriteDeadline(time.Now().Add(c.Timeout))
	return c.w.Flush()
}

// Read reads one response.
func (c *Client) Read() (*Response, error) {
	_ = c.conn.SetReadDeadline(time.Now().Add(c.Timeout))
	var hb [mc.HeaderLen]byte
	if _, err := io.ReadFull(c.r, hb[:]); err != nil {
		return nil, err
	}
	h, _ := mc.ParseHeader(hb[:])
	if err := h.Validate(64 << 20); err != nil {
		return nil, err
	}
	body := make([]byte, h.BodyLen)
	if _, err := io.ReadFull(c.r, body); err != nil {
		return nil, err
	}
	o := int(h.FrameExtLen)
	r := &Response{Header: h, FramingExtras: body[:o]}
	r.Extras = body[o : o+int(h.ExtLen)]
	o += int(h.ExtLen)
	r.Key = body[o : o+int(h.KeyLen)]
	r.Value = body[o+int(h.KeyLen):]
	return r, nil
}

// Do sends r and reads its response.
func (c *Client) Do(r Request) (*Response, error) {
	op := c.Send(r)
	if err := c.Flush(); err != nil {
		return nil, err
	}
	resp, err := c.Read()
	if err != nil {
		return nil, err
	}
	if resp.Opaque != op {
		return resp, fmt.Errorf("opaque %d, want %d", resp.Opaque, op)
	}
	return resp, nil
}

// SetExtras returns SET extras for flags and expiry.
func SetExtras(flags, expiry uint32) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, flags)
	binary.BigEndian.PutUint32(b[4:], expiry)
	return b
}

// Set stores key=value.
func (c *Client) Set(key, value []byte) (*Response, error) {
	return c.Do(Request{Opcode: mc.OpSet, Extras: SetExtras(0, 0), Key: key, Value: value})
}

// Get fetches key.
func (c *Client) Get(key []byte) (*Response, error) {
	return c.Do(Request{Opcode: mc.OpGet, Key: key})
}

// Incr increments key by delta with initial value init.
func (c *Client) Incr(key []byte, delta, init uint64) (*Response, error) {
	ex := make([]byte, 20)
	binary.BigEndian.PutUint64(ex, delta)
	binary.BigEndian.PutUint64(ex[8:], init)
	return c.Do(Request{Opcode: mc.OpIncrement, Extras: ex, Key: key})
}

// Delete removes key.
func (c *Client) Delete(key []byte) (*Response, error) {
	return c.Do(Request{Opcode: mc.OpDelete, Key: key})
}

// StatusError is returned by helpers that expect success.
type StatusError struct {
	Op     mc.Opcode
	Status mc.Status
	Reason string
}

func (e *StatusError) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%s: %s: %s", e.Op, e.Status, e.Reason)
	}
	return fmt.Sprintf("%s: %s", e.Op, e.Status)
}
