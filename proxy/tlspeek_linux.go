//go:build linux

package proxy

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// hasSpoken reports whether the client of c, a connection waiting for its
// source's turn, has sent anything yet (its ClientHello, as a rule): a
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
	_ = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		spoke = err == nil && n > 0
		return true // one look, never wait
	})
	return spoke
}
