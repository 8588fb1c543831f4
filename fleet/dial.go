package fleet

import (
	"context"
	"net"
	"time"
)

// softDial wraps a go-redis dialer so that a failed dial returns, instead
// of its error, a connection whose every use fails with that error.
//
// go-redis counts failed dials per connection pool and, once they reach
// the pool's size, fails every call at once with the last dial error
// until a background probe, retrying once a second of real time, gets a
// connection: a store back up would go unused for up to a second after
// the first call that could reach it (two grant periods at 500 ms), and
// on a test's fake clock for a reading that depends on how busy the
// machine is. To the caller a connection that fails at its first use is
// the same failure (the dial's error, the connection discarded), and no
// breaker counts it: the first call after the store is back reaches it.
func softDial(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return failedConn{err}, nil
		}
		return c, nil
	}
}

// failedConn is a connection that was never made: reads and writes fail
// with the dial's error.
type failedConn struct{ err error }

func (c failedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c failedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c failedConn) Close() error                     { return nil }
func (c failedConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c failedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c failedConn) SetDeadline(time.Time) error      { return nil }
func (c failedConn) SetReadDeadline(time.Time) error  { return nil }
func (c failedConn) SetWriteDeadline(time.Time) error { return nil }
