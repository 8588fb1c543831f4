package proxy

import (
	"net"
	"testing"
	"time"
)

// unreadBytes sees what the peer sent before anybody read it, which is
// what keeps a draining proxy from closing a connection with a request
// still in the socket.
func TestUnreadBytes(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	raw, err := server.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	unread := func() (n int) {
		_ = raw.Control(func(fd uintptr) { n = unreadBytes(int(fd)) })
		return n
	}
	if n := unread(); n != 0 {
		t.Fatalf("before sending: %d unread bytes", n)
	}
	if _, err := client.Write(make([]byte, 24)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for unread() != 24 {
		if time.Now().After(deadline) {
			t.Fatalf("unread bytes %d, want 24", unread())
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := server.Read(make([]byte, 24)); err != nil {
		t.Fatal(err)
	}
	if n := unread(); n != 0 {
		t.Fatalf("after reading: %d unread bytes", n)
	}
}
