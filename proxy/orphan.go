package proxy

import (
	"context"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"
)

// Answers nobody will read. A session that closes with reads in flight
// leaves them upstream: memcached answers them, and the proxy reads the
// answers and drops them. That is cheap for a few reads, and a client
// that goes away mid multi-get must not cost its bucket's other
// connections anything. But a lane has no count bound on its own upstream
// connections (lane.go), and reads whose size was learned small can turn
// out large: a client that asks for thousands of large values and stops
// reading, or goes, would make memcached and the proxy move gigabytes for
// nobody (measured: 8 GB in 8 s from 16 connections, and neighbours'
// GETs 30% slower meanwhile). So the answers read for closed sessions are
// counted per lane (its own connections only; on shared ones the lane's
// count bound caps them), and past maxResponseBytes while some are still
// in flight, the bucket's upstream connections on the loop are closed
// (upstream.Group.Abort): memcached stops sending, and the bucket's other
// commands in flight there fail with Etmpfail, the bucket's own loss.

// orphan marks the session's reads in flight on its bucket's own upstream
// connections as answers nobody will read; from close, on the loop.
func (s *session) orphan() {
	for i := s.qh; i < len(s.q); i++ {
		if sl := s.q[i]; !sl.done && sl.lane != nil && sl.lane.group != nil {
			sl.orphan = true
			sl.lane.orphansOut++
		}
	}
}

// orphanAnswer counts n bytes of an answer to the orphaned slot sl, and
// queues the abort of the lane's upstream connections past
// maxResponseBytes.
func (lp *loop) orphanAnswer(sl *slot, n int) {
	l := sl.lane
	l.orphanBytes += n
	if l.orphanBytes <= maxResponseBytes || l.aborting {
		return
	}
	l.aborting = true
	lp.aborts = append(lp.aborts, l)
	if len(lp.aborts) == 1 {
		// After the batch of answers at hand: the connection delivering
		// this one must not be closed under its own feet.
		if err := lp.el.Execute(context.Background(), gnet.RunnableFunc(lp.abortLanes)); err != nil {
			lp.aborts = lp.aborts[:0] // the engine is stopping
		}
	}
}

// orphanDone counts out the orphaned slot sl, finished; from finish,
// before the slot leaves its lane.
func orphanDone(sl *slot) {
	if l := sl.lane; l != nil {
		if l.orphansOut--; l.orphansOut == 0 {
			l.orphanBytes = 0
		}
	}
}

// abortLanes closes the upstream connections of the lanes queued by
// orphanAnswer that still have orphaned reads in flight. A loop task.
func (lp *loop) abortLanes(context.Context) error {
	for i, l := range lp.aborts {
		lp.aborts[i] = nil
		l.aborting = false
		if l.orphansOut == 0 || l.group == nil {
			continue
		}
		lp.srv.logOrphans.event(&lp.srv.log, zerolog.WarnLevel).Int("reads", l.orphansOut).Int("bytes", l.orphanBytes).
			Msg("answers for connections that went away keep coming; closing their bucket's upstream connections on this loop")
		l.group.Abort()
	}
	lp.aborts = lp.aborts[:0]
	lp.flushClients()
	return nil
}
