package testmc

import (
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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

// A port claimed across processes is refused to a second claim until the
// claim is claimLife old, then claimable again.
func TestClaimAcrossProcesses(t *testing.T) {
	const port = 7 // outside PickPort's range: no run of the suite claims it
	name := filepath.Join(os.TempDir(), "kvthrottle-test-ports", "7")
	_ = os.Remove(name)
	t.Cleanup(func() { _ = os.Remove(name) })
	if !claimAcross(port) {
		t.Fatal("a first claim refused")
	}
	if claimAcross(port) {
		t.Fatal("a second claim taken while the first is fresh")
	}
	old := time.Now().Add(-claimLife - time.Second)
	if err := os.Chtimes(name, old, old); err != nil {
		t.Fatal(err)
	}
	if !claimAcross(port) {
		t.Fatal("a stale claim not taken over")
	}
}
