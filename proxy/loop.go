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
	srv   *Server
	el    gnet.EventLoop
	ups   []*upstream.Conn // one per server, in Options.Servers order
	dirty []*session       // sessions with output to write
	slots []*slot          // free slots

	sessions map[*session]struct{} // open client sessions

	holds   wakeHeap // held sessions by wake-up time
	timer   *time.Timer
	armed   bool
	armedAt time.Duration
	wakeRun gnet.RunnableFunc
}

func newLoop(s *Server, el gnet.EventLoop) *loop {
	lp := &loop{srv: s, el: el, sessions: make(map[*session]struct{})}
	lp.wakeRun = lp.wakeDue
	for _, addr := range s.opts.servers {
		var observe func(float64)
		if s.metrics != nil {
			observe = s.metrics.UpstreamObserver(addr).Observe
		}
		lp.ups = append(lp.ups, upstream.New(upstream.Config{
			Observe:     observe,
			Addr:        addr,
			Timeout:     s.opts.timeout,
			MaxInflight: s.opts.maxInflight,
			AfterRead:   lp.flushClients,
			OnState:     lp.upstreamState,
		}, el))
	}
	return lp
}

func (lp *loop) upstreamState(c *upstream.Conn, up bool, err error) {
	if up {
		lp.srv.log.Debug().Str("server", c.Addr()).Msg("upstream connected")
		return
	}
	lp.srv.log.Warn().Str("server", c.Addr()).Err(err).Msg("upstream down")
}

// pick returns the upstream connection for a key.
func (lp *loop) pick(key []byte) *upstream.Conn {
	return lp.ups[0]
}

// flushUpstreams writes every upstream connection's buffered requests.
func (lp *loop) flushUpstreams() {
	for _, u := range lp.ups {
		u.Flush()
	}
}

// flushClients writes the output of every session that has some.
func (lp *loop) flushClients() {
	for i, s := range lp.dirty {
		lp.dirty[i] = nil
		s.flush()
	}
	lp.dirty = lp.dirty[:0]
}

func (lp *loop) tick(context.Context) error {
	now := time.Now()
	for _, u := range lp.ups {
		u.CheckTimeout(now)
	}
	lp.flushClients()
	return nil
}

// drainIdle closes every session with nothing in flight and no input
// left; busy sessions close themselves when they become idle (flush).
func (lp *loop) drainIdle(context.Context) error {
	for s := range lp.sessions {
		if s.pending() == 0 && s.c.InboundBuffered() == 0 {
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
