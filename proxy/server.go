// Package proxy is kvthrottle's gnet event handler: it accepts memcached
// binary-protocol clients, runs one session per connection (authentication,
// bucket selection, throttling, admin opcodes), and forwards their commands
// to the memcached servers through per-event-loop upstream connections,
// responding to each client in request order.
//
// Everything a session or a loop owns is touched only on its event loop;
// state shared across loops (counters, the bucket table, the throttle
// gauges) uses atomics. Work that may block (password checks, writing the
// state file) runs on goroutines the Server owns and reports back to the
// loop.
package proxy

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/metrics"
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
	"github.com/kvthrottle/kvthrottle/upstream"
)

// Options configure a Server.
type Options struct {
	// Config is the configuration file as loaded (required). Listen
	// address, upstream servers, bounds, buckets and users come from it.
	Config *bucketcfg.Config
	// State is the runtime throttle state loaded from
	// Config.Throttle.StateFile; it overrides the file's throttle values.
	// Nil means an empty state.
	State *bucketcfg.State
	// EventLoops is the number of gnet event loops (default GOMAXPROCS).
	EventLoops int
	// Clock is the throttle engine's clock (default: the real clock).
	Clock throttle.Clock
	// FleetClock (fleet mode) is the clock of the fleet's periodic work
	// (samples, syncs, usage rates) and, when set, the store's time
	// (fleet.Store.SetClock) instead of Redis's. Default: the engine's
	// clock, and Redis's time. For tests: a fake clock of its own, that
	// the test moves to the engine clock's reading after the event loops
	// have done all it allows, orders the fleet's work at each reading
	// after theirs, and instances sharing one reading share the store's
	// time; a sync's store calls may then take 20 s of real time.
	FleetClock throttle.Clock
	// WallClock reads the wall clock against which delayed flushes'
	// deadlines (Unix times, kept across restarts) are checked (default
	// time.Now).
	WallClock func() time.Time
	// Logger receives the proxy's logs.
	Logger zerolog.Logger
	// Version is reported by STAT.
	Version string
	// NoMetrics disables the Prometheus metrics (Server.Metrics is nil).
	NoMetrics bool
	// HealthInterval is the time between health probes of each upstream
	// server (default 1 s).
	HealthInterval time.Duration
	// StartProbeTimeout bounds how long the start waits for each upstream
	// server's item count (default 2 s): when one does not answer in time,
	// every bucket's ceiling stays at the largest item until a FLUSH
	// (startCeilings).
	StartProbeTimeout time.Duration
}

// settings are the values the hot path reads, fixed at start.
type settings struct {
	listen          string
	servers         []string
	maxConnections  int
	maxBodyBytes    int // proxy.max_frame_bytes less the header: the largest body accepted
	maxHeldInput    int
	readUnitSize    int64
	writeUnitSize   int64
	eventLoops      int
	statePath       string
	maxHold         time.Duration // throttle.max_hold; 0: hold as long as needed
	authTimeout     time.Duration // proxy.auth_timeout; 0: never
	idleTimeout     time.Duration // proxy.idle_timeout; 0: never
	unauthMax       int64         // unauthenticated connections allowed at once
	unauthPerLoop   int           // unauthMax split between the event loops
	unauthPerSource int           // unauthenticated connections one source may hold
	maxUnsent       int64         // proxy.max_unsent_bytes
	maxReadResp     int           // the largest response a read can bring (throttle.max_item_bytes with key and framing)
	connsPerBucket  bool          // upstream.conns_per_bucket: each lane its own upstream connections
	startProbe      time.Duration // Options.StartProbeTimeout (default ceilingProbeTimeout)
}

// Server is a running proxy. Create it with New, run it with Serve, stop it
// with Shutdown.
type Server struct {
	opts settings
	log  zerolog.Logger
	eng  gnet.Engine

	mu    sync.Mutex
	loops map[gnet.EventLoop]*loop

	idMu    sync.Mutex             // guards loopIDs (apart from mu: newLoop runs under mu and asks for ids)
	loopIDs map[gnet.EventLoop]int // each loop's number (loopID)

	booted   chan struct{} // closed when gnet has started (OnBoot)
	served   chan struct{} // closed when Serve returns
	draining atomic.Bool
	conns    atomic.Int64 // open client connections
	refused  atomic.Uint64
	started  time.Time
	version  string

	// Connection limits (connlimits.go, unsent.go).
	unauthConns   atomic.Int64  // open connections that must authenticate and have not
	unauthEvicted atomic.Uint64 // closed to admit a newer connection
	refusedSource atomic.Uint64 // refused: their source held its part of the share
	authTimeouts  atomic.Uint64 // closed by auth_timeout
	idleClosed    atomic.Uint64 // closed by idle_timeout
	unsentBytes   atomic.Int64  // response bytes held for clients, as counted by the sessions
	unsentShed    atomic.Uint64 // connections closed by max_unsent_bytes

	badPauseMoves atomic.Uint64 // illegal session pause transitions refused (state.go): bugs
	readStops     atomic.Uint64 // times a paused client's socket stopped being read (readgate.go)

	throttle *throttle.Engine
	// startClass is the ceiling (units) of buckets created after the
	// start: 1 when every server was empty before the proxy served, 0
	// (the largest item) otherwise (ceiling.go)
	startClass atomic.Int64
	// a save of the ceilings runs, and another is asked for (ceilingsave.go)
	ceilSaving, ceilAgain atomic.Bool
	metrics               *metrics.Metrics
	pool                  *upstream.Pool          // upstream servers in force, their health and connections
	ten                   atomic.Pointer[tenants] // buckets and users in force

	adminMu sync.Mutex // serialises admin changes and reloads
	file    *bucketcfg.Config
	state   *bucketcfg.State // guarded by adminMu
	wall    func() time.Time // Options.WallClock

	wakeDelay delayHist // how late held sessions are woken

	logAuthFail    logSample // SASL AUTHs refused: wrong or invalid credentials
	logAuthRefused logSample // SASL AUTHs refused unchecked: Etmpfail
	logBadInput    logSample // malformed frames, text-protocol clients
	logOrphans     logSample // connections closed with many reads in flight (session.orphanedLane)
	logUpDown      perKeyLog // upstream connections down, per server
	logFleetSync   logSample // failed fleet syncs
	logFleetState  logSample // fleet state documents not adopted

	fleet *fleetLink // fleet mode (fleet.go); nil for a single instance

	listeners listenerTable // [[listener]]s, fixed at start (listeners.go)
	tls       *tlsFront     // the TLS listener (tls.go); nil: none

	jobs       jobGroup             // off-loop work (offloop.go, the FLUSH writer): password checks, state writes, refusal delays
	flushes    flushQueue           // FLUSHes waiting for their state file write
	authQ      *authQueue           // password checks for the one auth worker (runs during Serve)
	authCache  *bucketcfg.AuthCache // recently verified passwords (keyed MACs, never plaintext)
	flights    *authFlights         // password checks in flight, shared by the logins presenting the same credentials
	authStats  authCounters         // kvthrottle_auth_total{mechanism,result}
	bcryptTook atomic.Int64         // nanoseconds the auth worker's last bcrypt run took (decoys' answer time)
	// fixedBcrypt (tests), when > 0: nanoseconds every bcrypt run counts
	// as having taken (bcryptDuration), whatever it took.
	fixedBcrypt atomic.Int64
}

// New validates opts, builds the throttle engine and the bucket table, and
// returns a Server that is not yet listening.
func New(opts Options) (*Server, error) {
	cfg := opts.Config
	if cfg == nil {
		return nil, errors.New("proxy: no configuration")
	}
	if len(cfg.Upstream.Servers) == 0 {
		return nil, errors.New("proxy: no upstream servers")
	}
	st := opts.State
	if st == nil {
		st = bucketcfg.NewState()
	}
	// Buckets removed while the proxy was down move to fresh namespaces,
	// and new ones are recorded (State.TrackBuckets): a name that comes
	// back must not find the old keys. Saved once everything else has
	// been checked, before anything is served: a refused start leaves the
	// state file as it was.
	st, tracked := trackBuckets(st, cfg)
	wall := opts.WallClock
	if wall == nil {
		wall = time.Now
	}
	// Delayed flushes whose time came while the proxy was down apply now.
	st, due := applyDueState(st, wall())
	tracked = tracked || due
	eff, err := bucketcfg.Effective(cfg, st)
	if err != nil {
		return nil, fmt.Errorf("proxy: apply runtime state: %w", err)
	}
	eng, err := throttle.New(throttle.Config{
		Capacity: eff.Throttle.Capacity,
		Burst:    engineBurst(eff.Throttle.Burst),
		Clock:    opts.Clock,
		FreePool: eff.Throttle.FreePool,
		// M: the largest item with the longest key.
		MaxReadUnits: throttle.ReadUnits(int64(cfg.Throttle.MaxItemBytes)+binary.MaxKeyLen, int64(cfg.Throttle.ReadUnitSize)),
		ReadUnitSize: int64(cfg.Throttle.ReadUnitSize),
	})
	if err != nil {
		return nil, fmt.Errorf("proxy: throttle engine: %w", err)
	}
	loops := opts.EventLoops
	if loops <= 0 {
		loops = runtime.GOMAXPROCS(0)
	}
	s := &Server{
		opts: settings{
			listen:          cfg.Proxy.Listen,
			servers:         cfg.Upstream.Servers,
			maxConnections:  cfg.Proxy.MaxConnections,
			maxBodyBytes:    cfg.Proxy.MaxFrameBytes - binary.HeaderLen,
			maxHeldInput:    cfg.Proxy.MaxHeldInputBytes,
			readUnitSize:    int64(cfg.Throttle.ReadUnitSize),
			writeUnitSize:   int64(cfg.Throttle.WriteUnitSize),
			eventLoops:      loops,
			statePath:       cfg.Throttle.StateFile,
			maxHold:         cfg.Throttle.MaxHold,
			authTimeout:     cfg.Proxy.AuthTimeout,
			idleTimeout:     cfg.Proxy.IdleTimeout,
			unauthMax:       unauthLimit(cfg.Proxy.MaxConnections),
			unauthPerLoop:   max(1, int(unauthLimit(cfg.Proxy.MaxConnections))/loops),
			unauthPerSource: unauthSourceLimit(max(1, int(unauthLimit(cfg.Proxy.MaxConnections))/loops)),
			maxUnsent:       cfg.Proxy.MaxUnsentBytes,
			maxReadResp:     maxReadResponse(cfg.Throttle.MaxItemBytes),
			connsPerBucket:  cfg.Upstream.ConnsPerBucket,
			startProbe:      cmp.Or(opts.StartProbeTimeout, ceilingProbeTimeout),
		},
		log:      opts.Logger,
		loops:    make(map[gnet.EventLoop]*loop),
		loopIDs:  make(map[gnet.EventLoop]int),
		booted:   make(chan struct{}),
		served:   make(chan struct{}),
		started:  time.Now(),
		wall:     wall,
		version:  opts.Version,
		throttle: eng,
		file:     cfg,
		state:    st,
		authQ:    newAuthQueue(eng.Clock()),
		flights:  newAuthFlights(),
		authCache: bucketcfg.NewAuthCache(bucketcfg.DefaultAuthCacheTTL,
			bucketcfg.DefaultAuthCacheEntries, nil),
	}
	upTLS, err := upstreamTLS(&cfg.Upstream.TLS)
	if err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	s.pool, err = upstream.NewPool(poolConfig(cfg), upstream.PoolOptions{
		Timeout:       cfg.Upstream.Timeout,
		MaxInflight:   cfg.Upstream.MaxInflight,
		ProbeInterval: opts.HealthInterval,
		Logger:        opts.Logger,
		Observer:      s.upstreamObserver,
		OnConnState:   s.upstreamState,
		OnRemove:      s.forgetUpstream,
		TLS:           upTLS,
	})
	if err != nil {
		return nil, fmt.Errorf("proxy: upstream.servers: %w", err)
	}
	if !opts.NoMetrics {
		s.metrics = metrics.New(s)
	}
	s.listeners = newListenerTable(cfg.Listeners)
	if s.tls, err = newTLSFront(s, cfg); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if err := s.openFleet(cfg, opts); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	ten, err := buildTenants(eng, eff, nil, s.metrics, st.Epochs, 0, s.localLimits)
	if err != nil {
		s.stopFleet()
		return nil, fmt.Errorf("proxy: buckets: %w", err)
	}
	s.ten.Store(ten)
	s.syncFlushes()
	s.startSavedCeilings(st)
	if tracked {
		if err := st.Save(cfg.Throttle.StateFile); err != nil {
			s.stopFleet()
			return nil, fmt.Errorf("proxy: record the buckets in service: %w", err)
		}
	}
	s.warnOvercommit(eff)
	return s, nil
}

// engineBurst maps throttle.burst_ms to the engine's Burst, where 0 means
// "the default": burst_ms = 0 means no banking.
func engineBurst(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// Metrics returns the proxy's metrics (nil with Options.NoMetrics); serve
// them with Metrics().Serve(addr, s.Ready).
func (s *Server) Metrics() *metrics.Metrics { return s.metrics }

// Engine returns the throttle engine.
func (s *Server) Engine() *throttle.Engine { return s.throttle }

// EffectiveConfig returns the configuration in force: the file's (the one
// given to New or the last Reload) with the runtime throttle state of the
// admin opcodes and the state file overriding its throttle values. The
// result is the caller's own copy; it holds the users' password hashes, so
// log only what is not secret. Safe from any goroutine; it fails only if
// the configuration in force no longer resolves, which New, Reload and the
// admin opcodes never let happen.
func (s *Server) EffectiveConfig() (*bucketcfg.Config, error) {
	s.adminMu.Lock()
	defer s.adminMu.Unlock()
	eff, err := bucketcfg.Effective(s.file, s.state)
	if err != nil {
		return nil, fmt.Errorf("proxy: configuration in force: %w", err)
	}
	return eff, nil
}

// Serve listens and serves until Shutdown is called or the engine fails.
// It returns nil after a clean Shutdown.
func (s *Server) Serve() error {
	defer close(s.served)
	// The auth worker: bcrypt runs there, one check at a time, never on an
	// event loop. It stops when the engine has stopped.
	stopAuth := s.authQ.start(s.checkAuth, s.dropAuth)
	defer stopAuth()
	s.pool.Start()
	defer s.pool.Close()
	s.startCeilings()
	s.startFleet()
	defer s.stopFleet()
	if err := s.tls.listen(); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	defer s.tls.stop() // once the engine has stopped: the bridges still open
	err := gnet.Rotate(s, listenAddrs(s.file),
		gnet.WithMulticore(true),
		gnet.WithNumEventLoop(s.opts.eventLoops),
		gnet.WithLoadBalancing(gnet.LeastConnections),
		gnet.WithTicker(true),
		gnet.WithTCPNoDelay(gnet.TCPNoDelay),
		gnet.WithReuseAddr(true),
		gnet.WithLogger(gnetLogger{s.log}),
	)
	if err != nil {
		return fmt.Errorf("proxy: serve %s: %w", s.opts.listen, err)
	}
	return nil
}

// Started returns a channel closed once the proxy accepts connections.
func (s *Server) Started() <-chan struct{} { return s.booted }

// Connections returns the number of open client connections.
func (s *Server) Connections() int64 { return s.conns.Load() }

// Shutdown drains the proxy: it stops accepting connections, keeps
// serving the commands clients have already sent, closes each connection
// once it has nothing in flight and no input left, and when every
// connection is closed (or ctx is done) stops the engine. Safe to call from
// any goroutine, once. If Serve has returned without ever accepting
// connections (it could not listen), there is nothing to drain: it returns
// nil at once.
func (s *Server) Shutdown(ctx context.Context) error {
	select {
	case <-s.booted:
	case <-s.served:
		select {
		case <-s.booted:
		default:
			return nil
		}
	case <-ctx.Done():
		return fmt.Errorf("proxy: shutdown before the proxy started: %w", ctx.Err())
	}
	s.draining.Store(true)
	s.tls.closeListener()
	s.authQ.drain()
	s.eachLoop(func(lp *loop) {
		_ = lp.el.Execute(context.Background(), gnet.RunnableFunc(lp.drainIdle))
	})
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
wait:
	for s.conns.Load() > 0 {
		select {
		case <-ctx.Done():
			s.log.Warn().Int64("connections", s.conns.Load()).Int64("inflight", s.inflight()).
				Msg("drain deadline reached; closing connections with commands in flight")
			break wait
		case <-tick.C:
		}
	}
	jobsDone := s.jobs.closeAndWait()
	select {
	case <-jobsDone:
	case <-ctx.Done():
		// Password checks and state writes finish on their own; their
		// results are dropped with the engine.
	}
	if err := s.eng.Stop(context.Background()); err != nil {
		return fmt.Errorf("proxy: stop engine: %w", err)
	}
	return nil
}

// OnBoot implements gnet.EventHandler.
func (s *Server) OnBoot(eng gnet.Engine) gnet.Action {
	s.eng = eng
	s.log.Info().Str("listen", s.opts.listen).Strs("servers", s.opts.servers).Int("event_loops", s.opts.eventLoops).Msg("proxy listening")
	close(s.booted)
	return gnet.None
}

// OnShutdown implements gnet.EventHandler.
func (s *Server) OnShutdown(gnet.Engine) {
	s.log.Info().Msg("proxy stopped")
}

// loopOf returns the state of event loop el, creating it on first use.
func (s *Server) loopOf(el gnet.EventLoop) *loop {
	s.mu.Lock()
	defer s.mu.Unlock()
	lp := s.loops[el]
	if lp == nil {
		lp = newLoop(s, el)
		s.loops[el] = lp
	}
	return lp
}

// loopID returns event loop el's number: 0 up, in the order loops first
// asked. It keys the loop's own metric counters (upstreamObserver).
func (s *Server) loopID(el gnet.EventLoop) int {
	s.idMu.Lock()
	defer s.idMu.Unlock()
	id, ok := s.loopIDs[el]
	if !ok {
		id = len(s.loopIDs)
		s.loopIDs[el] = id
	}
	return id
}

// inflight returns the client commands accepted and not yet answered, on
// all loops (a sum of counters each loop updates on its own: it may lag a
// command or two behind the loops).
func (s *Server) inflight() int64 {
	var n int64
	s.eachLoop(func(lp *loop) { n += lp.inflight.Load() })
	return n
}

func (s *Server) eachLoop(fn func(*loop)) {
	s.mu.Lock()
	lps := make([]*loop, 0, len(s.loops))
	for _, lp := range s.loops {
		lps = append(lps, lp)
	}
	s.mu.Unlock()
	for _, lp := range lps {
		fn(lp)
	}
}

// OnOpen implements gnet.EventHandler.
func (s *Server) OnOpen(c gnet.Conn) ([]byte, gnet.Action) {
	if uc, ok := c.Context().(*upstream.Conn); ok {
		uc.HandleOpen(c)
		return nil, gnet.None
	}
	if s.draining.Load() {
		return nil, gnet.Close
	}
	cl, _ := c.Context().(*tlsClient) // came over TLS (tls.go)
	remote := c.RemoteAddr().String()
	if cl != nil {
		remote = cl.remote
		if cl.user != nil {
			// The user as configured now: a reload during the
			// handshake may have changed their buckets or privileges,
			// or removed them.
			u := s.ten.Load().cfg.User(cl.user.Name)
			if u == nil {
				s.log.Info().Str("user", cl.user.Name).Str("remote", remote).Msg("tls: certificate user removed by a reload during the handshake; closing connection")
				return nil, gnet.Close
			}
			cl.user = u
		}
	}
	lp := s.loopOf(c.EventLoop())
	// A connection must authenticate when it has no bucket of its own
	// (its [[listener]]'s, or else proxy.default_bucket). Such
	// connections may take only their share of max_connections, split
	// between the loops; when the loop's share or max_connections is full,
	// the oldest unauthenticated connection of the loop makes room
	// (connlimits.go).
	listenerBucket := s.listeners.bucketOf(c.LocalAddr())
	needAuth := listenerBucket == "" && s.ten.Load().cfg.Proxy.DefaultBucket == "" && (cl == nil || cl.user == nil)
	var src string
	if needAuth {
		// A source at its part of the share makes room among its own
		// connections, or is refused: it never evicts another source's
		// (connlimits.go).
		src = authSource(remote)
		if !lp.unauthSrc.take(src, s.opts.unauthPerSource) && !lp.evictUnauthOf(src) {
			if n := s.refusedSource.Add(1); n%1000 == 1 {
				s.log.Warn().Int("per_source_limit", s.opts.unauthPerSource).Str("source", src).
					Uint64("refused_total", n).Msg("unauthenticated connections from one source at its limit; closing new connection")
			}
			return nil, gnet.Close
		}
	}
	full := s.conns.Add(1) > int64(s.opts.maxConnections)
	if needAuth && (full || lp.unauth.n >= s.opts.unauthPerLoop) {
		full = !lp.evictUnauth()
	}
	if full {
		s.conns.Add(-1)
		if needAuth {
			lp.unauthSrc.release(src)
		}
		if s.refused.Add(1)%1000 == 1 {
			s.log.Warn().Int("max_connections", s.opts.maxConnections).Str("remote", remote).
				Uint64("refused_total", s.refused.Load()).Msg("connection limit reached; closing new connection")
		}
		return nil, gnet.Close
	}
	lp.clock()
	ss := newSession(lp, c, listenerBucket)
	ss.src = src
	if cl != nil {
		ss.openTLS(c, cl, s.ten.Load())
	}
	lp.openSession(ss, needAuth)
	c.SetContext(ss)
	if cl != nil {
		// The end of the handshake may have brought the first requests
		// with it, which no readiness of the socket will announce.
		_ = lp.el.Execute(context.Background(), gnet.RunnableFunc(ss.tlsKick))
	}
	return nil, gnet.None
}

// OnClose implements gnet.EventHandler.
func (s *Server) OnClose(c gnet.Conn, err error) gnet.Action {
	switch x := c.Context().(type) {
	case *upstream.Conn:
		x.HandleClose(c, err)
	case *session:
		x.lp.closeSession(x)
		x.close()
		if !x.evicted { // an evicted one was uncounted at once
			s.conns.Add(-1)
		}
	}
	return gnet.None
}

// OnTraffic implements gnet.EventHandler.
func (s *Server) OnTraffic(c gnet.Conn) gnet.Action {
	switch x := c.Context().(type) {
	case *upstream.Conn:
		return x.HandleTraffic(c)
	case *session:
		x.readRearmed()
		if x.tls != nil {
			return x.onTLSTraffic()
		}
		return x.onTraffic()
	}
	return gnet.Close
}

const tickInterval = 50 * time.Millisecond

// OnTick implements gnet.EventHandler: it asks every loop to run its
// periodic work (loop.tick: upstream timeouts and server list changes,
// connection limits, held and paused sessions); the servers' health is
// probed apart from the loops.
func (s *Server) OnTick() (time.Duration, gnet.Action) {
	s.tls.loopsRunning()
	s.eachLoop(func(lp *loop) {
		_ = lp.el.Execute(context.Background(), gnet.RunnableFunc(lp.tick))
	})
	return tickInterval, gnet.None
}

// gnetLogger routes gnet's own logs to zerolog at debug level (errors at
// error level).
type gnetLogger struct{ l zerolog.Logger }

func (g gnetLogger) Debugf(f string, a ...any) { g.l.Debug().Msgf("gnet: "+f, a...) }
func (g gnetLogger) Infof(f string, a ...any)  { g.l.Debug().Msgf("gnet: "+f, a...) }
func (g gnetLogger) Warnf(f string, a ...any)  { g.l.Warn().Msgf("gnet: "+f, a...) }
func (g gnetLogger) Errorf(f string, a ...any) { g.l.Error().Msgf("gnet: "+f, a...) }
func (g gnetLogger) Fatalf(f string, a ...any) { g.l.Error().Msgf("gnet: "+f, a...) }
