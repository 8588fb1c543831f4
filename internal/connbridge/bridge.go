// Package connbridge hands a connection that an event loop cannot read
// itself (a *tls.Conn: gnet has no TLS) to the loop as a plain stream: it
// makes a unix socketpair, gives the caller one end (the loop side, to
// enroll in the loop) and pumps bytes between the other end and the
// connection with two goroutines it owns.
//
// Memory: an idle bridge holds no buffer. Each pump parks in the runtime
// poller until its source is readable, only then takes a buffer from a
// shared pool, moves what is there, and gives the buffer back. (A
// goroutine parked in Read would pin its buffer for as long as the
// connection stays open.) A *tls.Conn may hold decrypted or undecrypted
// input that its socket no longer shows as readable; after each wake-up the
// pump keeps reading with an expired deadline until the TLS layer needs the
// socket again, so nothing is left behind.
package connbridge

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// BufferSize is the size of the pooled buffers the pumps move bytes with:
// one TLS record's worth of plaintext.
const BufferSize = 16 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, BufferSize); return &b }}

// buffersOut counts the pooled buffers taken and not yet given back (for
// the tests: an idle bridge holds none).
var buffersOut atomic.Int64

func getBuf() *[]byte {
	buffersOut.Add(1)
	return bufPool.Get().(*[]byte)
}

func putBuf(bp *[]byte) {
	buffersOut.Add(-1)
	bufPool.Put(bp)
}

// Options configure a Bridge.
type Options struct {
	// OnDone, if set, is called once when both pumps have ended and both
	// the connection and the bridge's end of the socketpair are closed,
	// from the last pump goroutine. It must not block.
	OnDone func()
}

// Bridge pumps bytes between a connection and the bridge's end of a unix
// socketpair. Create it with New; it runs until the connection or the
// loop side closes, or Close is called.
//
// Closing follows the connection's life: when the peer of the connection
// closes (or its read fails), the loop side reads EOF; when the loop side
// is closed, the connection is closed (for a *tls.Conn, with a
// close_notify alert) and the bridge ends.
type Bridge struct {
	conn  net.Conn        // the outer connection; closed by the bridge
	loop  net.Conn        // the loop side; the caller's
	inner *net.UnixConn   // the bridge's end of the socketpair
	rc    syscall.RawConn // inner's, for waiting without a buffer
	wait  *readyWait      // waits for conn's socket to be readable; nil: unknown (reads block holding a buffer)
	drain bool            // conn may hold input its socket no longer shows (TLS)

	running atomic.Int32 // pumps still running
	once    sync.Once
	done    chan struct{}
	onDone  func()

	out outPump
}

// New starts a bridge for conn, which the bridge owns from now on (it
// closes it when it ends). It returns the Bridge; Loop returns the side to
// hand to the event loop. A *tls.Conn should have completed its handshake
// (otherwise the first read runs it on a pump goroutine). Errors come from
// making the socketpair (for example, out of file descriptors); conn is
// then left open, the caller's to close.
func New(conn net.Conn, opts Options) (*Bridge, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("connbridge: socketpair: %w", err)
	}
	loop, err := fileConn(fds[0], "connbridge-loop")
	if err != nil {
		unix.Close(fds[1])
		return nil, err
	}
	innerConn, err := fileConn(fds[1], "connbridge-inner")
	if err != nil {
		loop.Close()
		return nil, err
	}
	inner, ok := innerConn.(*net.UnixConn)
	if !ok { // not reached: a unix socket's FileConn is a *net.UnixConn
		loop.Close()
		innerConn.Close()
		return nil, fmt.Errorf("connbridge: socketpair end is a %T", innerConn)
	}
	rc, err := inner.SyscallConn()
	if err != nil {
		loop.Close()
		inner.Close()
		return nil, fmt.Errorf("connbridge: %w", err)
	}
	b := &Bridge{conn: conn, loop: loop, inner: inner, rc: rc, done: make(chan struct{}), onDone: opts.OnDone}
	b.wait, b.drain = newReadyWait(conn)
	b.out = outPump{b: b}
	b.out.readFn = b.out.read
	b.running.Store(2)
	go b.pumpIn()
	go b.pumpOut()
	return b, nil
}

// fileConn makes a net.Conn of fd, which it closes (net.FileConn keeps a
// duplicate).
func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("connbridge: %w", err)
	}
	return c, nil
}

// Loop returns the loop side: the plaintext stream of the connection, to
// enroll in an event loop (or read and write directly). The caller owns
// it: closing it ends the bridge. (gnet's Enroll closes it once it holds
// a duplicate, which then counts instead.)
func (b *Bridge) Loop() net.Conn { return b.loop }

// Conn returns the outer connection the bridge was made for.
func (b *Bridge) Conn() net.Conn { return b.conn }

// Close ends the bridge at once: it closes the connection (without waiting
// for its peer) and the bridge's end of the socketpair, so both pumps stop
// soon; Done tells when. It does not close the loop side. Safe from any
// goroutine, any number of times.
func (b *Bridge) Close() {
	b.closeAll()
}

func (b *Bridge) closeAll() {
	if tc, ok := b.conn.(*tls.Conn); ok {
		// Closing the socket itself: tls.Conn.Close would first try to
		// write a close_notify, which a peer that reads nothing can
		// hold for seconds.
		_ = tc.NetConn().Close()
	}
	_ = b.conn.Close()
	_ = b.inner.Close()
}

// Done returns a channel closed when both pumps have ended and everything
// the bridge owns is closed.
func (b *Bridge) Done() <-chan struct{} { return b.done }

// pumpEnded is called by each pump as it ends; the last one closes
// everything and reports.
func (b *Bridge) pumpEnded() {
	if b.running.Add(-1) != 0 {
		return
	}
	b.once.Do(func() {
		b.closeAll()
		close(b.done)
		if b.onDone != nil {
			b.onDone()
		}
	})
}

// pumpIn moves the connection's input to the loop side until the
// connection ends, then shuts the bridge's end for writing: the loop side
// reads EOF (and, for gnet, closes, which ends pumpOut).
func (b *Bridge) pumpIn() {
	defer b.pumpEnded()
	// A *tls.Conn may hold input already (read with the end of its
	// handshake, or left by an earlier reader), which its socket will
	// never announce.
	err := b.drainIn()
	for err == nil {
		if b.wait != nil {
			if err = b.wait.wait(); err != nil {
				break
			}
		}
		err = b.moveIn()
	}
	_ = b.inner.CloseWrite()
}

// aLongTimeAgo is an expired deadline: reads return what the connection
// holds already, or time out at once.
var aLongTimeAgo = time.Unix(1, 0)

// moveIn reads what the connection has (one read, which may block), writes
// it to the bridge's end, then drains what the connection still holds.
func (b *Bridge) moveIn() error {
	bp := getBuf()
	n, err := b.conn.Read(*bp)
	if n > 0 {
		if _, werr := b.inner.Write((*bp)[:n]); werr != nil {
			err = werr
		}
	}
	putBuf(bp)
	if err != nil {
		return err
	}
	return b.drainIn()
}

// drainIn moves what a buffering connection (a *tls.Conn) holds already,
// without waiting for its socket: it reads with an expired deadline until
// the TLS layer needs the socket again. A no-op for other connections.
func (b *Bridge) drainIn() error {
	if !b.drain {
		return nil
	}
	if err := b.conn.SetReadDeadline(aLongTimeAgo); err != nil {
		return err
	}
	var bp *[]byte
	defer func() {
		if bp != nil {
			putBuf(bp)
		}
	}()
	for {
		if bp == nil {
			bp = getBuf()
		}
		n, err := b.conn.Read(*bp)
		if n > 0 {
			if _, werr := b.inner.Write((*bp)[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return b.conn.SetReadDeadline(time.Time{})
			}
			return err
		}
	}
}

// pumpOut moves what the loop writes to the connection until the loop
// side closes (or a write fails), then closes the connection: for a
// *tls.Conn, with a close_notify alert.
func (b *Bridge) pumpOut() {
	defer b.pumpEnded()
	for {
		err := b.rc.Read(b.out.readFn)
		if err == nil {
			err = b.out.err
		}
		if b.out.n == 0 && err == nil {
			err = io.EOF
		}
		if err != nil {
			b.out.release()
			break
		}
		_, err = b.conn.Write(b.out.buf[:b.out.n])
		b.out.release()
		if err != nil {
			break
		}
	}
	_ = b.conn.Close() // a clean close: close_notify for TLS
}

// outPump is pumpOut's state for its read callback (a method value made
// once: a closure made per read would allocate).
type outPump struct {
	b      *Bridge
	readFn func(fd uintptr) bool
	bp     *[]byte
	buf    []byte
	n      int
	err    error
}

// read is the syscall.RawConn.Read callback: a non-blocking read into a
// pooled buffer taken only now; false (wait for readability) gives the
// buffer back first.
func (o *outPump) read(fd uintptr) bool {
	if o.bp == nil {
		o.bp = getBuf()
		o.buf = *o.bp
	}
	for {
		n, err := unix.Read(int(fd), o.buf)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			o.release()
			return false
		case err != nil:
			o.n, o.err = 0, fmt.Errorf("connbridge: read loop side: %w", err)
		default:
			o.n, o.err = n, nil
		}
		return true
	}
}

func (o *outPump) release() {
	if o.bp != nil {
		putBuf(o.bp)
		o.bp, o.buf = nil, nil
	}
	o.n = 0
}

// readyWait waits, without a buffer, until a connection's socket has input
// (or an error or EOF to report).
type readyWait struct {
	rc   syscall.RawConn
	fn   func(fd uintptr) bool
	peek [1]byte
}

// newReadyWait returns the waiter for conn's socket (nil when conn is not
// a socket, nor a *tls.Conn over one), and whether conn may buffer input
// its socket no longer shows (a *tls.Conn).
func newReadyWait(conn net.Conn) (*readyWait, bool) {
	raw, drain := conn, false
	if tc, ok := conn.(*tls.Conn); ok {
		raw, drain = tc.NetConn(), true
	}
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, false
	}
	w := &readyWait{rc: rc}
	w.fn = w.ready
	return w, drain
}

func (w *readyWait) wait() error { return w.rc.Read(w.fn) }

func (w *readyWait) ready(fd uintptr) bool {
	for {
		_, _, err := unix.Recvfrom(int(fd), w.peek[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch err {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		return true // input, EOF, or an error the next read reports
	}
}
