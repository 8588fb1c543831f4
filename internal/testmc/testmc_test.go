package testmc

import (
	"io"
	"net"
	"testing"
)

// A port another process took between PickPort and memcached's bind is
// found out (its stats answer with another pid) and the server starts on
// new ports instead of talking to the other process.
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
			_, _ = io.WriteString(c, "STAT pid 1\r\nEND\r\n")
			c.Close()
		}
	}()
	s := &Server{Addr: l.Addr().String()}
	startOrFail(t, s)
	if s.Addr == l.Addr().String() {
		t.Fatalf("memcached kept the taken port %s", s.Addr)
	}
	if pid, err := statsPid(s.Addr); err != nil || pid != s.cmd.Process.Pid {
		t.Fatalf("on %s: pid %d (%v), want memcached's %d", s.Addr, pid, err, s.cmd.Process.Pid)
	}
}
