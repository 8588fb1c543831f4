package testmc

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Endpoint is a loopback address that forwards each connection to the
// address it points at when the connection is made, as a DNS name that a
// managed store moves to its new primary does: SetTarget moves it, and
// the connections made before stay with the old target. Started for a
// test by StartEndpoint; closed, with every connection, when it ends.
type Endpoint struct {
	// Addr is "127.0.0.1:PORT".
	Addr string

	ln     net.Listener
	mu     sync.Mutex
	target string
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartEndpoint listens on a free loopback port and forwards to target.
func StartEndpoint(t testing.TB, target string) *Endpoint {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &Endpoint{Addr: ln.Addr().String(), ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	e.wg.Add(1)
	go e.accept()
	t.Cleanup(e.close)
	return e
}

// SetTarget points the connections made from now on at addr.
func (e *Endpoint) SetTarget(addr string) {
	e.mu.Lock()
	e.target = addr
	e.mu.Unlock()
}

func (e *Endpoint) accept() {
	defer e.wg.Done()
	for {
		c, err := e.ln.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		target := e.target
		e.mu.Unlock()
		up, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		if !e.track(c, up) {
			return
		}
		e.wg.Add(2)
		go e.pipe(c, up)
		go e.pipe(up, c)
	}
}

// track records a connection pair; false (both closed) once closing.
func (e *Endpoint) track(a, b net.Conn) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		a.Close()
		b.Close()
		return false
	}
	e.conns[a], e.conns[b] = struct{}{}, struct{}{}
	return true
}

// pipe copies from src to dst until either fails, then closes both.
func (e *Endpoint) pipe(dst, src net.Conn) {
	defer e.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
	e.mu.Lock()
	delete(e.conns, dst)
	delete(e.conns, src)
	e.mu.Unlock()
}

func (e *Endpoint) close() {
	e.mu.Lock()
	e.closed = true
	for c := range e.conns {
		c.Close()
	}
	e.mu.Unlock()
	e.ln.Close()
	e.wg.Wait()
}
