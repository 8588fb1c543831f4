//go:build linux

package proxy

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// hasSpoken reports whether the client of c (waiting for its source's
// turn, or in a handshake) has sent anything not yet read (its ClientHello, as a rule): a
// peek at the socket's receive queue that neither waits nor consumes.
// False when it cannot tell.
func hasSpoken(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	var b [1]byte
	spoke := false
	// Control, not Read: a handshake's goroutine may be blocked reading
	// the connection, holding its read lock; the peek never waits.
	_ = rc.Control(func(fd uintptr) {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		spoke = err == nil && n > 0
	})
	return spoke
}
