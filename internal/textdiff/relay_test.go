package textdiff

import (
	"io"
	"net"
	"sync"
	"testing"
)

// relay is a TCP relay for tests: each connection to Addr is relayed to
// upstream, and every chunk of upstream's replies passes through mangle
// (with the offset of its first byte in all reply bytes relayed so far)
// before it reaches the client. It stops when the test ends.
type relay struct {
	Addr string

	ln     net.Listener
	mu     sync.Mutex
	offset int64
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

// startRelay listens on a loopback port and relays to upstream. mangle
// may change the chunk in place or return a different one; nil returned
// means the relay closes the client connection instead.
func startRelay(t *testing.T, upstream string, mangle func(off int64, b []byte) []byte) *relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{Addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]bool{}}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = c.Close()
				continue
			}
			if !r.track(c, u) {
				return
			}
			r.wg.Add(2)
			go func() {
				defer r.wg.Done()
				_, _ = io.Copy(u, c)
				_ = u.Close()
			}()
			go func() {
				defer r.wg.Done()
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := u.Read(buf)
					if n > 0 {
						r.mu.Lock()
						off := r.offset
						r.offset += int64(n)
						r.mu.Unlock()
						out := mangle(off, buf[:n])
						if out == nil {
							return
						}
						if _, werr := c.Write(out); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(r.close)
	return r
}

// track records a relayed pair, unless the relay is closing.
func (r *relay) track(c, u net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conns == nil {
		_ = c.Close()
		_ = u.Close()
		return false
	}
	r.conns[c], r.conns[u] = true, true
	return true
}

// close stops the relay and waits for its goroutines.
func (r *relay) close() {
	_ = r.ln.Close()
	r.mu.Lock()
	for c := range r.conns {
		_ = c.Close()
	}
	r.conns = nil
	r.mu.Unlock()
	r.wg.Wait()
}
