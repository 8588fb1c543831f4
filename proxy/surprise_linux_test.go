package proxy

import (
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

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
	var n int64
	if cerr := raw.Control(func(fd uintptr) { n, err = bytesReceived(int(fd)) }); cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatalf("TCP_INFO of %v: %v", c.LocalAddr(), err)
	}
	return n
}

// bytesReceived returns the bytes the TCP socket fd has received from its
// peer (TCP_INFO tcpi_bytes_received), read from the socket or not.
func bytesReceived(fd int) (int64, error) {
	info, err := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
	if err != nil {
		return 0, err
	}
	return int64(info.Bytes_received), nil
}

// inputRead waits until the loop serving client c has read every one of
// the n bytes c has written to it in all (TCP_INFO tcpi_bytes_received of
// the proxy's end of the connection, and nothing left unread in its
// socket: SIOCINQ): what they ask is then admitted, held or waiting at the
// clock's reading. A settle (settledOwing, dispatched) alone is met by a
// session that has not read its input yet: the clock then moves first.
func inputRead(t *testing.T, p *testProxy, c net.Conn, n int) {
	t.Helper()
	var infoErr error
	eventually(t, time.Minute, fmt.Sprintf("the proxy to read the %d bytes %v wrote", n, c.LocalAddr()), func() bool {
		read := false
		onLoop(t, p, func(lp *loop) {
			if s := sessionOf(lp, c.LocalAddr()); s != nil {
				got, err := bytesReceived(s.c.Fd())
				if err != nil {
					infoErr = err
					return
				}
				read = got == int64(n) && unreadBytes(s.c.Fd()) == 0
			}
		})
		return read || infoErr != nil
	})
	if infoErr != nil {
		t.Fatalf("TCP_INFO of the proxy's end of %v: %v", c.LocalAddr(), infoErr)
	}
}
