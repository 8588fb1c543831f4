package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/certpool"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// The TLS listener (DESIGN.md section 11). gnet has no TLS, so TLS clients
// are accepted by a Go listener and their handshakes run on goroutines,
// off the event loops; each established connection, its TCP socket with
// its *tls.Conn, is then enrolled in a gnet event loop, which reads and
// writes its records from there on (tlsconn.go). It is an ordinary client
// session: OnOpen learns from the connection's context, a *tlsClient, that
// it came over TLS, from where, and as which user. Every goroutine here
// belongs to the tlsFront, which Serve stops once the engine has stopped.
//
// Costs: an established TLS connection holds one file descriptor, as a
// plaintext one does, and no goroutine; a handshake in progress holds a
// goroutine.

// Handshake bounds: a handshake that has not completed in
// tlsHandshakeTimeout (on the engine's clock) is dropped; at most tlsMaxHandshakesPerSource run
// at once for one source (authSource: an IPv4 address or an IPv6 /64;
// more are closed at once), and at most tlsMaxHandshakes in all: a
// connection that finds them all taken ends a handshake of the source
// with the most in progress, its oldest silent one (no hello yet) if it
// has one (takeSlot, evictOne). A flood of slow or bogus handshakes thus
// costs a bounded number of goroutines, and connections that stay silent
// from a few sources cannot keep out other sources' clients. (An attacker
// with hundreds of addresses still ends other clients' handshakes, one
// per connection it opens once every slot is taken.) Their computing is bounded
// too (handshakeConn): a flood of full handshakes takes at most
// handshakeCPUs processors from the event loops.
const (
	tlsHandshakeTimeout       = 10 * time.Second
	tlsMaxHandshakes          = 256
	tlsMaxHandshakesPerSource = 32
)

// handshakeCPUs is how many handshakes may compute at once: all the
// processors the runtime has but one, which stays free for the event
// loops, which serve established connections (at least one).
func handshakeCPUs() int { return max(1, runtime.GOMAXPROCS(0)-1) }

// handshakeConn is a TLS connection's socket during its handshake: the
// handshake holds one of the front's cpu slots while it computes, and
// gives it back whenever it waits for the client (a Read or a Write), so
// that handshakes, however many are in progress, compute on at most
// handshakeCPUs processors at once and cannot starve the event loops (a
// flood of handshakes only queues for the slots). Once the handshake has
// ended (release), it is a plain pass-through. Used by one goroutine at a
// time; after release, nobody uses it (the loop reads the socket).
type handshakeConn struct {
	net.Conn
	cpu     chan struct{}
	ctx     context.Context // the handshake's: waiting for a slot ends with it
	spoke   *atomic.Bool    // set once the client has sent something; nil: not recorded
	step    func()          // called after each step: bytes read, a turn of computing ended; nil: none
	holding bool            // a slot is held
	done    bool            // released: no more slots
}

// acquire waits for a cpu slot (not when ctx is done: the handshake is
// failing anyway).
func (c *handshakeConn) acquire() {
	if c.done || c.holding {
		return
	}
	select {
	case c.cpu <- struct{}{}:
		c.holding = true
	case <-c.ctx.Done():
	}
}

func (c *handshakeConn) yield() {
	if c.holding {
		<-c.cpu
		c.holding = false
		c.stepped()
	}
}

// stepped records a step of the handshake (see step).
func (c *handshakeConn) stepped() {
	if c.step != nil {
		c.step()
	}
}

// release gives the slot back for good; from the handshake's goroutine
// once the handshake has ended, before anyone else uses the connection.
func (c *handshakeConn) release() {
	c.yield()
	c.done = true
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if c.done {
		return c.Conn.Read(b)
	}
	c.yield()
	n, err := c.Conn.Read(b)
	if n > 0 && c.spoke != nil {
		c.spoke.Store(true) // before waiting for a cpu slot: it shows the client, not our queue
	}
	if n > 0 {
		c.stepped()
	}
	c.acquire()
	return n, err
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if c.done {
		return c.Conn.Write(b)
	}
	c.yield()
	n, err := c.Conn.Write(b)
	c.acquire()
	return n, err
}

// tlsClient is the gnet context of a TLS client connection's loop side,
// read by OnOpen.
type tlsClient struct {
	remote string          // the client's address
	user   *bucketcfg.User // named by its verified client certificate; nil: none
	tc     *tls.Conn       // its TLS, handshake done
	rec    *tlsRecords     // under tc
}

// tlsState is the TLS configuration in force; a reload replaces it whole.
type tlsState struct {
	conf   *tls.Config // certificate, client CAs, version
	field  string      // tls.client_cert_user
	mutual bool        // tls.client_ca_file set: a client certificate naming a user is required
}

// tlsFront is the TLS listener and everything it runs.
type tlsFront struct {
	srv  *Server
	addr string // tls.listen as configured
	cur  atomic.Pointer[tlsState]

	ln     net.Listener
	ctx    context.Context // cancelled by shutdown: handshakes in progress end
	cancel context.CancelFunc
	wg     sync.WaitGroup // the accept loop and the handshakes

	slots chan struct{} // one per handshake in progress
	cpu   chan struct{} // one per handshake computing (handshakeConn)

	running     chan struct{} // closed once the event loops run (the first OnTick)
	runningOnce sync.Once
	stopping    chan struct{} // closed by stop

	mu      sync.Mutex
	closed  bool
	sources map[string]int        // handshakes in progress per source
	active  map[string][]*hsEntry // the same handshakes, oldest first, for eviction

	parked    map[string]*parkedSrc // connections waiting for their source's turn (tlspark.go)
	nParked   int
	parkTimer throttle.Timer         // sweepParked, while connections are parked
	outcomes  map[string]*hsOutcomes // each source's handshakes that completed and failed lately

	logFail    logSample // failed handshakes
	logRefused logSample // connections closed: their source at its handshake limit
	logEvicted logSample // handshakes ended to make room
	evicted    atomic.Uint64
	handshakes atomic.Uint64
	failures   atomic.Uint64
}

// newTLSFront loads the certificates of cfg's [tls]; nil when there is no
// TLS listener.
func newTLSFront(srv *Server, cfg *bucketcfg.Config) (*tlsFront, error) {
	if cfg.TLS.Listen == "" {
		return nil, nil
	}
	st, err := loadTLSState(&cfg.TLS)
	if err != nil {
		return nil, err
	}
	f := &tlsFront{
		srv:      srv,
		addr:     cfg.TLS.Listen,
		slots:    make(chan struct{}, tlsMaxHandshakes),
		cpu:      make(chan struct{}, handshakeCPUs()),
		running:  make(chan struct{}),
		stopping: make(chan struct{}),
		sources:  make(map[string]int),
		active:   make(map[string][]*hsEntry),
		parked:   make(map[string]*parkedSrc),
		outcomes: make(map[string]*hsOutcomes),
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
	f.cur.Store(st)
	return f, nil
}

// loadTLSState reads the files of t; errors name the key of the file at
// fault. Keys and passwords never appear in them.
func loadTLSState(t *bucketcfg.TLSConfig) (*tlsState, error) {
	cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls.cert_file %s / tls.key_file %s: %w", t.CertFile, t.KeyFile, err)
	}
	conf := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		// Memcached clients keep their connections: resumption would
		// save little, and tickets would cost every handshake (each
		// handshake's configuration is its own, so its ticket key too).
		SessionTicketsDisabled: true,
		// Records of 16 KiB from the first byte: the loop encrypts a
		// pass's responses in as few records as it can (small first
		// records help a browser render early, not a cache client).
		DynamicRecordSizingDisabled: true,
	}
	if t.MinVersion == bucketcfg.TLSVersion13 {
		conf.MinVersion = tls.VersionTLS13
	}
	st := &tlsState{conf: conf, field: t.ClientCertUser}
	if t.ClientCAFile != "" {
		pool, err := certpool.Load(t.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("tls.client_ca_file: %w", err)
		}
		conf.ClientCAs = pool
		conf.ClientAuth = tls.RequireAndVerifyClientCert
		st.mutual = true
	}
	return st, nil
}

// TLSAddr returns the address the TLS listener is bound to ("" when there
// is none, or before Serve has opened it).
func (s *Server) TLSAddr() string {
	f := s.tls
	if f == nil {
		return ""
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ln == nil {
		return ""
	}
	return f.ln.Addr().String()
}

// listen opens the listener and starts accepting once the engine has
// booted; from Serve. Nil-safe.
func (f *tlsFront) listen() error {
	if f == nil {
		return nil
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("tls.listen %s: %w", f.addr, err)
	}
	f.mu.Lock()
	f.ln = ln
	f.mu.Unlock()
	f.wg.Add(1)
	go f.acceptLoop()
	return nil
}

// loopsRunning tells the accept loop that the engine's event loops run:
// gnet calls OnBoot before it makes them, OnTick after. From OnTick.
// Nil-safe.
func (f *tlsFront) loopsRunning() {
	if f != nil {
		f.runningOnce.Do(func() { close(f.running) })
	}
}

// closeListener stops accepting and ends the handshakes in progress;
// established connections drain with the others. Nil-safe, idempotent.
func (f *tlsFront) closeListener() {
	if f == nil {
		return
	}
	f.cancel()
	f.mu.Lock()
	ln := f.ln
	f.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
}

// stop ends everything: the listener and the handshakes, and waits for
// their goroutines (established connections are the engine's, which has
// closed them). From Serve, once the engine has stopped. Nil-safe.
func (f *tlsFront) stop() {
	if f == nil {
		return
	}
	f.closeListener()
	f.mu.Lock()
	if !f.closed {
		close(f.stopping)
	}
	f.closed = true
	f.closeParked()
	f.mu.Unlock()
	f.wg.Wait()
}

func (f *tlsFront) acceptLoop() {
	defer f.wg.Done()
	select {
	case <-f.running: // Engine.Register needs the event loops
	case <-f.ctx.Done():
		return
	}
	var backoff time.Duration
	for {
		c, err := f.ln.Accept()
		if err != nil {
			if f.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: log, back off, go on.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			f.srv.log.Warn().Err(err).Dur("retry_in", backoff).Msg("tls: accept failed")
			waited, stop := f.srv.clockAfter(backoff)
			select {
			case <-waited:
			case <-f.ctx.Done():
				stop()
				return
			}
			continue
		}
		backoff = 0
		src := authSource(c.RemoteAddr().String())
		e, ok := f.takeSource(src, c)
		if !ok && f.park(c, src, f.srv.throttle.Now()) {
			continue // its turn comes when one of its source's handshakes ends
		}
		if !ok {
			_ = c.Close()
			f.logRefused.event(&f.srv.log, zerolog.WarnLevel).Str("source", src).Int("per_source_limit", tlsMaxHandshakesPerSource).
				Msg("tls: handshakes from one source at their limit; closing new connection")
			continue
		}
		if !f.takeSlot(e) {
			f.releaseSource(e)
			_ = c.Close()
			return
		}
		f.wg.Add(1)
		go f.handshake(c, e)
	}
}

// hsEntry is a handshake in progress, as its source's list holds it.
type hsEntry struct {
	src    string
	ctx    context.Context // ends the handshake: its timeout, shutdown, or eviction
	cancel context.CancelFunc
	start  time.Duration // when it took its slot (a reading of the engine's clock)
	hello  atomic.Bool   // the client has sent something (its hello, as a rule)
	// stepped is the engine clock's reading at its latest step (bytes
	// from the client read, or a turn of computing ended; 0: none): a
	// source whose handshakes step is not stalled (tlspark.go), however
	// long they queue for the cpu slots on a busy machine.
	stepped atomic.Int64
	evicted atomic.Bool // ended by the front to make room, not by the client
	conn    net.Conn    // the client's connection (nil in unit tests)
}

// spoke reports whether e's client has sent anything: its hello seen by
// the handshake, or bytes waiting on its socket (hasSpoken), which the
// handshake's goroutine may not have read yet on a busy machine. Under
// f.mu or not: it only reads the socket and sets hello.
func (e *hsEntry) spoke() bool {
	if e.hello.Load() {
		return true
	}
	if e.conn != nil && hasSpoken(e.conn) {
		e.hello.Store(true)
		return true
	}
	return false
}

// takeSlot takes one of the tlsMaxHandshakes slots for e's handshake.
// When all are taken, it makes room (evictOne, never e itself) and waits
// for the slot to be given back. False when the front is shutting down.
func (f *tlsFront) takeSlot(e *hsEntry) bool {
	for {
		select {
		case f.slots <- struct{}{}:
			return true
		default:
		}
		var wait <-chan struct{} // nobody to evict: a slot is on its way back
		stop := func() bool { return false }
		if f.evictOne(e) {
			// A victim about to finish on its own frees no slot of its
			// making: after a second, evict another.
			wait, stop = f.srv.clockAfter(time.Second)
		}
		select {
		case f.slots <- struct{}{}:
			stop()
			return true
		case <-wait:
		case <-f.ctx.Done():
			stop()
			return false
		}
	}
}

// evictOne ends one handshake of the source with the most in progress,
// other than self: the oldest whose client has not yet said hello (a
// silent connection), else the oldest. It reports whether it ended one.
// A source that opens connections and stays silent thus holds slots only
// until others need them; one that completes handshakes slowly from many
// addresses can still take slots from others, at most one per connection
// it opens.
func (f *tlsFront) evictOne(self *hsEntry) bool {
	f.mu.Lock()
	var victim *hsEntry
	most := 0
	for _, list := range f.active {
		n := len(list)
		if n > 0 && list[0].src == self.src {
			n-- // self does not count
		}
		if n <= most {
			continue
		}
		var first, silent *hsEntry
		for _, x := range list {
			if x == self {
				continue
			}
			if first == nil {
				first = x
			}
			if !x.spoke() {
				silent = x
				break
			}
		}
		if silent != nil {
			first = silent
		}
		most, victim = n, first
	}
	f.mu.Unlock()
	if victim == nil {
		return false
	}
	f.evicted.Add(1)
	f.logEvicted.event(&f.srv.log, zerolog.InfoLevel).Str("source", victim.src).Int("in_progress", most).
		Bool("said_hello", victim.hello.Load()).Msg("tls: handshake slots full; ending a handshake of the busiest source")
	victim.evicted.Store(true)
	victim.cancel()
	return true
}

// takeSource counts a handshake of src on c, false when src is at its
// limit; the entry's context ends at the handshake timeout.
func (f *tlsFront) takeSource(src string, c net.Conn) (*hsEntry, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sources[src] >= tlsMaxHandshakesPerSource {
		return nil, false
	}
	f.sources[src]++
	now := f.srv.throttle.Now()
	e := &hsEntry{src: src, start: now, conn: c}
	e.ctx, e.cancel = f.until(now + tlsHandshakeTimeout)
	f.active[src] = append(f.active[src], e)
	return e, true
}

// until returns a context of the front's that ends when the engine's
// clock reaches at (a handshake's deadline), and the function that ends it
// sooner.
func (f *tlsFront) until(at time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(f.ctx)
	t := f.srv.throttle.AtFunc(at, cancel)
	return ctx, func() { t.Stop(); cancel() }
}

// clockAfter returns a channel closed once the engine's clock has moved d
// past now, and the function that disarms it.
func (srv *Server) clockAfter(d time.Duration) (<-chan struct{}, func() bool) {
	ch := make(chan struct{})
	t := srv.throttle.AfterFunc(d, func() { close(ch) })
	return ch, t.Stop
}

// releaseSource forgets a handshake that has ended.
func (f *tlsFront) releaseSource(e *hsEntry) {
	e.cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releaseSourceLocked(e)
}

// releaseSourceLocked is releaseSource under f.mu.
func (f *tlsFront) releaseSourceLocked(e *hsEntry) {
	if f.sources[e.src] <= 1 {
		delete(f.sources, e.src)
	} else {
		f.sources[e.src]--
	}
	list := f.active[e.src]
	if i := slices.Index(list, e); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(f.active, e.src)
	} else {
		f.active[e.src] = list
	}
}

// tlsHandshake is one connection's handshake.
type tlsHandshake struct {
	f       *tlsFront
	e       *hsEntry
	st      *tlsState // the configuration in force when the client said hello
	user    *bucketcfg.User
	subject string // of the client certificate, when one was verified
}

// configForClient picks the configuration in force (a reload changes it
// for later handshakes only); with client certificates, a copy whose
// VerifyConnection checks that the certificate names a user.
func (h *tlsHandshake) configForClient(*tls.ClientHelloInfo) (*tls.Config, error) {
	h.e.hello.Store(true)
	if hook := testHookTLSHello.Load(); hook != nil {
		(*hook)()
	}
	h.st = h.f.cur.Load()
	if !h.st.mutual {
		return h.st.conf, nil
	}
	c := h.st.conf.Clone()
	c.VerifyConnection = h.verify
	return c, nil
}

// verify runs after the client's certificate chain has been verified: the
// certificate's tls.client_cert_user field must name a [[user]].
func (h *tlsHandshake) verify(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no client certificate") // not reached: RequireAndVerifyClientCert
	}
	cert := cs.PeerCertificates[0]
	h.subject = certSubject(cert)
	name, err := certUserName(cert, h.st.field)
	if err != nil {
		return err
	}
	u := h.f.srv.ten.Load().cfg.User(name)
	if u == nil {
		return fmt.Errorf("%w: %s %q is not a [[user]]", errNoCertUser, h.st.field, name)
	}
	h.user = u
	if hook := testHookTLSVerified.Load(); hook != nil {
		(*hook)()
	}
	return nil
}

// testHookTLSHello, when set (by tests), runs on the handshake's goroutine
// when the client's hello has arrived.
var testHookTLSHello atomic.Pointer[func()]

// testHookTLSVerified, when set (by tests), runs on the handshake's
// goroutine once a client certificate has been found to name a user.
var testHookTLSVerified atomic.Pointer[func()]

// handshake runs one connection's handshake and hands the connection to
// an event loop.
func (f *tlsFront) handshake(c net.Conn, e *hsEntry) {
	defer f.wg.Done()
	h := &tlsHandshake{f: f, e: e}
	hc := &handshakeConn{Conn: c, cpu: f.cpu, ctx: e.ctx, spoke: &e.hello,
		step: func() { e.stepped.Store(int64(f.srv.throttle.Now())) }}
	rec := &tlsRecords{raw: hc}
	tc := tls.Server(rec, &tls.Config{GetConfigForClient: h.configForClient})
	err := tc.HandshakeContext(e.ctx)
	hc.release()
	if nc, ne := f.handshakeEnded(e, handshakeResult(e, err, f.ctx), f.srv.throttle.Now()); ne != nil {
		f.wg.Add(1) // this handshake's slot and place pass to a parked connection
		go f.handshake(nc, ne)
	} else {
		<-f.slots
	}
	remote := c.RemoteAddr().String()
	if err != nil {
		_ = c.Close()
		f.handshakeFailed(h, remote, err)
		return
	}
	f.handshakes.Add(1)
	if f.srv.draining.Load() {
		_ = c.Close()
		return
	}
	// The loop takes the TCP connection (gnet enrolls a duplicate of its
	// descriptor and closes it) and tc, which from OnOpen on reads and
	// writes the loop's buffers instead (newTLSClientConn).
	cl := &tlsClient{remote: remote, user: h.user, tc: tc, rec: rec}
	ctx := gnet.NewContext(gnet.NewNetConnContext(context.Background(), c), cl)
	ch, err := f.srv.eng.Register(ctx)
	if err == nil {
		select {
		case res := <-ch:
			err = res.Err
		case <-f.stopping:
			// The engine stopped before its loop took the connection
			// (gnet may never answer then).
			err = errors.New("the proxy is stopping")
		}
	}
	if err != nil {
		_ = c.Close()
		if !f.srv.draining.Load() {
			f.srv.log.Warn().Err(err).Str("remote", remote).Msg("tls: cannot enroll the connection in an event loop; closing it")
		}
	}
}

// handshakeResult classifies the end of e's handshake, err its error: a
// failure counts against the source only when its client had spoken and
// the front did not end it (to make room, or at shutdown). A connection
// closed or timed out before it sent anything (a TCP health check, a
// port scan, a silent connection) is dropped, not failed.
func handshakeResult(e *hsEntry, err error, front context.Context) hsResult {
	switch {
	case err == nil:
		return hsCompleted
	case e.hello.Load() && !e.evicted.Load() && front.Err() == nil:
		return hsFailed
	default:
		return hsDropped
	}
}

// handshakeFailed logs a failed handshake (sampled: anyone can cause
// them), with the subject of the client's certificate when it presented
// one.
func (f *tlsFront) handshakeFailed(h *tlsHandshake, remote string, err error) {
	f.failures.Add(1)
	subject := h.subject
	var cve *tls.CertificateVerificationError
	if errors.As(err, &cve) && len(cve.UnverifiedCertificates) > 0 {
		subject = certSubject(cve.UnverifiedCertificates[0])
	}
	lvl := zerolog.InfoLevel
	if errors.Is(err, errNoCertUser) || errors.Is(err, errCertManyUsers) {
		lvl = zerolog.WarnLevel
	}
	ev := f.logFail.event(&f.srv.log, lvl).Err(err).Str("remote", remote)
	if subject != "" {
		ev = ev.Str("subject", subject)
	}
	ev.Msg("tls: handshake failed; connection closed")
}

// prepareReload loads the certificates of a reloaded file, which may not
// change tls.listen. Nothing changes until installReload. Nil-safe.
func (f *tlsFront) prepareReload(cfg *bucketcfg.Config) (*tlsState, error) {
	addr := ""
	if f != nil {
		addr = f.addr
	}
	if cfg.TLS.Listen != addr {
		return nil, errors.New("tls.listen changed; it takes effect only at a restart")
	}
	if f == nil {
		return nil, nil
	}
	return loadTLSState(&cfg.TLS)
}

// installReload puts st in force for the handshakes that start from now
// on; open connections keep what they negotiated. Nil-safe.
func (f *tlsFront) installReload(st *tlsState) {
	if f == nil || st == nil {
		return
	}
	f.cur.Store(st)
	f.srv.log.Info().Str("listen", f.addr).Msg("tls: certificates reloaded")
}

// openTLS prepares the session of a connection that came over TLS, c: its
// records are read and written on the loop from now on, and its
// certificate's user, if any, is logged in from the first byte with the
// bucket selected as after SASL. On the loop, from OnOpen, before the
// session's limits are set.
func (s *session) openTLS(c gnet.Conn, cl *tlsClient, ten *tenants) {
	s.remote = cl.remote
	s.overTLS = true
	s.tls = newTLSClientConn(c, cl.tc, cl.rec, &s.lp.tlsBuf)
	s.c = s.tls
	if cl.user != nil {
		s.tlsUser = cl.user
		s.login(ten, cl.user)
	}
}

// certLogin logs the session back in as its client certificate's user,
// after a refused SASL AUTH logged it out: the certificate still says who
// the client is. It reports whether it did (false: no certificate user,
// or the user is no longer configured). On the loop.
func (s *session) certLogin(ten *tenants) bool {
	if s.tlsUser == nil {
		return false
	}
	u := ten.cfg.User(s.tlsUser.Name)
	if u == nil {
		return false
	}
	s.tlsUser = u
	s.login(ten, u)
	return true
}

// onTLSTraffic decrypts what a TLS client sent and runs the session on
// the plaintext; what the session leaves buffered moves off the loop's
// scratch buffer. A TLS error (a record that does not decrypt, an alert)
// closes the connection at once: the TLS layer has sent its alert and can
// encrypt nothing more, so commands before the bad record are not run
// (their answers could not be sent). After the client's close_notify the
// plaintext before it is dispatched, then the connection closes, as a
// plaintext connection closes when its client does. On the loop, from
// OnTraffic.
func (s *session) onTLSTraffic() gnet.Action {
	err := s.tls.fill()
	if s.closed { // writing an alert or key update failed: gnet closed it
		s.tls.keep()
		return gnet.None
	}
	if err != nil && !errors.Is(err, io.EOF) {
		s.tls.keep()
		s.lp.srv.log.Debug().Err(err).Str("remote", s.remote).Msg("tls: bad input from the client; closing connection")
		return gnet.Close
	}
	act := gnet.None
	if s.c.InboundBuffered() > 0 {
		act = s.onTraffic()
	}
	s.tls.keep()
	if err != nil {
		return gnet.Close
	}
	return act
}

// tlsKick runs the session on what the handshake left buffered, once
// enrolled. On the loop.
func (s *session) tlsKick(context.Context) error {
	if !s.closed && s.onTLSTraffic() == gnet.Close {
		_ = s.c.Close()
	}
	return nil
}
