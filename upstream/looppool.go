package upstream

import (
	"slices"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// LoopPool is one event loop's view of a Pool: its groups of connections
// (see Group), each with a connection per server in force, on that loop,
// and the connections to removed servers, or of closed groups, that are
// finishing their requests. Get one with Pool.Loop. Only the owning
// loop's goroutine may call its methods and its groups'; none of them
// takes a lock, and Pick allocates nothing.
type LoopPool struct {
	pool      *Pool
	el        gnet.EventLoop
	afterRead func()
	onState   func(*Conn, bool, error) // connState, bound once

	set      *serverSet // the server list this loop routes with
	def      Group      // the default group: LoopPool.Pick
	groups   []*Group   // NewGroup's groups not closed yet
	retiring []*Conn    // connections to removed servers, closed once idle
}

// Group is a set of connections of one loop, one per server in force,
// that a LoopPool routes keys to: memcached answers a connection in
// order, so requests sent through different groups never wait behind each
// other's responses (the proxy gives each bucket its own group). A group
// opens its connections' Conns at its first Pick (each dials at its first
// request) and follows the loop's server list (LoopPool.Tick). Get one
// with LoopPool.NewGroup; only the owning loop's goroutine may use it.
type Group struct {
	lp     *LoopPool
	set    *serverSet // the server list conns follow; nil: none yet, or closed
	conns  []*Conn    // one per set.cfg.Servers entry
	closed bool
}

// NewGroup returns a new group of the loop's connections, with none open
// until its first Pick. The caller should Close it when done with it: the
// loop keeps an open group's connections (and their sockets) until then.
func (lp *LoopPool) NewGroup() *Group {
	g := &Group{lp: lp}
	lp.groups = append(lp.groups, g)
	return g
}

// Pick returns the default group's connection for key (see Group.Pick).
// It never returns nil.
func (lp *LoopPool) Pick(key []byte) *Conn { return lp.def.Pick(key) }

// Pick returns the group's connection for key: its server on the ketama
// ring, or, while that server is ejected, the next server on the ring
// that is not (its own server again when every server is ejected). The
// first Pick creates the group's connections; later ones allocate
// nothing. After Close it returns the loop's default connection for key
// (LoopPool.Pick). It never returns nil. The connection may be down;
// Conn.Forward then fails the request.
func (g *Group) Pick(key []byte) *Conn {
	if g.set != g.lp.set {
		if g.closed {
			return g.lp.def.Pick(key)
		}
		g.adopt(g.lp.set)
	}
	return g.conns[g.set.server(key)]
}

// server returns the index, in cfg.Servers, of the server key goes to
// now: its server on the ketama ring, or, while that server is ejected,
// the next server on the ring that is not (its own server again when
// every server is ejected). Group.Pick and LoopPool.ItemSizeMaxFor both
// route with it.
func (set *serverSet) server(key []byte) int {
	if len(set.cfg.Servers) == 1 {
		return 0
	}
	if alive := set.health.alive.Load(); alive != nil {
		if i := set.ring.PickExcluding(key, *alive); i >= 0 {
			return i
		}
	}
	return set.ring.Pick(key)
}

// Close retires the group's connections: each finishes the requests it
// has in flight and is closed by the loop's Tick once it has none. Later
// Picks return the loop's default connections. Calling it again does
// nothing.
func (g *Group) Close() {
	if g.closed {
		return
	}
	g.closed = true
	lp := g.lp
	lp.retiring = append(lp.retiring, g.conns...)
	g.conns, g.set = nil, nil
	if i := slices.Index(lp.groups, g); i >= 0 {
		lp.groups = slices.Delete(lp.groups, i, i+1)
	}
}

// Abort closes the group's connections at once: their requests in flight
// fail (Etmpfail: the command may have run) and the server stops sending
// their answers. The group stays usable: its next Pick opens new
// connections. For a caller that knows the answers in flight are wanted
// by nobody, and may be many and large. Calling it on a closed group does
// nothing.
func (g *Group) Abort() {
	if g.closed {
		return
	}
	conns := g.conns
	g.conns, g.set = nil, nil
	for _, c := range conns {
		c.Close()
	}
}

// Conns returns the number of the group's connections (0 before its first
// Pick and after Close); they may not all be connected.
func (g *Group) Conns() int { return len(g.conns) }

// Busy reports whether any of the group's connections has a request in
// flight or waiting to be written.
func (g *Group) Busy() bool {
	for _, c := range g.conns {
		if c.Inflight() > 0 {
			return true
		}
	}
	return false
}

// each calls f with every connection of the loop: every group's, then
// those retiring.
func (lp *LoopPool) each(f func(*Conn)) {
	for _, c := range lp.def.conns {
		f(c)
	}
	for _, g := range lp.groups {
		for _, c := range g.conns {
			f(c)
		}
	}
	for _, c := range lp.retiring {
		f(c)
	}
}

// FlushAll writes every connection's buffered requests (Conn.Flush), in
// every group, those to removed servers and of closed groups included.
func (lp *LoopPool) FlushAll() {
	for _, c := range lp.def.conns {
		c.Flush()
	}
	for _, g := range lp.groups {
		for _, c := range g.conns {
			c.Flush()
		}
	}
	for _, c := range lp.retiring {
		c.Flush()
	}
}

// Tick is the loop's periodic upkeep; call it on the loop every few tens
// of milliseconds. It adopts the server list Update last published in
// every group, fails connections whose oldest request has waited past the
// timeout (Conn.CheckTimeout with now), and closes the retiring
// connections (to removed servers, or of closed groups) that have nothing
// left in flight.
func (lp *LoopPool) Tick(now time.Time) {
	if set := lp.pool.set.Load(); set != lp.set {
		lp.set = set
		lp.def.adopt(set)
		for _, g := range lp.groups {
			if g.set != nil {
				g.adopt(set)
			}
		}
	}
	lp.each(func(c *Conn) { c.CheckTimeout(now) })
	kept := lp.retiring[:0]
	for _, c := range lp.retiring {
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
// all of the loop's connections, in every group, those retiring included.
func (lp *LoopPool) Inflight() int {
	n := 0
	lp.each(func(c *Conn) { n += c.Inflight() })
	return n
}

// Retiring returns the number of connections to removed servers, or of
// closed groups, still finishing their requests (Tick closes them once
// idle).
func (lp *LoopPool) Retiring() int { return len(lp.retiring) }

// adopt makes set the group's server list: connections to servers that
// stay are kept, new servers get new connections (which connect at their
// first request), connections to removed servers retire.
func (g *Group) adopt(set *serverSet) {
	lp := g.lp
	conns := make([]*Conn, len(set.cfg.Servers))
	for i, addr := range set.cfg.Servers {
		for j, c := range g.conns {
			if c != nil && c.Addr() == addr {
				conns[i], g.conns[j] = c, nil
				break
			}
		}
		if conns[i] == nil {
			conns[i] = lp.newConn(addr)
		}
	}
	for _, c := range g.conns {
		if c != nil {
			lp.retiring = append(lp.retiring, c)
		}
	}
	g.set, g.conns = set, conns
}

func (lp *LoopPool) newConn(addr string) *Conn {
	o := &lp.pool.opts
	var observe func(float64)
	if o.Observer != nil {
		observe = o.Observer(lp.el, addr)
	}
	return New(Config{
		Addr:        addr,
		Timeout:     o.Timeout,
		MaxInflight: o.MaxInflight,
		AfterRead:   lp.afterRead,
		OnState:     lp.onState,
		Observe:     observe,
		dialer:      lp.pool.dialer,
	}, lp.el)
}

// connState reports a connection's change to PoolOptions.OnConnState and,
// when it went down, has the prober of the loop's server list probe at
// once instead of at its next interval. A connection the loop closed
// itself (retired, Tick) did not fail: nothing is reported.
func (lp *LoopPool) connState(c *Conn, up bool, err error) {
	if c.closed {
		return
	}
	if f := lp.pool.opts.OnConnState; f != nil {
		f(c.Addr(), up, err)
	}
	if !up {
		lp.set.health.connFailed()
	}
}
