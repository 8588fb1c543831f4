package ctl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
)

// Mech is the SASL mechanism ctl authenticates with (Options.Mech).
type Mech string

// The SASL mechanisms, as the --sasl-mech flag spells them.
const (
	// MechAuto (the default; "" means it too) lets the proxy's list of
	// mechanisms (SASL list mechanisms, 0x20) decide. Over TLS or to a
	// loopback address it is PLAIN when the proxy offers it (it does
	// there unless proxy.plain_auth = "tls-only"), which every user with a
	// password_hash can use, as before SCRAM existed; otherwise the
	// strongest SCRAM the proxy offers, SCRAM-SHA512 before SCRAM-SHA256.
	// It never sends PLAIN in clear to another host: a proxy offering
	// only PLAIN there is an error (a man in the middle could have struck
	// SCRAM off the list). It tries one mechanism only: a refusal is
	// reported, not retried with another.
	MechAuto Mech = "auto"
	// MechPlain is SASL PLAIN: the password itself goes to the proxy, in
	// clear unless over TLS. Used only when the proxy lists it; otherwise
	// the password is not sent.
	MechPlain Mech = "plain"
	// MechSCRAMSHA256 is SASL SCRAM-SHA256: the password never crosses the
	// wire, and the proxy proves it holds the user's credential. The user
	// needs a scram_sha256 credential.
	MechSCRAMSHA256 Mech = "scram-sha256"
	// MechSCRAMSHA512 is SASL SCRAM-SHA512, as MechSCRAMSHA256 with
	// SHA-512; the user needs a scram_sha512 credential.
	MechSCRAMSHA512 Mech = "scram-sha512"
)

// Mechs lists the valid values of Options.Mech, MechAuto first.
var Mechs = []Mech{MechAuto, MechPlain, MechSCRAMSHA256, MechSCRAMSHA512}

// ParseMech returns the Mech named s (case-insensitive; "" is MechAuto),
// or an error listing the valid names.
func ParseMech(s string) (Mech, error) {
	if s == "" {
		return MechAuto, nil
	}
	m := Mech(strings.ToLower(s))
	if !slices.Contains(Mechs, m) {
		names := make([]string, len(Mechs))
		for i, v := range Mechs {
			names[i] = string(v)
		}
		return "", fmt.Errorf("unknown SASL mechanism %q: want one of %s", s, strings.Join(names, ", "))
	}
	return m, nil
}

// wire is the mechanism's name on the memcached binary protocol.
func (m Mech) wire() string {
	switch m {
	case MechPlain:
		return mcclient.MechPlain
	case MechSCRAMSHA256:
		return mcclient.MechSCRAMSHA256
	case MechSCRAMSHA512:
		return mcclient.MechSCRAMSHA512
	}
	return ""
}

// dialTimeout bounds the TCP connect and, separately, the TLS handshake.
const dialTimeout = 5 * time.Second

// useTLS reports whether to connect with TLS: Options.TLS, or any TLS
// setting given.
func (o Options) useTLS() bool {
	return o.TLS || o.CAFile != "" || o.CertFile != "" || o.KeyFile != "" || o.ServerName != ""
}

// hasCert reports whether a client certificate is configured.
func (o Options) hasCert() bool { return o.CertFile != "" }

// configError is a local setting that cannot be used (a file that cannot
// be read, a certificate without its key); its text is the operator's
// message.
type configError struct{ err error }

func (e *configError) Error() string { return e.err.Error() }
func (e *configError) Unwrap() error { return e.err }

// handshakeError is a TLS handshake that failed.
type handshakeError struct{ err error }

func (e *handshakeError) Error() string { return e.err.Error() }
func (e *handshakeError) Unwrap() error { return e.err }

// authError is a failed SASL authentication with mechanism mech (the wire
// name; "" before one was chosen).
type authError struct {
	mech string
	auto bool // MechAuto chose mech
	err  error
}

func (e *authError) Error() string { return e.err.Error() }
func (e *authError) Unwrap() error { return e.err }

// tlsConfig builds the client TLS configuration: the server verified
// against CAFile (default: the system's roots) for ServerName (default:
// the host of Addr, a name or an IP address), the client certificate
// when given, TLS 1.2 at least.
func (o Options) tlsConfig() (*tls.Config, error) {
	conf := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName}
	if conf.ServerName == "" {
		host, _, err := net.SplitHostPort(o.Addr)
		if err != nil {
			return nil, &configError{fmt.Errorf("--addr %s: %w", o.Addr, err)}
		}
		conf.ServerName = host
	}
	if o.CAFile != "" {
		b, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, &configError{fmt.Errorf("cannot read the CA file: %w", err)}
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(b) {
			return nil, &configError{fmt.Errorf("the CA file %s holds no PEM certificate", o.CAFile)}
		}
		conf.RootCAs = pool
	}
	switch {
	case o.CertFile != "" && o.KeyFile != "":
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, &configError{fmt.Errorf("cannot load the client certificate %s with key %s: %w", o.CertFile, o.KeyFile, err)}
		}
		conf.Certificates = []tls.Certificate{cert}
	case o.CertFile != "":
		return nil, &configError{errors.New("a client certificate needs its key: give --key FILE")}
	case o.KeyFile != "":
		return nil, &configError{errors.New("a client key needs its certificate: give --cert FILE")}
	}
	return conf, nil
}

// dial connects to Addr, over TLS when useTLS says so (handshake done).
func (o Options) dial() (net.Conn, error) {
	var conf *tls.Config
	if o.useTLS() {
		var err error
		if conf, err = o.tlsConfig(); err != nil {
			return nil, err
		}
	}
	d := o.dialer
	if d == nil {
		d = &net.Dialer{Timeout: dialTimeout}
	}
	raw, err := d.Dial("tcp", o.Addr)
	if err != nil {
		return nil, &dialError{err}
	}
	if conf == nil {
		return &plainConn{Conn: raw}, nil
	}
	tc := tls.Client(raw, conf)
	ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, &handshakeError{err}
	}
	return tc, nil
}

// connect dials the proxy and authenticates when a user is given. A
// client certificate alone needs no SASL: the proxy knows its user from
// the handshake.
func (o Options) connect() (*mcclient.Client, error) {
	conn, err := o.dial()
	if err != nil {
		return nil, err
	}
	c := mcclient.New(conn)
	c.Timeout = o.timeout()
	if o.User != "" {
		if err := o.authenticate(c); err != nil {
			c.Close()
			return nil, noAnswer(conn, err)
		}
	}
	return c, nil
}

// plainConn is a plaintext connection to the proxy that keeps the first
// bytes the server sent on it (see noAnswer). Its Reads must not run
// concurrently with each other or with noAnswer (mcclient reads from one
// goroutine at a time).
type plainConn struct {
	net.Conn
	head  [3]byte // the first bytes received
	nhead int     // how many of head are set
	any   bool    // a byte arrived
}

// Read is net.Conn's Read, keeping the first bytes that arrive.
func (c *plainConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.any = true
		c.nhead += copy(c.head[c.nhead:], p[:n])
	}
	return n, err
}

// tlsRecord reports whether the server's first bytes are a TLS record
// header (an alert or a handshake, TLS 1.0 to 1.3 framing): a TLS server
// answering, typically with a protocol_version alert, the memcached
// request it could not parse.
func (c *plainConn) tlsRecord() bool {
	return c.nhead == len(c.head) && (c.head[0] == 0x15 || c.head[0] == 0x16) && c.head[1] == 0x03 && c.head[2] <= 0x04
}

// noAnswerError is a plaintext connection on which no memcached answer
// came: the server answered in TLS (tls), or closed or reset the
// connection before it sent a byte. The former is what the proxy's [tls]
// listener does with a client that does not speak TLS; the latter what
// another TLS server may do, and, rarely, a plaintext listener (e.g. to an
// unauthenticated connection pushed out by newer ones).
type noAnswerError struct {
	tls   bool // the server answered with a TLS record
	reset bool // reset (ECONNRESET, EPIPE) rather than closed (EOF)
	err   error
}

func (e *noAnswerError) Error() string { return e.err.Error() }
func (e *noAnswerError) Unwrap() error { return e.err }

// noAnswer returns err, a failure on conn (a connection from dial), as a
// *noAnswerError when conn is plaintext and either the server's first
// bytes on it were TLS, or it sent none and err is the server closing or
// resetting the connection; otherwise it returns err itself.
func noAnswer(conn net.Conn, err error) error {
	pc, ok := conn.(*plainConn)
	switch {
	case err == nil || !ok:
		return err
	case pc.tlsRecord():
		return &noAnswerError{tls: true, err: err}
	case pc.any:
		return err
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return &noAnswerError{err: err}
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return &noAnswerError{reset: true, err: err}
	}
	return err
}

// authenticate runs SASL as o.User with the mechanism o.Mech chooses (see
// MechAuto). Errors are *authError.
func (o Options) authenticate(c *mcclient.Client) error {
	offered, err := c.SASLMechs()
	if err != nil {
		return &authError{err: err}
	}
	mech, err := o.chooseMech(offered, o.useTLS() || loopbackPeer(c.Conn()))
	if err != nil {
		return &authError{err: err}
	}
	if mech == mcclient.MechPlain {
		err = c.AuthPlainNoList(o.User, o.Password)
	} else {
		err = c.AuthSCRAM(mech, o.User, o.Password)
	}
	if err != nil {
		return &authError{mech: mech, auto: o.Mech == MechAuto || o.Mech == "", err: err}
	}
	return nil
}

// errMech is a mechanism that cannot be used with this proxy on this
// connection; the password was not sent.
var errMech = errors.New("no usable SASL mechanism")

// chooseMech picks the wire name of the mechanism to use among offered
// (the proxy's list); protected says the connection is TLS or stays on
// this host. Errors wrap errMech.
func (o Options) chooseMech(offered []string, protected bool) (string, error) {
	has := func(m string) bool { return slices.Contains(offered, m) }
	list := strings.Join(offered, " ")
	switch m := o.Mech; m {
	case MechPlain:
		if !has(mcclient.MechPlain) {
			return "", fmt.Errorf("%w: the proxy does not allow SASL PLAIN on this connection (it offers %q; use --tls, or SCRAM with --sasl-mech); the password was not sent", errMech, list)
		}
		return mcclient.MechPlain, nil
	case MechSCRAMSHA256, MechSCRAMSHA512:
		if !has(m.wire()) {
			return "", fmt.Errorf("%w: the proxy does not offer %s (it offers %q)", errMech, m.wire(), list)
		}
		return m.wire(), nil
	case MechAuto, "":
	default:
		return "", fmt.Errorf("%w: unknown mechanism %q", errMech, string(m))
	}
	switch {
	case protected && has(mcclient.MechPlain):
		return mcclient.MechPlain, nil
	case has(mcclient.MechSCRAMSHA512):
		return mcclient.MechSCRAMSHA512, nil
	case has(mcclient.MechSCRAMSHA256):
		return mcclient.MechSCRAMSHA256, nil
	case has(mcclient.MechPlain):
		return "", fmt.Errorf("%w: the proxy offers only SASL PLAIN, which would send the password in clear over the network; use --tls (or --sasl-mech plain to send it anyway)", errMech)
	}
	return "", fmt.Errorf("%w: the proxy offers none of SCRAM-SHA512, SCRAM-SHA256, PLAIN (it offers %q)", errMech, list)
}

// loopbackPeer reports whether conn's peer is a loopback address: then a
// password sent in clear does not leave this host.
func loopbackPeer(conn net.Conn) bool {
	a, ok := conn.RemoteAddr().(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
}
