package proxy

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"slices"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// TLS records on the event loop. A TLS client's handshake runs on a
// goroutine (tls.go): the certificates' public-key work is what costs, and
// what a flood of handshakes would make an event loop do. Once it is done,
// the TCP connection itself is enrolled in an event loop, with its
// *tls.Conn, and the loop reads and writes the records: a record costs a
// symmetric decryption or encryption of its bytes (AES-GCM or
// ChaCha20-Poly1305), of the order of copying them. A TLS connection thus
// costs what a plaintext one does, one file descriptor and no goroutine,
// and a request crosses no socketpair and wakes no other goroutine on its
// way.
//
// The *tls.Conn runs over tlsRecords, a net.Conn that talks to the socket
// during the handshake and afterwards to the loop's buffers: Read takes
// the ciphertext that gnet has read, and says "would block" (a temporary
// net.Error, after which a *tls.Conn keeps its state and what it has
// read) when there is no more; Write appends the ciphertext to the loop's
// output buffer, which tlsClientConn writes to gnet.

// tlsRecords is the net.Conn under a TLS client's *tls.Conn: the TCP
// connection until the handshake is done, then the loop's buffers.
type tlsRecords struct {
	raw net.Conn // the TCP connection, during the handshake; nil on the loop
	src []byte   // on the loop: ciphertext read by gnet, not yet read by the *tls.Conn
	dst *[]byte  // on the loop: where written ciphertext goes (the loop's buffer)
}

// errWouldBlock: the loop has no more ciphertext for now. A *tls.Conn
// treats a temporary net.Error as "try again later" and keeps what it has
// read.
var errWouldBlock error = wouldBlock{}

type wouldBlock struct{}

func (wouldBlock) Error() string   { return "tls: no more input for now" }
func (wouldBlock) Timeout() bool   { return true }
func (wouldBlock) Temporary() bool { return true }

func (r *tlsRecords) Read(p []byte) (int, error) {
	if r.raw != nil {
		return r.raw.Read(p)
	}
	if len(r.src) == 0 {
		return 0, errWouldBlock
	}
	n := copy(p, r.src)
	r.src = r.src[n:]
	return n, nil
}

func (r *tlsRecords) Write(p []byte) (int, error) {
	if r.raw != nil {
		return r.raw.Write(p)
	}
	*r.dst = append(*r.dst, p...)
	return len(p), nil
}

// Close closes the TCP connection during the handshake; on the loop the
// session closes the gnet connection instead.
func (r *tlsRecords) Close() error {
	if r.raw != nil {
		return r.raw.Close()
	}
	return nil
}

func (r *tlsRecords) LocalAddr() net.Addr {
	if r.raw != nil {
		return r.raw.LocalAddr()
	}
	return nil
}

func (r *tlsRecords) RemoteAddr() net.Addr {
	if r.raw != nil {
		return r.raw.RemoteAddr()
	}
	return nil
}

func (r *tlsRecords) SetDeadline(t time.Time) error {
	if r.raw != nil {
		return r.raw.SetDeadline(t)
	}
	return nil
}

func (r *tlsRecords) SetReadDeadline(t time.Time) error {
	if r.raw != nil {
		return r.raw.SetReadDeadline(t)
	}
	return nil
}

func (r *tlsRecords) SetWriteDeadline(t time.Time) error {
	if r.raw != nil {
		return r.raw.SetWriteDeadline(t)
	}
	return nil
}

// tlsBuffers are an event loop's scratch buffers for its TLS clients:
// plaintext just decrypted, and ciphertext to write. Only the loop touches
// them.
type tlsBuffers struct {
	plain  []byte
	cipher []byte
}

// tlsScratchMax: a scratch buffer that grew past this (a large value) is
// dropped after use rather than kept by the loop.
const tlsScratchMax = 1 << 20

// tlsOwnedMax: a session's own plaintext buffer that grew past this is
// dropped once emptied, so that an idle connection pins little.
const tlsOwnedMax = 4 << 10

// tlsClientConn is a TLS client's connection as its session sees it
// (clientConn): plaintext, decrypted and encrypted on the loop. Input is
// decrypted when gnet reports traffic (fill), into the loop's scratch
// buffer; what the session leaves of it moves to a buffer of the session's
// own (keep), so the scratch serves the next connection. Only the loop
// touches it.
type tlsClientConn struct {
	c   gnet.Conn
	tc  *tls.Conn
	rec *tlsRecords
	buf *tlsBuffers // the loop's

	in      []byte // plaintext not yet discarded: in the loop's scratch buffer (between fill and keep), or in owned
	inOwned bool   // in is in owned
	owned   []byte // the session's own buffer, for input left over from a pass
	failed  error  // the connection's TLS failed (a bad record, an alert), or the client said close_notify
}

// newTLSClientConn makes the session side of a TLS client whose handshake
// tc has completed over rec, now enrolled as c on the loop whose buffers
// are buf.
func newTLSClientConn(c gnet.Conn, tc *tls.Conn, rec *tlsRecords, buf *tlsBuffers) *tlsClientConn {
	rec.raw = nil
	rec.dst = &buf.cipher
	return &tlsClientConn{c: c, tc: tc, rec: rec, buf: buf}
}

// fill decrypts what gnet has read (and what the *tls.Conn holds already,
// such as input read with the end of the handshake), appending the
// plaintext to the input, and writes what the TLS layer had to say (an
// alert, a key update). It returns an error when the connection is over:
// io.EOF after the client's close_notify, or the TLS error. On the loop.
func (t *tlsClientConn) fill() error {
	if t.failed != nil {
		return t.failed
	}
	switch {
	case len(t.in) == 0:
		// The usual case: everything was consumed last time. Decrypt
		// into the loop's scratch buffer; keep copies what is left.
		t.in, t.inOwned = t.buf.plain[:0], false
	case !t.inOwned:
		t.keep() // not reached: keep follows every pass
	case &t.in[0] != &t.owned[0]:
		// Input left over, not at the front of owned: move it there.
		t.owned = append(t.owned[:0], t.in...)
		t.in = t.owned
	}
	src, _ := t.c.Peek(-1)
	t.rec.src = src
	var err error
	for {
		t.in = slices.Grow(t.in, 4<<10)
		var n int
		n, err = t.tc.Read(t.in[len(t.in):cap(t.in)])
		t.in = t.in[:len(t.in)+n]
		if err != nil {
			break
		}
	}
	if used := len(src) - len(t.rec.src); used > 0 {
		_, _ = t.c.Discard(used)
	}
	t.rec.src = nil
	if t.inOwned {
		t.owned = t.in
	} else if cap(t.in) <= tlsScratchMax {
		t.buf.plain = t.in[:0] // it may have grown
	} else {
		t.buf.plain = nil
	}
	t.writeCipher()
	if errors.Is(err, errWouldBlock) {
		return nil
	}
	t.failed = err
	return err
}

// keep moves what is left of the input to the session's own buffer, off
// the loop's scratch buffer, once the session is done with this pass. On
// the loop.
func (t *tlsClientConn) keep() {
	if len(t.in) == 0 {
		t.in, t.inOwned = nil, false
		if cap(t.owned) > tlsOwnedMax {
			t.owned = nil
		}
		return
	}
	if !t.inOwned {
		t.owned = append(t.owned[:0], t.in...)
		t.in, t.inOwned = t.owned, true
	} else if cap(t.owned) > tlsOwnedMax && len(t.in) < cap(t.owned)/4 {
		// A little left of a large input: do not pin the large buffer.
		t.owned = append([]byte(nil), t.in...)
		t.in = t.owned
	}
}

// writeCipher hands the ciphertext produced since the last call to gnet.
func (t *tlsClientConn) writeCipher() {
	if len(t.buf.cipher) == 0 {
		return
	}
	_, _ = t.c.Write(t.buf.cipher)
	if cap(t.buf.cipher) > tlsScratchMax {
		t.buf.cipher = nil
	} else {
		t.buf.cipher = t.buf.cipher[:0]
	}
}

// Peek returns the next n bytes of plaintext (all of it when n <= 0), or
// io.ErrShortBuffer when fewer are buffered, as gnet.Conn's Peek.
func (t *tlsClientConn) Peek(n int) ([]byte, error) {
	if n <= 0 {
		return t.in, nil
	}
	if n > len(t.in) {
		return nil, io.ErrShortBuffer
	}
	return t.in[:n], nil
}

// Discard drops the next n bytes of plaintext (all of it when n <= 0 or
// more than is buffered) and returns how many it dropped, as gnet.Conn's
// Discard.
func (t *tlsClientConn) Discard(n int) (int, error) {
	if n <= 0 || n >= len(t.in) {
		n = len(t.in)
		t.in = t.in[:0]
		return n, nil
	}
	t.in = t.in[n:]
	return n, nil
}

// InboundBuffered is the plaintext buffered, plus the ciphertext gnet has
// read and fill has not yet decrypted.
func (t *tlsClientConn) InboundBuffered() int { return len(t.in) + t.c.InboundBuffered() }

// OutboundBuffered is the ciphertext gnet has not yet written.
func (t *tlsClientConn) OutboundBuffered() int { return t.c.OutboundBuffered() }

// Write encrypts b (records of up to 16 KiB) and hands them to gnet.
func (t *tlsClientConn) Write(b []byte) (int, error) {
	n, err := t.tc.Write(b)
	t.writeCipher()
	return n, err
}

// Close sends the client a close_notify alert and closes the connection
// once gnet has written what it holds.
func (t *tlsClientConn) Close() error {
	if t.failed == nil {
		_ = t.tc.CloseWrite()
		t.writeCipher()
	}
	return t.c.Close()
}

// Fd is the TCP connection's descriptor.
func (t *tlsClientConn) Fd() int { return t.c.Fd() }
