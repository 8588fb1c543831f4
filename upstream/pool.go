package upstream

import (
	"crypto/tls"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"
)

// PoolConfig is the part of a Pool's configuration that Update may change:
// which servers are in force and when one is ejected.
type PoolConfig struct {
	// Servers are the memcached servers as "host:port", in the order the
	// clients list them (the ketama ring names its points after them; see
	// Ring). At least one, no two alike.
	Servers []string
	// Weights are the servers' ketama weights, by index into Servers; a
	// missing entry, or 0, means 1. Negative weights are refused.
	Weights []int
	// EjectAfter is how many failed health probes in a row eject a
	// server: its keys go to the other servers until it answers a probe
	// again. 0 never ejects.
	EjectAfter int
	// EjectRetry is how long an ejected server goes unprobed, and so stays
	// out, before it is probed again.
	EjectRetry time.Duration
}

// Validate reports whether cfg is one NewPool and Update accept: it
// returns the error NewRing returns for its servers and weights, or nil.
func (cfg PoolConfig) Validate() error {
	_, err := NewRing(cfg.ringServers())
	return err
}

func (cfg PoolConfig) ringServers() []Server {
	ss := make([]Server, len(cfg.Servers))
	for i, a := range cfg.Servers {
		ss[i].Addr = a
		if i < len(cfg.Weights) {
			ss[i].Weight = cfg.Weights[i]
		}
	}
	return ss
}

// same reports whether cfg and o describe the same servers in force.
func (cfg PoolConfig) same(o PoolConfig) bool {
	return slices.Equal(cfg.Servers, o.Servers) && slices.Equal(cfg.Weights, o.Weights) &&
		cfg.EjectAfter == o.EjectAfter && cfg.EjectRetry == o.EjectRetry
}

// PoolOptions are the settings of a Pool fixed for its lifetime. The
// callbacks let the caller wire metrics and logs without this package
// knowing about them; each may be nil.
type PoolOptions struct {
	// Timeout is every connection's Config.Timeout (zero: 2 s). It also
	// bounds each health probe, capped at 1 s (zero: 1 s).
	Timeout time.Duration
	// MaxInflight is every connection's Config.MaxInflight (zero: 4096).
	MaxInflight int
	// ProbeInterval is the time between health probes of each server
	// (zero or negative: 1 s). A connection lost on any loop brings the
	// next probe forward.
	ProbeInterval time.Duration
	// Logger receives the prober's logs: a server that stops or starts
	// answering, is ejected or comes back, and Update's changes. Nothing
	// secret is logged.
	Logger zerolog.Logger
	// Observer, when not nil, is called once for every connection loop el
	// opens to addr (on that loop) and returns the function that receives
	// its requests' round trips in seconds (Config.Observe), or nil. That
	// function is only ever called on el, so it may keep per-loop state
	// without synchronization.
	Observer func(el gnet.EventLoop, addr string) func(seconds float64)
	// OnConnState, when not nil, is called on the owning loop when a
	// connection goes up or down (Config.OnState), err saying why it went
	// down; not when a loop closes a retired connection (to a removed
	// server, or of a closed Group), which is no failure.
	OnConnState func(addr string, up bool, err error)
	// OnRemove, when not nil, is called by Update for each server that
	// left the pool, once the new servers are in force (on Update's
	// goroutine). Retired connections to it may still finish requests.
	OnRemove func(addr string)
	// TLS, when not nil, makes every connection to the servers, the
	// health probes' included, TLS (memcached -Z) with this client
	// configuration (see LoadTLSConfig): the handshake runs within
	// Timeout, a server whose certificate fails verification is down like
	// one that refuses connections, and the error says "tls handshake".
	// When it names no ServerName, each server is verified against the
	// host part of its address. The Pool does not modify it;
	// SetTLSConfig replaces it. Nil: plain TCP, for the Pool's life.
	TLS *tls.Config
}

// Pool is the set of memcached servers in force: the ketama ring over
// them, the health prober that says which answer and which are ejected,
// and, through LoopPool, each event loop's connections to them. It is the
// one place that knows which servers are alive: the proxy asks a LoopPool
// for the connection of a key and never dials or probes a server itself.
//
// Lifecycle: NewPool builds it idle; Start starts the health prober (one
// goroutine per version of the server list, owned by the Pool); Update
// replaces the server list, starting the new list's prober and stopping
// the old one's when the Pool is started; Close stops the prober for good.
// The loops' connections belong to the loops' gnet engine, which closes
// them when it stops; Close does not.
//
// Start, Update, Close, AppendStates, AnyUp, Version and Loop are safe
// for concurrent use; a LoopPool is not (see LoopPool).
type Pool struct {
	opts   PoolOptions
	dialer *dialer                   // every connection's and probe's (tls.go)
	set    atomic.Pointer[serverSet] // the servers in force

	mu      sync.Mutex // serialises Start, Update and Close
	running bool       // Start was called and Close was not
	closed  bool
}

// serverSet is one version of the server list: immutable except for its
// prober's atomics. Update publishes a new one; each LoopPool adopts it at
// its next Tick.
type serverSet struct {
	cfg    PoolConfig
	ring   *Ring
	health *health
}

func newServerSet(cfg PoolConfig, opts *PoolOptions, d *dialer) (*serverSet, error) {
	cfg.Servers = slices.Clone(cfg.Servers)
	cfg.Weights = slices.Clone(cfg.Weights)
	ring, err := NewRing(cfg.ringServers())
	if err != nil {
		return nil, err
	}
	h := newHealth(cfg.Servers, healthConfig{
		timeout:    opts.Timeout,
		interval:   opts.ProbeInterval,
		ejectAfter: cfg.EjectAfter,
		ejectRetry: cfg.EjectRetry,
	}, opts.Logger, d)
	return &serverSet{cfg: cfg, ring: ring, health: h}, nil
}

// NewPool returns an idle Pool of cfg's servers: no prober runs until
// Start, no connection opens until a loop forwards a request. It fails
// with NewRing's error when cfg.Validate does. The Pool keeps copies of
// cfg's slices.
func NewPool(cfg PoolConfig, opts PoolOptions) (*Pool, error) {
	p := &Pool{opts: opts, dialer: newDialer(opts.TLS)}
	set, err := newServerSet(cfg, &p.opts, p.dialer)
	if err != nil {
		return nil, err
	}
	p.set.Store(set)
	return p, nil
}

// Start starts the health prober of the servers in force: it probes every
// server at once, then every ProbeInterval, until Update replaces the list
// or Close is called. Calling Start again, or after Close, does nothing.
func (p *Pool) Start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.running || p.closed {
		return
	}
	p.running = true
	p.set.Load().health.start()
}

// Close stops the health prober and waits for it to return; after Close,
// Update still changes the servers in force but starts no prober. Safe to
// call more than once. Plain TCP connections stay open (see Pool); with
// TLS, Close ends the handshakes in progress and every connection's
// bridge (tls.go), and waits for their goroutines: call it once the
// loops' engine has stopped. TLS connections then fail to open.
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed, p.running = true, false
	p.set.Load().health.close()
	p.dialer.close()
}

// SetTLSConfig makes conf the TLS client configuration of the
// connections and probes opened from now on (a reload: certificate files
// read again); open connections keep theirs. TLS cannot be turned on or
// off: with a nil conf, or on a Pool made without PoolOptions.TLS, it
// changes nothing and returns an error. Safe for concurrent use.
func (p *Pool) SetTLSConfig(conf *tls.Config) error {
	if conf == nil || !p.dialer.tlsOn() {
		return errors.New("upstream: TLS cannot be turned on or off while running")
	}
	p.dialer.conf.Store(conf)
	return nil
}

// Update makes cfg the servers in force. When its servers, weights and
// ejection settings are those in force already it does nothing, keeping
// the health state. Otherwise the new list starts with what the old
// prober last saw of the servers it keeps (answering, and their VERSION;
// not ejection, which the new settings decide afresh) and, if the Pool is
// started, its own prober; the old list's
// prober is stopped (Update waits for its probe in progress, at most the
// probe timeout per server). Each LoopPool adopts the new list at its next
// Tick, in every group: connections to servers that stay are kept, those
// to removed servers finish their requests and close. An invalid cfg (see Validate)
// changes nothing and returns NewRing's error.
func (p *Pool) Update(cfg PoolConfig) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.set.Load()
	if cur.cfg.same(cfg) {
		return nil
	}
	next, err := newServerSet(cfg, &p.opts, p.dialer)
	if err != nil {
		return err
	}
	next.health.inherit(cur.health)
	if p.running {
		next.health.start()
	}
	p.set.Store(next)
	cur.health.close()
	if p.opts.OnRemove != nil {
		for _, addr := range cur.cfg.Servers {
			if !slices.Contains(next.cfg.Servers, addr) {
				p.opts.OnRemove(addr)
			}
		}
	}
	p.opts.Logger.Info().Strs("servers", next.cfg.Servers).Ints("weights", next.cfg.Weights).Msg("upstream servers changed")
	return nil
}

// ServerState is one server's health as the prober last saw it.
type ServerState struct {
	// Addr is the server as configured ("host:port").
	Addr string
	// Up: the server answered its last health probe.
	Up bool
	// Ejected: the server failed PoolConfig.EjectAfter probes in a row and
	// its keys go to the other servers.
	Ejected bool
}

// AppendStates appends the state of every server in force to dst, in
// PoolConfig.Servers order, and returns the extended slice.
func (p *Pool) AppendStates(dst []ServerState) []ServerState {
	h := p.set.Load().health
	for i, addr := range h.servers {
		dst = append(dst, ServerState{Addr: addr, Up: h.up[i].Load(), Ejected: h.ejected[i].Load()})
	}
	return dst
}

// AnyUp reports whether at least one server in force answered its last
// health probe (false until the first probe has answered).
func (p *Pool) AnyUp() bool { return p.set.Load().health.anyUp() }

// Version returns the VERSION answer (such as "1.6.18") of the first
// server, in PoolConfig.Servers order, that answered its last health
// probe, or nil when none did. The caller must not modify the slice.
func (p *Pool) Version() []byte { return p.set.Load().health.version() }

// Loop returns a new view of the pool for gnet event loop el, holding that
// loop's connections to the servers in force. Only el's goroutine may use
// it, and every connection it opens is enrolled on el (see Conn);
// afterRead, when not nil, becomes each connection's Config.AfterRead.
// Call Loop once per event loop.
func (p *Pool) Loop(el gnet.EventLoop, afterRead func()) *LoopPool {
	lp := &LoopPool{pool: p, el: el, afterRead: afterRead}
	lp.onState = lp.connState
	lp.def.lp = lp
	lp.set = p.set.Load()
	lp.def.adopt(lp.set)
	return lp
}
