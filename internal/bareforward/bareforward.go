//go:build linux

// Package bareforward is the cheapest memcached binary-protocol forwarder we
// know how to write: the reference floor `make bench` measures beside
// kvthrottle, so that the cost of any proxy on the machine at hand — a second
// pair of socket operations per request — is told apart from the cost of
// kvthrottle's own work.
//
// It does only what every proxy must: read each client's requests, send
// them upstream, and route each response back to its client (responses come
// back in request order, so a FIFO of clients is the whole routing table). Each event loop owns one epoll
// instance, one SO_REUSEPORT listening socket and one upstream connection,
// on one locked OS thread; it reads what is ready, writes the requests of
// all ready clients upstream in one write(2), and each client's responses
// in one write(2), per epoll pass. No throttling, no tenants, no bounds, no
// reconnection.
//
// It is a benchmark instrument, not a product: it forwards only the
// commands memcached answers exactly once and without closing the
// connection (GET, SET, DELETE and the like; a client sending anything
// else, QUIT included, is closed), an upstream failure stops Serve, and a
// full socket is waited for with poll(2), holding up the whole loop
// (reading memcached's responses meanwhile when the socket is memcached's,
// so that neither side waits for the other for ever).
package bareforward

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"

	"golang.org/x/sys/unix"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// Serve forwards connections accepted on listen (an IPv4 "host:port") to
// the memcached server at upstream (IPv4 "host:port") with the given number
// of event loops (at least 1), until ctx is done (it returns nil) or a loop
// fails (it returns that loop's error after stopping the others).
func Serve(ctx context.Context, listen, upstream string, loops int) error {
	if loops < 1 {
		return fmt.Errorf("bareforward: %d loops", loops)
	}
	la, err := sockaddr(listen)
	if err != nil {
		return fmt.Errorf("bareforward: listen address: %w", err)
	}
	ua, err := sockaddr(upstream)
	if err != nil {
		return fmt.Errorf("bareforward: upstream address: %w", err)
	}
	ls := make([]*loop, 0, loops)
	defer func() {
		for _, l := range ls {
			l.close()
		}
	}()
	for range loops {
		l, err := newLoop(la, ua)
		if err != nil {
			return err
		}
		ls = append(ls, l)
	}
	errc := make(chan error, loops)
	for _, l := range ls {
		go func() {
			runtime.LockOSThread()
			errc <- l.run()
		}()
	}
	var first error
	select {
	case <-ctx.Done():
	case first = <-errc:
		loops--
	}
	for _, l := range ls {
		l.stop()
	}
	for range loops {
		<-errc
	}
	return first
}

func sockaddr(hostport string) (*unix.SockaddrInet4, error) {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil {
		return nil, err
	}
	if !ap.Addr().Is4() {
		return nil, fmt.Errorf("%s: not IPv4", hostport)
	}
	return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}, nil
}

// client is one accepted connection.
type client struct {
	fd    int
	in    []byte // the start of a request not yet complete
	out   []byte // responses to write at the end of the pass
	dirty bool   // on the loop's dirty list
}

type loop struct {
	ep, lfd, ufd, efd int

	clients map[int]*client
	dirty   []*client

	buf       []byte // what each read(2) reads into
	uin, uout []byte
	fifo      []*client // whose requests are upstream, in order; head is the oldest
	head      int
	stopped   bool
}

func newLoop(la, ua *unix.SockaddrInet4) (l *loop, err error) {
	l = &loop{ep: -1, lfd: -1, ufd: -1, efd: -1, clients: make(map[int]*client)}
	defer func() {
		if err != nil {
			l.close()
			l = nil
		}
	}()
	if l.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("bareforward: epoll_create1: %w", err)
	}
	if l.efd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("bareforward: eventfd: %w", err)
	}
	if l.lfd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("bareforward: socket: %w", err)
	}
	if err = unix.SetsockoptInt(l.lfd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
		return nil, fmt.Errorf("bareforward: SO_REUSEPORT: %w", err)
	}
	if err = unix.Bind(l.lfd, la); err != nil {
		return nil, fmt.Errorf("bareforward: bind: %w", err)
	}
	if err = unix.Listen(l.lfd, 4096); err != nil {
		return nil, fmt.Errorf("bareforward: listen: %w", err)
	}
	if l.ufd, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("bareforward: socket: %w", err)
	}
	if err = unix.Connect(l.ufd, ua); err != nil {
		return nil, fmt.Errorf("bareforward: connect upstream: %w", err)
	}
	if err = setupConn(l.ufd); err != nil {
		return nil, err
	}
	for _, fd := range []int{l.efd, l.lfd, l.ufd} {
		if err = l.watch(fd); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func setupConn(fd int) error {
	if err := unix.SetNonblock(fd, true); err != nil {
		return fmt.Errorf("bareforward: non-blocking: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return fmt.Errorf("bareforward: TCP_NODELAY: %w", err)
	}
	return nil
}

func (l *loop) watch(fd int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}
	if err := unix.EpollCtl(l.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		return fmt.Errorf("bareforward: epoll_ctl: %w", err)
	}
	return nil
}

// stop asks the loop to return; safe from any goroutine.
func (l *loop) stop() {
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	_, _ = unix.Write(l.efd, one[:])
}

// close releases the loop's descriptors; only once run has returned.
func (l *loop) close() {
	for fd := range l.clients {
		_ = unix.Close(fd)
	}
	for _, fd := range []int{l.ufd, l.lfd, l.efd, l.ep} {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}

var errUpstreamClosed = errors.New("bareforward: upstream closed the connection")

func (l *loop) run() error {
	events := make([]unix.EpollEvent, 512)
	l.buf = make([]byte, 64<<10)
	timeout := -1
	for !l.stopped {
		n, err := unix.EpollWait(l.ep, events, timeout)
		if err != nil && err != unix.EINTR {
			return fmt.Errorf("bareforward: epoll_wait: %w", err)
		}
		if n <= 0 {
			timeout = -1
			continue
		}
		// Look again without sleeping before blocking: answers often
		// arrive while this pass runs, and a poll is cheaper than a sleep
		// and a wake-up.
		timeout = 0
		for i := range n {
			var err error
			switch fd := int(events[i].Fd); fd {
			case l.efd:
				l.stopped = true
			case l.lfd:
				err = l.accept()
			case l.ufd:
				err = l.readUpstream()
			default:
				l.readClient(fd)
			}
			if err != nil {
				return err
			}
		}
		if err := l.flush(); err != nil {
			return err
		}
	}
	return nil
}

func (l *loop) accept() error {
	for {
		fd, _, err := unix.Accept4(l.lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
		if err == unix.EAGAIN {
			return nil
		}
		if err != nil {
			return fmt.Errorf("bareforward: accept: %w", err)
		}
		if err := setupConn(fd); err != nil {
			_ = unix.Close(fd)
			return err
		}
		if err := l.watch(fd); err != nil {
			_ = unix.Close(fd)
			return err
		}
		l.clients[fd] = &client{fd: fd}
	}
}

// readClient reads what a client sent and queues its complete requests
// for the upstream write at the end of the pass.
func (l *loop) readClient(fd int) {
	c := l.clients[fd]
	if c == nil {
		return
	}
	n, err := unix.Read(fd, l.buf)
	if err == unix.EAGAIN {
		return
	}
	if n <= 0 {
		l.drop(c)
		return
	}
	data := joined(&c.in, l.buf[:n])
	for {
		frame, rest, ok := nextFrame(data)
		if !ok {
			break
		}
		if frame[0] != byte(mc.MagicRequest) || !forwardable(mc.Opcode(frame[1])) {
			l.drop(c)
			return
		}
		l.fifo = append(l.fifo, c)
		l.uout = append(l.uout, frame...)
		data = rest
	}
	c.in = append(c.in[:0], data...)
}

// forwardable reports whether memcached answers op exactly once and keeps
// the connection open, so that forwarding it on the connection every client
// of the loop shares routes every response right. Quiet commands (no
// response, or several), STAT (several), QUIT (closes) and what memcached
// does not implement in the binary protocol (its answer comes after it has
// swallowed part of the next request) are not.
func forwardable(op mc.Opcode) bool {
	switch op {
	case mc.OpGet, mc.OpGetK, mc.OpSet, mc.OpAdd, mc.OpReplace, mc.OpDelete, mc.OpIncrement,
		mc.OpDecrement, mc.OpAppend, mc.OpPrepend, mc.OpNoop, mc.OpVersion, mc.OpTouch, mc.OpGAT:
		return true
	}
	return false
}

// joined returns the bytes to parse: the partial frame kept from the last
// read, if any, followed by read.
func joined(kept *[]byte, read []byte) []byte {
	if len(*kept) == 0 {
		return read
	}
	*kept = append(*kept, read...)
	return *kept
}

// nextFrame splits the first frame off data; ok is false when data does not
// hold a whole frame.
func nextFrame(data []byte) (frame, rest []byte, ok bool) {
	if len(data) < mc.HeaderLen {
		return nil, data, false
	}
	size := mc.HeaderLen + int(binary.BigEndian.Uint32(data[8:12]))
	if len(data) < size {
		return nil, data, false
	}
	return data[:size], data[size:], true
}

// drop closes a client. Responses still due to it are discarded when they
// arrive.
func (l *loop) drop(c *client) {
	delete(l.clients, c.fd)
	_ = unix.Close(c.fd)
	c.fd = -1
}

// readUpstream reads responses and appends each to its client's output.
func (l *loop) readUpstream() error {
	n, err := unix.Read(l.ufd, l.buf)
	if err == unix.EAGAIN {
		return nil
	}
	if n <= 0 {
		if err == nil {
			err = errUpstreamClosed
		}
		return fmt.Errorf("bareforward: upstream read: %w", err)
	}
	data := joined(&l.uin, l.buf[:n])
	for {
		frame, rest, ok := nextFrame(data)
		if !ok {
			break
		}
		if l.head == len(l.fifo) {
			return errors.New("bareforward: a response nobody asked for")
		}
		c := l.fifo[l.head]
		l.fifo[l.head] = nil
		l.head++
		if c.fd >= 0 {
			c.out = append(c.out, frame...)
			if !c.dirty {
				c.dirty = true
				l.dirty = append(l.dirty, c)
			}
		}
		data = rest
	}
	l.uin = append(l.uin[:0], data...)
	if l.head == len(l.fifo) {
		l.fifo, l.head = l.fifo[:0], 0
	}
	return nil
}

// flush writes the pass's requests upstream and each client's responses.
func (l *loop) flush() error {
	if len(l.uout) > 0 {
		if err := l.writeUpstream(); err != nil {
			return fmt.Errorf("bareforward: upstream write: %w", err)
		}
		l.uout = l.uout[:0]
	}
	for i, c := range l.dirty {
		l.dirty[i] = nil
		c.dirty = false
		if c.fd >= 0 && !l.stopped && l.writeClient(c) != nil {
			l.drop(c)
		}
		c.out = c.out[:0]
	}
	l.dirty = l.dirty[:0]
	return nil
}

// writeUpstream writes the pass's requests. While memcached's socket is
// full, it reads memcached's responses: memcached may be waiting for its
// own writes to drain before it reads more.
func (l *loop) writeUpstream() error { return l.writeAll(l.ufd, l.uout, l.readUpstream) }

// writeClient writes a client's responses, waiting while its socket is
// full.
func (l *loop) writeClient(c *client) error { return l.writeAll(c.fd, c.out, nil) }

// writeAll writes b to fd, waiting while its socket is full; with onIn not
// nil it also wakes when fd is readable and calls onIn then.
func (l *loop) writeAll(fd int, b []byte, onIn func() error) error {
	events := int16(unix.POLLOUT)
	if onIn != nil {
		events |= unix.POLLIN
	}
	for len(b) > 0 && !l.stopped {
		n, err := unix.Write(fd, b)
		switch {
		case err == unix.EAGAIN:
			readable, err := l.await(fd, events)
			if err != nil {
				return err
			}
			if readable && onIn != nil {
				if err := onIn(); err != nil {
					return err
				}
			}
		case err != nil:
			return err
		default:
			b = b[n:]
		}
	}
	return nil
}

// is set). It reports whether fd is readable.
func (l *loop) await(fd int, events int16) (readable bool, err error) {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: events}, {Fd: int32(l.efd), Events: unix.POLLIN}}
	if _, err := unix.Poll(pfd, -1); err != nil && err != unix.EINTR {
		return false, fmt.Errorf("poll: %w", err)
	}
	if pfd[1].Revents != 0 {
		l.stopped = true
	}
	return pfd[0].Revents&unix.POLLIN != 0, nil
}
