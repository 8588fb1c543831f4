package proxy

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/throttle"
	"github.com/kvthrottle/kvthrottle/upstream"
)

// loop is the state one gnet event loop owns: its view of the upstream
// pool, the sessions with output to flush, and a pool of request slots.
// Only that loop's goroutine touches it.
type loop struct {
	srv     *Server
	el      gnet.EventLoop
	pool    *upstream.LoopPool // this loop's connections to the servers in force
	dirty   []*session         // sessions with output to write
	tlsBuf  tlsBuffers         // scratch for its TLS clients' records (tlsconn.go)
	slots   []*slot            // free slots
	scratch []byte             // a buffer sessions may use for the moment (the body of an answer)

	sessions    map[*session]struct{} // open client sessions
	paused      []*session            // sessions waiting for their output to drain, or room for a read, in pause order
	pausedSpare []*session            // resumePaused's second buffer
	retry       []*session            // held sessions to re-admit now (one of their reads settled), and waitingOrder ones to resume
	ceilWait    []ceilWaiter          // sessions waiting for a raise of their bucket's ceiling, in order (ceilingraise.go)
	ceilRun     gnet.RunnableFunc     // a retryCeiling pass (wakeCeiling)
	refunded    []*bucket             // buckets whose settles gave units back in this pass (surprise.go, rule 5)
	poolRefund  bool                  // one of them gave units back to the free pool
	firstHeld   []wakeEntry           // wakeRefunded's scratch
	lanes       map[*bucket]*lane     // each bucket's reads in flight upstream (lane.go)
	pass        uint64                // resumePaused passes so far (lane.full)
	leasesAt    time.Duration         // when expireLeases last ran (engine time)
	leaseDue    time.Duration         // when expireLeases must run next: a lease holds stock (engine time; 0: none does)
	touched     []*lane               // lanes whose lease was used in this pass (settleLeases)
	aborts      []*lane               // lanes whose upstream connections abortLanes closes (orphan.go)
	unauthSrc   unauthSources         // unauthenticated sessions by source (connlimits.go)
	gate        readGate              // stops and restarts the reading of its client sockets (readgate.go)

	// inflight counts the loop's client commands accepted and not yet
	// answered. Only the loop writes it (addInflight); Server.inflight
	// reads it from other goroutines.
	inflight atomic.Int64

	holds   wakeHeap    // held sessions by wake-up time
	due     []wakeEntry // wakeDue's scratch: the entries due in its pass
	woken   []*session  // wakeAll's scratch: the held sessions in line order
	timer   throttle.Timer
	armed   bool
	armedAt time.Duration
	wakeRun gnet.RunnableFunc

	flushPending  bool              // flushRun is queued on the loop
	resumePending bool              // resumeRun is queued on the loop
	resumeRun     gnet.RunnableFunc // a resumePaused pass (requestResume)
	flushRun      gnet.RunnableFunc // writes the upstream connections' batches

	// Connection limits (connlimits.go, unsent.go).
	now       time.Duration // coarse clock: the engine clock's reading as of the last tick or open
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
	lp.ceilRun = lp.retryCeiling
	lp.resumeRun = func(context.Context) error {
		lp.resumePending = false
		lp.flushClients()
		return nil
	}
	lp.flushRun = func(context.Context) error {
		lp.flushPending = false
		lp.flushUpstreams()
		lp.settleLeases()
		lp.expireLeases()
		return nil
	}
	lp.pool = s.pool.Loop(el, lp.flushClients)
	if lp.gate = newReadGate(el); !lp.gate.ok() {
		s.log.Warn().Err(lp.gate.err).Int("max_held_input_bytes", s.opts.maxHeldInput).
			Msg("cannot stop reading paused clients on this event loop: a held client sending past max_held_input_bytes is closed")
	}
	return lp
}

// poolConfig is the part of cfg the upstream pool may change on a reload.
func poolConfig(cfg *bucketcfg.Config) upstream.PoolConfig {
	return upstream.PoolConfig{
		Servers:    cfg.Upstream.Servers,
		Weights:    cfg.Upstream.Weights,
		EjectAfter: cfg.Upstream.EjectAfterFailures,
		EjectRetry: cfg.Upstream.EjectRetry,
	}
}

// upstreamObserver is the pool's PoolOptions.Observer: loop el's counters
// of a server's kvthrottle_upstream_request_duration_seconds, which only
// that loop writes (one observation per response: no write shared with
// other loops).
func (s *Server) upstreamObserver(el gnet.EventLoop, addr string) func(float64) {
	if s.metrics == nil {
		return nil
	}
	return s.metrics.UpstreamLoopObserver(addr, s.loopID(el)).Observe
}

// addInflight adds n to the loop's count of commands in flight. On the
// loop: a plain store, no read-modify-write shared with other loops.
func (lp *loop) addInflight(n int64) { lp.inflight.Store(lp.inflight.Load() + n) }

// forgetUpstream is the pool's PoolOptions.OnRemove: a removed server's
// metric series go.
func (s *Server) forgetUpstream(addr string) {
	if s.metrics != nil {
		s.metrics.ForgetUpstream(addr)
	}
}

// upstreamState is the pool's PoolOptions.OnConnState: it logs a loop's
// upstream connection going up or down.
func (s *Server) upstreamState(addr string, up bool, err error) {
	if up {
		s.log.Debug().Str("server", addr).Msg("upstream connected")
		return
	}
	if s.draining.Load() {
		s.log.Debug().Str("server", addr).Err(err).Msg("upstream connection closed while stopping")
		return
	}
	if n, ok := s.logUpDown.allow(addr, time.Now()); ok {
		s.log.Warn().Str("server", addr).Err(err).Int("since_last_line", n).Msg("upstream connection down")
	} else {
		s.log.Debug().Str("server", addr).Err(err).Msg("upstream connection down")
	}
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
		lp.settleLeases()
		return
	}
	lp.flushPending = true
}

// flushUpstreams writes every upstream connection's buffered requests.
func (lp *loop) flushUpstreams() { lp.pool.FlushAll() }

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
			if s.setPause(running) {
				s.resume()
			}
		default:
			switch {
			case s.laneWait && s.flightRoom():
				// Its lane has room but it cannot go on (its client
				// does not read): it must not hold up the bucket's
				// other sessions, which wait behind it.
				s.leaveLaneWait()
			case s.laneWait:
				s.ln.full = lp.pass // later waiters of its lane keep their turn behind it
			case s.outputRoom():
				// Its client has read, and only the lane stops it: back
				// in line, or the bucket's other sessions, waiting in
				// turn, would keep the lane from it for good.
				s.joinLaneLine()
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

// requestResume arranges for a resumePaused pass once the loop has
// handled the events at hand, for sessions paused with no response coming
// that would start one.
func (lp *loop) requestResume() {
	if lp.resumePending {
		return
	}
	if err := lp.el.Execute(context.Background(), lp.resumeRun); err != nil {
		return // the engine is stopping
	}
	lp.resumePending = true
}

// retryHeld re-admits the held sessions in lp.retry, and resumes the
// waitingOrder ones.
func (lp *loop) retryHeld() {
	if len(lp.retry) == 0 {
		return
	}
	for i := 0; i < len(lp.retry); i++ { // resume may append
		s := lp.retry[i]
		lp.retry[i] = nil
		if (s.isHeld() || s.pause == waitingOrder) && !s.closed {
			if s.setPause(running) {
				s.resume()
			}
		}
	}
	lp.retry = lp.retry[:0]
}

// flushClients writes the output of every session that has some.
func (lp *loop) flushClients() {
	lp.wakeRefunded()
	lp.retryHeld()
	lp.resumePaused()
	lp.settleLeases()
	for i, s := range lp.dirty {
		lp.dirty[i] = nil
		s.flush()
	}
	lp.dirty = lp.dirty[:0]
}

func (lp *loop) tick(context.Context) error {
	lp.pool.Tick(time.Now())
	lp.compactHolds()
	lp.dropIdleLanes()
	lp.clock()
	lp.sweepConns()
	lp.refreshUnsent()
	lp.shedUnsent()
	lp.resumePaused()
	lp.retryCeilingDue()
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
	*sl = slot{resp: resp, appKey: sl.appKey[:0]}
	if len(lp.slots) < 4096 {
		lp.slots = append(lp.slots, sl)
	}
}
