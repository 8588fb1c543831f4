package proxy

import (
	"context"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/upstream"
)

// loop is the state one gnet event loop owns: its upstream connections,
// the sessions with output to flush, and a pool of request slots. Only
// that loop's goroutine touches it.
type loop struct {
	srv      *Server
	el       gnet.EventLoop
	rt       *routing         // the server list this loop routes with
	ups      []*upstream.Conn // one per rt.servers entry
	retiring []*upstream.Conn // connections to removed servers, closed once idle
	dirty    []*session       // sessions with output to write
	slots    []*slot          // free slots
	scratch  []byte           // a buffer sessions may use for the moment (the body of an answer)

	sessions    map[*session]struct{} // open client sessions
	paused      []*session            // sessions waiting for their output to drain, or room for a read, in pause order
	pausedSpare []*session            // resumePaused's second buffer
	retry       []*session            // held sessions to re-admit now (one of their reads settled)
	lanes       map[*bucket]*lane     // each bucket's reads in flight upstream (lane.go)
	pass        uint64                // resumePaused passes so far (lane.full)
	unauthSrc   unauthSources         // unauthenticated sessions by source (connlimits.go)

	holds   wakeHeap // held sessions by wake-up time
	timer   *time.Timer
	armed   bool
	armedAt time.Duration
	wakeRun gnet.RunnableFunc

	flushPending bool              // flushRun is queued on the loop
	flushRun     gnet.RunnableFunc // writes the upstream connections' batches

	// Connection limits (connlimits.go, unsent.go).
	now       time.Duration // coarse clock: time since the server started, as of the last tick or open
	unauth    sessList      // unauthenticated sessions, oldest first
	idle      sessList      // sessions by last activity, least recent first (idle_timeout > 0)
	holding   []*session    // sessions whose unsent responses count against max_unsent_bytes
	unsentSum int64         // their share of Server.unsentBytes
}

func newLoop(s *Server, el gnet.EventLoop) *loop {
	lp := &loop{srv: s, el: el, sessions: make(map[*session]struct{}), lanes: make(map[*bucket]*lane), pass: 1}
	lp.unauth.k, lp.idle.k = listUnauth, listIdle
	lp.clock()
	lp.wakeRun = lp.wakeDue
	lp.flushRun = func(context.Context) error {
		lp.flushPending = false
		lp.flushUpstreams()
		return nil
	}
	lp.adopt(s.routing.Load())
	return lp
}

// adopt makes rt the loop's routing: connections to servers that stay are
// kept, new servers get new connections, connections to removed servers
// finish their requests and close. On the loop.
func (lp *loop) adopt(rt *routing) {
	if lp.rt == rt {
		return
	}
	old := make(map[string]*upstream.Conn, len(lp.ups))
	for _, u := range lp.ups {
		old[u.Addr()] = u
	}
	ups := make([]*upstream.Conn, len(rt.servers))
	for i, addr := range rt.servers {
		if u := old[addr]; u != nil {
			ups[i] = u
			delete(old, addr)
			continue
		}
		ups[i] = lp.newUpstream(addr)
	}
	for _, u := range old {
		lp.retiring = append(lp.retiring, u)
	}
	lp.rt, lp.ups = rt, ups
}

func (lp *loop) newUpstream(addr string) *upstream.Conn {
	s := lp.srv
	var observe func(float64)
	if s.metrics != nil {
		observe = s.metrics.UpstreamObserver(addr).Observe
	}
	return upstream.New(upstream.Config{
		Addr:        addr,
		Timeout:     s.opts.timeout,
		MaxInflight: s.opts.maxInflight,
		AfterRead:   lp.flushClients,
		OnState:     lp.upstreamState,
		Observe:     observe,
	}, lp.el)
}

func (lp *loop) upstreamState(c *upstream.Conn, up bool, err error) {
	if up {
		lp.srv.log.Debug().Str("server", c.Addr()).Msg("upstream connected")
		return
	}
	if lp.srv.draining.Load() {
		lp.srv.log.Debug().Str("server", c.Addr()).Err(err).Msg("upstream connection closed while stopping")
		return
	}
	lp.srv.log.Warn().Str("server", c.Addr()).Err(err).Msg("upstream connection down")
	lp.rt.health.connFailed()
}

// pick returns the upstream connection for a key: the ketama ring over the
// servers, skipping ejected ones.
func (lp *loop) pick(key []byte) *upstream.Conn {
	if len(lp.ups) == 1 {
		return lp.ups[0]
	}
	if alive := lp.rt.health.alive.Load(); alive != nil {
		if i := lp.rt.ring.PickExcluding(key, *alive); i >= 0 {
			return lp.ups[i]
		}
	}
	return lp.ups[lp.rt.ring.Pick(key)]
}

// requestFlush arranges for the upstream connections' buffered requests to
// be written once the loop has handled every client that is ready now:
// the task runs after the current batch of readiness events, so the
// requests of many clients go out in one write per server instead of one
// write each (the write syscall is most of the proxy's cost).
func (lp *loop) requestFlush() {
	if lp.flushPending {
		return
	}
	if err := lp.el.Execute(context.Background(), lp.flushRun); err != nil {
		lp.flushUpstreams() // the engine is stopping: write now
		return
	}
	lp.flushPending = true
}

// flushUpstreams writes every upstream connection's buffered requests.
func (lp *loop) flushUpstreams() {
	for _, u := range lp.ups {
		u.Flush()
	}
	for _, u := range lp.retiring {
		u.Flush()
	}
}

// resumePaused restarts the output-paused sessions that may go on, in the
// order they paused. Those that still may not keep their place ahead of
// those that ran and paused again, so sessions competing for their
// bucket's reads in flight (flightRoom) take turns.
func (lp *loop) resumePaused() {
	if len(lp.paused) == 0 {
		return
	}
	lp.pass++
	ps := lp.paused
	lp.paused = lp.pausedSpare[:0]
	lp.pausedSpare = nil // in use: a nested call must not share it
	kept := ps[:0]
	for _, s := range ps {
		switch {
		case s.closed:
		case s.canResume():
			s.setPause(running)
			s.resume()
		default:
			if s.laneWait && !s.flightRoom() {
				s.ln.full = lp.pass // later waiters of its lane keep their turn behind it
			}
			kept = append(kept, s)
		}
	}
	again := lp.paused
	lp.paused = append(kept, again...)
	if n := len(lp.paused); n < len(ps) {
		clear(ps[n:]) // kept shares ps's array: drop what it no longer holds
	}
	clear(again)
	lp.pausedSpare = again[:0]
}

// retryHeld re-admits the held sessions in lp.retry.
func (lp *loop) retryHeld() {
	if len(lp.retry) == 0 {
		return
	}
	for i := 0; i < len(lp.retry); i++ { // resume may append
		s := lp.retry[i]
		lp.retry[i] = nil
		if s.isHeld() && !s.closed {
			s.setPause(running)
			s.resume()
		}
	}
	lp.retry = lp.retry[:0]
}

// flushClients writes the output of every session that has some.
func (lp *loop) flushClients() {
	lp.retryHeld()
	lp.resumePaused()
	for i, s := range lp.dirty {
		lp.dirty[i] = nil
		s.flush()
	}
	lp.dirty = lp.dirty[:0]
}

func (lp *loop) tick(context.Context) error {
	if rt := lp.srv.routing.Load(); rt != lp.rt {
		lp.adopt(rt)
	}
	now := time.Now()
	for _, u := range lp.ups {
		u.CheckTimeout(now)
	}
	kept := lp.retiring[:0]
	for _, u := range lp.retiring {
		u.CheckTimeout(now)
		if u.Inflight() == 0 {
			u.Close()
			continue
		}
		kept = append(kept, u)
	}
	lp.retiring = kept
	lp.compactHolds()
	lp.dropIdleLanes()
	lp.clock()
	lp.sweepConns()
	lp.refreshUnsent()
	lp.shedUnsent()
	lp.resumePaused()
	lp.flushClients()
	return nil
}

// drainIdle closes every session with nothing in flight and no input
// left; busy sessions close themselves when they become idle (flush).
func (lp *loop) drainIdle(context.Context) error {
	for s := range lp.sessions {
		if s.pending() == 0 && s.drained() {
			_ = s.c.Close()
		}
	}
	return nil
}

func (lp *loop) getSlot() *slot {
	if n := len(lp.slots); n > 0 {
		sl := lp.slots[n-1]
		lp.slots[n-1] = nil
		lp.slots = lp.slots[:n-1]
		return sl
	}
	return &slot{}
}

const maxPooledSlotBuf = 64 << 10

func (lp *loop) putSlot(sl *slot) {
	resp := sl.resp[:0]
	if cap(resp) > maxPooledSlotBuf {
		resp = nil
	}
	*sl = slot{resp: resp}
	if len(lp.slots) < 4096 {
		lp.slots = append(lp.slots, sl)
	}
}
