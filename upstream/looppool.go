package upstream

import (
	"time"

	"github.com/panjf2000/gnet/v2"
)

// LoopPool is one event loop's view of a Pool: a connection per server in
// force, on that loop, and the connections to removed servers that are
// finishing their requests. Get one with Pool.Loop. Only the owning
// loop's goroutine may call its methods; none of them takes a lock, and
// Pick allocates nothing.
type LoopPool struct {
	pool      *Pool
	el        gnet.EventLoop
	afterRead func()
	onState   func(*Conn, bool, error) // connState, bound once

	set      *serverSet // the server list this loop routes with
	conns    []*Conn    // one per set.cfg.Servers entry
	retiring []*Conn    // connections to removed servers, closed once idle
}

// Pick returns the connection for key: its server on the ketama ring, or,
// while that server is ejected, the next server on the ring that is not
// (its own server again when every server is ejected). It never returns
// nil. The connection may be down; Conn.Forward then fails the request.
func (lp *LoopPool) Pick(key []byte) *Conn {
	if len(lp.conns) == 1 {
		return lp.conns[0]
	}
	if alive := lp.set.health.alive.Load(); alive != nil {
		if i := lp.set.ring.PickExcluding(key, *alive); i >= 0 {
			return lp.conns[i]
		}
	}
	return lp.conns[lp.set.ring.Pick(key)]
}

// FlushAll writes every connection's buffered requests (Conn.Flush),
// those to removed servers included.
func (lp *LoopPool) FlushAll() {
	for _, c := range lp.conns {
		c.Flush()
	}
	for _, c := range lp.retiring {
		c.Flush()
	}
}

// Tick is the loop's periodic upkeep; call it on the loop every few tens
// of milliseconds. It adopts the server list Update last published, fails
// connections whose oldest request has waited past the timeout
// (Conn.CheckTimeout with now), and closes the connections to removed
// servers that have nothing left in flight.
func (lp *LoopPool) Tick(now time.Time) {
	if set := lp.pool.set.Load(); set != lp.set {
		lp.adopt(set)
	}
	for _, c := range lp.conns {
		c.CheckTimeout(now)
	}
	kept := lp.retiring[:0]
	for _, c := range lp.retiring {
		c.CheckTimeout(now)
		if c.Inflight() == 0 {
			c.Close()
			continue
		}
		kept = append(kept, c)
	}
	clear(lp.retiring[len(kept):])
	lp.retiring = kept
}

// Inflight returns the requests sent or buffered and not yet answered on
// all of the loop's connections, those to removed servers included.
func (lp *LoopPool) Inflight() int {
	n := 0
	for _, c := range lp.conns {
		n += c.Inflight()
	}
	for _, c := range lp.retiring {
		n += c.Inflight()
	}
	return n
}

// Retiring returns the number of connections to removed servers still
// finishing their requests (Tick closes them once idle).
func (lp *LoopPool) Retiring() int { return len(lp.retiring) }

// adopt makes set the loop's server list: connections to servers that
// stay are kept, new servers get new connections (which connect at their
// first request), connections to removed servers retire.
func (lp *LoopPool) adopt(set *serverSet) {
	old := make(map[string]*Conn, len(lp.conns))
	for _, c := range lp.conns {
		old[c.Addr()] = c
	}
	conns := make([]*Conn, len(set.cfg.Servers))
	for i, addr := range set.cfg.Servers {
		if c := old[addr]; c != nil {
			conns[i] = c
			delete(old, addr)
			continue
		}
		conns[i] = lp.newConn(addr)
	}
	for _, c := range old {
		lp.retiring = append(lp.retiring, c)
	}
	lp.set, lp.conns = set, conns
}

func (lp *LoopPool) newConn(addr string) *Conn {
	o := &lp.pool.opts
	var observe func(float64)
	if o.Observer != nil {
		observe = o.Observer(addr)
	}
	return New(Config{
		Addr:        addr,
		Timeout:     o.Timeout,
		MaxInflight: o.MaxInflight,
		AfterRead:   lp.afterRead,
		OnState:     lp.onState,
		Observe:     observe,
	}, lp.el)
}

// connState reports a connection's change to PoolOptions.OnConnState and,
// when it went down, has the prober of the loop's server list probe at
// once instead of at its next interval.
func (lp *LoopPool) connState(c *Conn, up bool, err error) {
	if f := lp.pool.opts.OnConnState; f != nil {
		f(c.Addr(), up, err)
	}
	if !up {
		lp.set.health.connFailed()
	}
}
