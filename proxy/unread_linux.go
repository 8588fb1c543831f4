package proxy

import "golang.org/x/sys/unix"

// unreadBytes returns how many bytes the socket fd has received that
// nobody has read yet (0 when unknown).
func unreadBytes(fd int) int {
	n, err := unix.IoctlGetInt(fd, unix.SIOCINQ)
	if err != nil {
		return 0
	}
	return n
}
