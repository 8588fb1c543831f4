package fleet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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
			// Twice: go-redis hands the caller the error of a failed
			// connection handshake unwrapped once.
			err = explainTLS(fmt.Errorf("connect to %s: %w", addr, err))
			return failedConn{&notSentError{&notSentError{err}}}, nil
		}
		return c, nil
	}
}

// notSentError is the failure of a call that never reached the store: its
// connection could not be made.
type notSentError struct{ err error }

func (e *notSentError) Error() string { return e.err.Error() }
func (e *notSentError) Unwrap() error { return e.err }

// notSent reports whether err says the call never reached the store.
func notSent(err error) bool {
	var ns *notSentError
	return errors.As(err, &ns)
}

// failedConn is a connection that was never made: reads and writes fail
// with the dial's error (a notSentError).
type failedConn struct{ err error }

func (c failedConn) Read([]byte) (int, error)         { return 0, c.err }
func (c failedConn) Write([]byte) (int, error)        { return 0, c.err }
func (c failedConn) Close() error                     { return nil }
func (c failedConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c failedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c failedConn) SetDeadline(time.Time) error      { return nil }
func (c failedConn) SetReadDeadline(time.Time) error  { return nil }
func (c failedConn) SetWriteDeadline(time.Time) error { return nil }

// slotMapHook keeps a Redis Cluster client's slot map fresh across a
// failover: after a failed command, the next one first loads the map
// again, synchronously, within its own context.
//
// go-redis loads the map again on MOVED, ASK and READONLY replies and once
// a minute. A primary that died answers nothing: without this, the calls
// for its slots went on failing against it (connection refused) after a
// replica had taken them over, until that minute had passed (the store
// DOWN 14 s after the cluster reported ok again). A load in the background
// at the failure would not do: a call failing before the failover is done
// loads the map in which the dead primary still serves the slots. Loading
// before the next call makes the first call after the cluster is healthy
// again reach the new primary: the store is back within a period.
type slotMapHook struct {
	cc    *redis.ClusterClient
	stale atomic.Bool // the last command failed
}

func (h *slotMapHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *slotMapHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.stale.Load() {
			// ForEachMaster loads the slot map (synchronously) before it
			// runs the function on each primary: here, nothing.
			_ = h.cc.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
		}
		err := next(ctx, cmd)
		h.stale.Store(err != nil && !errors.Is(err, redis.Nil))
		return err
	}
}

func (h *slotMapHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// readOnlyHook sends a command again after a READONLY reply, on a single
// server or through Sentinel (a Cluster client follows READONLY itself).
//
// A READONLY reply comes from a server that was the primary when the
// connection was made and has been demoted since: a DNS name moved to a
// new primary, or a demotion the sentinels did not make (they close the
// old primary's clients when they do). go-redis closes that connection,
// but the pool may hold more to the same server, and each would fail one
// more call: a period each. A replica writes nothing (a script fails at
// its first write, before any), so the command is sent again, up to
// tries times in all: each try after a READONLY takes another pooled
// connection or makes a new one, which goes to the primary in force (the
// sentinels are asked again, the name resolved again).
type readOnlyHook struct{ tries int }

func (h readOnlyHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h readOnlyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		for try := 1; try < h.tries && isReadOnly(err) && ctx.Err() == nil; try++ {
			err = next(ctx, cmd)
		}
		return err
	}
}

func (h readOnlyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// isReadOnly reports whether err is a server's READONLY reply (to a
// command, or to a script's write).
func isReadOnly(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	msg := reply.Error()
	return strings.HasPrefix(msg, "READONLY ") || strings.Contains(msg, "-READONLY ")
}
