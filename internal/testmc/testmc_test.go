package testmc

import (
	"net"
	"testing"
)

// A port another process took between PickPort and memcached's bind is
// found out (memcached has no socket listening on it) and the server
// starts on new ports instead of talking to the other process.
func TestStartMovesOffATakenPort(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	s := &Server{Addr: l.Addr().String()}
	startOrFail(t, s)
	if s.Addr == l.Addr().String() {
		t.Fatalf("memcached kept the taken port %s", s.Addr)
	}
	if own, err := listensOn(s.cmd.Process.Pid, s.Addr); err != nil || !own {
		t.Fatalf("memcached does not listen on %s (%v)", s.Addr, err)
	}
}
