package proxy

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// unackedBytes returns the bytes the TCP socket fd has taken to send that
// its peer has not acknowledged (SIOCOUTQ: not yet sent, or sent and on
// their way): 0 once every byte written to it is in the peer's socket.
func unackedBytes(fd int) (int, error) {
	return unix.IoctlGetInt(fd, unix.SIOCOUTQ)
}

// tcpReceived returns the bytes the TCP connection c has received from
// its peer (TCP_INFO tcpi_bytes_received), read by its reader or not.
func tcpReceived(t testing.TB, c net.Conn) int64 {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var info *unix.TCPInfo
	if cerr := raw.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatalf("TCP_INFO of %v: %v", c.LocalAddr(), err)
	}
	return int64(info.Bytes_received)
}
