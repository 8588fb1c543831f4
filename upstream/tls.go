package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/certpool"
	"github.com/kvthrottle/kvthrottle/internal/connbridge"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// TLS to memcached (memcached -Z; DESIGN.md section 11, [upstream.tls]).
// gnet has no TLS: a connection's dial goroutine connects, runs the
// handshake within the connect timeout, and bridges the *tls.Conn
// (internal/connbridge) to a unix socketpair whose loop side it enrolls in
// the event loop instead of the TCP socket. From there on the Conn works
// as over plain TCP. The bridges belong to the Pool's dialer: each ends
// when its Conn goes down or is closed (down closes it), when its loop
// side closes (gnet closes every connection when the engine stops), and at
// the latest at Pool.Close, which closes those left and waits for them.
// The health prober handshakes the same way and talks over the *tls.Conn
// directly.

// TLSFiles names the files and server name of an upstream TLS client
// configuration (the [upstream.tls] table, bucketcfg.UpstreamTLSConfig).
type TLSFiles struct {
	// CAFile holds the PEM certificates of the CAs the servers'
	// certificates must chain to; "" means the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate chain and its key,
	// PEM, for servers that require one; both or neither.
	CertFile, KeyFile string
	// ServerName is the name every server's certificate must carry; ""
	// means the host part of each server's address.
	ServerName string
}

// LoadTLSConfig reads f's files and returns the client configuration for
// PoolOptions.TLS and Pool.SetTLSConfig: TLS 1.2 or later, servers
// verified against f.CAFile (or the system's roots) and f.ServerName,
// f's client certificate presented when a server asks for one. Its errors
// name the configuration key of the file at fault ("upstream.tls.ca_file"
// and so on) and the file, never what a key file holds. Safe from any
// goroutine; it does file I/O.
func LoadTLSConfig(f TLSFiles) (*tls.Config, error) {
	// No ClientSessionCache: connections to memcached live long, and
	// memcached 1.6 (OpenSSL without a session id context) answers a
	// resumption attempt with an internal_error alert when it verifies
	// client certificates (ssl_verify_mode 2).
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.ServerName}
	if f.CAFile != "" {
		pool, err := certpool.Load(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("upstream.tls.ca_file: %w", err)
		}
		conf.RootCAs = pool
	}
	if f.CertFile != "" || f.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("upstream.tls.cert_file %s / upstream.tls.key_file %s: %w", f.CertFile, f.KeyFile, err)
		}
		conf.Certificates = []tls.Certificate{cert}
	}
	return conf, nil
}

// errPoolClosed: a TLS connection was to be made after Pool.Close.
var errPoolClosed = errors.New("upstream pool closed")

// dialer opens a Pool's connections to its servers: plain TCP, or TLS
// when the Pool has a TLS configuration. A nil *dialer dials plain TCP
// (Conns made with New outside a Pool). Safe for concurrent use.
type dialer struct {
	conf atomic.Pointer[tls.Config] // nil: plaintext; fixed as nil or not for the Pool's life

	ctx    context.Context // cancelled by close: handshakes in progress end
	cancel context.CancelFunc

	mu      sync.Mutex
	closed  bool
	bridges map[*trackedBridge]struct{}
	wg      sync.WaitGroup // TLS dials in progress, and bridges
}

// trackedBridge is an open bridge of the dialer; b is nil while it is
// being made.
type trackedBridge struct{ b *connbridge.Bridge }

func newDialer(conf *tls.Config) *dialer {
	d := &dialer{bridges: make(map[*trackedBridge]struct{})}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	if conf != nil {
		d.conf.Store(conf)
	}
	return d
}

// done is closed when the Pool is closed (nil for a nil dialer: never).
func (d *dialer) done() <-chan struct{} {
	if d == nil {
		return nil
	}
	return d.ctx.Done()
}

// tlsOn reports whether the dialer makes TLS connections.
func (d *dialer) tlsOn() bool { return d != nil && d.conf.Load() != nil }

// clientConfig returns the configuration for a handshake with addr: the
// one in force, with addr's host as its server name when it names none.
func clientConfig(conf *tls.Config, addr string) *tls.Config {
	if conf.ServerName != "" {
		return conf
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	c := conf.Clone()
	c.ServerName = host
	return c
}

// dial connects to addr within timeout. Plain: the TCP connection, to
// enroll in a loop; b is nil. TLS: it also runs the handshake (within the
// same timeout; meta: for a text connection, see handshake) and returns
// the loop side of a new bridge, b, which the dialer tracks until it ends.
// A handshake error says "tls handshake". From a Conn's dial goroutine.
func (d *dialer) dial(addr string, timeout time.Duration, meta bool) (nc net.Conn, b *connbridge.Bridge, err error) {
	if !d.tlsOn() {
		nc, err = net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return nil, nil, err
		}
		noDelay(nc)
		return nc, nil, nil
	}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, nil, errPoolClosed
	}
	d.wg.Add(1)
	d.mu.Unlock()
	defer d.wg.Done()
	ctx, cancel := context.WithTimeout(d.ctx, timeout)
	defer cancel()
	tc, err := d.handshake(ctx, addr, meta)
	if err != nil {
		return nil, nil, err
	}
	b, err = d.bridge(tc)
	if err != nil {
		_ = tc.NetConn().Close()
		return nil, nil, err
	}
	return b.Loop(), b, nil
}

// handshake connects to addr and runs the TLS handshake, both bounded by
// ctx. meta says which protocol the connection will speak (text for a
// meta sibling, else binary).
//
// Under TLS 1.3 a server verifies the client's certificate only after
// the client has finished its side of the handshake, and refuses it with
// an alert the client reads with the first response. When the server
// asked for a certificate, handshake therefore waits for the answer to a
// no-op (NOOP, or mn for text) so that a refusal is reported as the
// handshake's failure, with the server's reason, instead of as a
// connection lost after it came up.
func (d *dialer) handshake(ctx context.Context, addr string, meta bool) (*tls.Conn, error) {
	var nd net.Dialer
	raw, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	noDelay(raw)
	base := d.conf.Load()
	conf := clientConfig(base, addr)
	if conf == base {
		conf = conf.Clone() // GetClientCertificate is this handshake's
	}
	asked := false
	certs := conf.Certificates
	conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		asked = true
		if len(certs) > 0 {
			return &certs[0], nil
		}
		return &tls.Certificate{}, nil // none: the server decides
	}
	tc := tls.Client(raw, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	if asked && tc.ConnectionState().Version == tls.VersionTLS13 {
		if err := acceptedRoundTrip(ctx, tc, meta); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("tls handshake: server refused the connection: %w", err)
		}
	}
	return tc, nil
}

// acceptedRoundTrip sends a no-op on tc and reads its answer by ctx's
// deadline, leaving the connection as it was.
func acceptedRoundTrip(ctx context.Context, tc *tls.Conn, meta bool) error {
	req, respLen := noopRequest, binary.HeaderLen
	if meta {
		req, respLen = metaFence, len("MN\r\n")
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = tc.SetDeadline(dl)
	}
	defer tc.SetDeadline(time.Time{})
	_, werr := tc.Write(req)
	// Read even when the write failed: the server's alert, which says
	// why, may have arrived before its reset.
	var resp [binary.HeaderLen]byte
	_, err := io.ReadFull(tc, resp[:respLen])
	if werr != nil {
		var oe *net.OpError // crypto/tls reports a received alert as one
		if errors.As(err, &oe) && oe.Op == "remote error" {
			return err
		}
		return werr
	}
	return err
}

// noopRequest is the binary NOOP of acceptedRoundTrip.
var noopRequest = binary.AppendFrame(nil, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpNoop}, nil, nil, nil, nil)

// bridge makes and tracks the bridge of an established TLS connection.
func (d *dialer) bridge(tc *tls.Conn) (*connbridge.Bridge, error) {
	t := &trackedBridge{}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil, errPoolClosed
	}
	d.bridges[t] = struct{}{}
	d.wg.Add(1)
	d.mu.Unlock()
	b, err := connbridge.New(tc, connbridge.Options{OnDone: func() { d.untrack(t) }})
	if err != nil {
		d.untrack(t)
		return nil, err
	}
	d.mu.Lock()
	t.b = b
	closed := d.closed
	d.mu.Unlock()
	if closed { // close began meanwhile, and could not see b
		b.Loop().Close()
		b.Close()
		return nil, errPoolClosed
	}
	return b, nil
}

// untrack forgets a bridge that has ended, or was never made.
func (d *dialer) untrack(t *trackedBridge) {
	d.mu.Lock()
	delete(d.bridges, t)
	d.mu.Unlock()
	d.wg.Done()
}

// probeConn connects to addr for a health probe by deadline: over TLS,
// with the handshake done, when the dialer makes TLS connections. The
// caller closes it.
func (d *dialer) probeConn(addr string, deadline time.Time) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Until(deadline))
	if err != nil || !d.tlsOn() {
		return c, err
	}
	tc := tls.Client(c, clientConfig(d.conf.Load(), addr))
	_ = tc.SetDeadline(deadline)
	if err := tc.Handshake(); err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("tls handshake: %w", err)
	}
	return tc, nil
}

// close ends the handshakes in progress and the bridges still open, and
// waits for them; later TLS dials fail. Plain dials are not affected.
// Safe to call twice.
func (d *dialer) close() {
	d.mu.Lock()
	d.closed = true
	open := make([]*connbridge.Bridge, 0, len(d.bridges))
	for t := range d.bridges {
		if t.b != nil {
			open = append(open, t.b)
		}
	}
	d.mu.Unlock()
	d.cancel()
	for _, b := range open {
		b.Close()
	}
	d.wg.Wait()
}

// openBridges returns how many bridges are open (for the tests).
func (d *dialer) openBridges() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.bridges)
}

func noDelay(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
}
