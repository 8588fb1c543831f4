package ctl

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// request names the operation an error is described for.
type request struct {
	cmd    string // "set-node", "set-bucket", "stats" or "top"
	arg    string // the bucket of set-bucket, the group of stats
	hasArg bool
}

// opError is an error as the operator sees it: msg is the one line shown,
// err the cause.
type opError struct {
	msg string
	err error
}

func (e *opError) Error() string { return e.msg }
func (e *opError) Unwrap() error { return e.err }

// dialError marks a failure to connect (as opposed to a lost connection).
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// describe wraps err, the failure of req, in an error whose text is the
// one-line message shown to the operator.
func (o Options) describe(req request, err error) error {
	return &opError{msg: o.message(req, err), err: err}
}

// message turns an error of a request into the one-line message shown to
// the operator.
func (o Options) message(req request, err error) string {
	var ce *configError
	var he *handshakeError
	var ae *authError
	switch {
	case errors.As(err, &ce):
		return sanitize(ce.Error())
	case errors.As(err, &he):
		return o.handshakeMessage(he.err)
	case errors.As(err, &ae):
		if msg, ok := o.authMessage(ae); ok {
			return msg
		}
	}
	return o.generalMessage(req, err)
}

// generalMessage is message for the errors of any step: the network's,
// the server's statuses.
func (o Options) generalMessage(req request, err error) string {
	var de *dialError
	var se *mcclient.StatusError
	var ne net.Error
	var oe *net.OpError
	var na *noAnswerError
	switch {
	case errors.As(err, &oe) && oe.Op == "remote error":
		return o.tlsRefusedMessage(oe.Err)
	case errors.As(err, &na) && na.tls:
		return fmt.Sprintf("%s answered in TLS (is it the proxy's [tls] listen address?): add --tls", o.Addr)
	case errors.As(err, &na):
		verb := "closed"
		if na.reset {
			verb = "reset"
		}
		return fmt.Sprintf("%s %s the connection before answering (if that is the proxy's [tls] listen address, add --tls)", o.Addr, verb)
	case errors.As(err, &de):
		return fmt.Sprintf("cannot connect to %s: %s", o.Addr, netCause(de.err))
	case errors.As(err, &se):
		return o.statusMessage(req, se)
	case errors.Is(err, mcclient.ErrNoPlainMech):
		return fmt.Sprintf("cannot authenticate user %s: %v", o.User, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Sprintf("%s closed the connection", o.Addr)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no answer from %s within %s", o.Addr, o.timeout())
	case errors.As(err, &ne):
		return fmt.Sprintf("connection to %s failed: %s", o.Addr, netCause(err))
	}
	return sanitize(err.Error())
}

// authMessage explains a failed SASL authentication, when there is more
// to say than for any other request.
func (o Options) authMessage(ae *authError) (string, bool) {
	var se *mcclient.StatusError
	switch {
	case errors.Is(ae.err, errMech):
		return "cannot authenticate user " + o.User + ": " + sanitize(strings.TrimPrefix(ae.err.Error(), errMech.Error()+": ")), true
	case errors.Is(ae.err, mcclient.ErrServerSignature):
		return fmt.Sprintf("the server at %s did not prove that it holds the %s credential of user %s: it may not be your proxy (nothing was sent after the login)", o.Addr, ae.mech, o.User), true
	case errors.Is(ae.err, mcclient.ErrSCRAMServer):
		return "cannot authenticate user " + o.User + ": " + sanitize(ae.err.Error()), true
	case !errors.As(ae.err, &se) || se.Status != mc.StatusAuthError:
		return "", false
	case ae.mech == mcclient.MechSCRAMSHA256 || ae.mech == mcclient.MechSCRAMSHA512:
		key := "scram_sha256"
		if ae.mech == mcclient.MechSCRAMSHA512 {
			key = "scram_sha512"
		}
		msg := fmt.Sprintf("authentication failed for user %s with %s: a wrong password, or the user has no %s credential (kvthrottle hash-password makes one", o.User, ae.mech, key)
		if ae.auto && !o.useTLS() {
			// PLAIN was not offered here, or not safe to use.
			msg += "; a user with only a password_hash needs SASL PLAIN, over --tls"
		}
		return msg + ")", true
	}
	// PLAIN: the server's reason, when it says more than "failed" (e.g.
	// that proxy.plain_auth forbids PLAIN here).
	msg := "authentication failed for user " + o.User
	reason := sanitize(strings.TrimSpace(se.Reason))
	if lr := strings.ToLower(reason); reason != "" && lr != "authentication failed" && lr != "auth failure" {
		msg += ": " + reason
	}
	return msg, true
}

// handshakeMessage explains a failed TLS handshake.
func (o Options) handshakeMessage(err error) string {
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	var cv *tls.CertificateVerificationError
	var rh tls.RecordHeaderError
	var oe *net.OpError
	var ne net.Error
	cause := sanitize(err.Error())
	switch {
	case errors.As(err, &ua):
		where := "give the CA that signed it with --ca FILE"
		if o.CAFile != "" {
			where = "no CA in " + o.CAFile + " signed it"
		}
		return fmt.Sprintf("the proxy's certificate at %s is not trusted: %s (%s)", o.Addr, sanitize(ua.Error()), where)
	case errors.As(err, &hn):
		return fmt.Sprintf("the proxy's certificate at %s does not match: %s (give the name it carries with --server-name NAME)", o.Addr, sanitize(hn.Error()))
	case errors.As(err, &ci):
		return fmt.Sprintf("the proxy's certificate at %s is not valid: %s", o.Addr, sanitize(ci.Error()))
	case errors.As(err, &cv):
		return fmt.Sprintf("the proxy's certificate at %s cannot be verified: %s", o.Addr, cause)
	case errors.As(err, &rh):
		return fmt.Sprintf("TLS handshake with %s failed: the server does not speak TLS there (is it the proxy's [tls] listen address?)", o.Addr)
	case errors.As(err, &oe) && oe.Op == "remote error":
		return o.tlsRefusedMessage(oe.Err)
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("TLS handshake with %s: no answer within %s", o.Addr, dialTimeout)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Sprintf("TLS handshake with %s failed: the server closed the connection", o.Addr)
	}
	return fmt.Sprintf("TLS handshake with %s failed: %s", o.Addr, cause)
}

// tlsRefusedMessage explains a TLS alert from the proxy (alert is the
// error it came as): during the handshake, or with TLS 1.3 at the first
// request, when the proxy refuses the client certificate.
func (o Options) tlsRefusedMessage(alert error) string {
	msg := fmt.Sprintf("the proxy at %s refused the TLS connection: %s", o.Addr, sanitize(alert.Error()))
	if o.hasCert() {
		return msg + " (its log says why: the client certificate must be signed by its tls.client_ca_file and name a [[user]])"
	}
	return msg + " (it may require a client certificate: give --cert FILE and --key FILE)"
}

// statusMessage explains a failure status of the server.
func (o Options) statusMessage(req request, se *mcclient.StatusError) string {
	reason := sanitize(strings.TrimSpace(se.Reason))
	withReason := func(msg string) string {
		if reason == "" {
			return msg
		}
		return msg + ": " + reason
	}
	isSet := req.cmd == "set-node" || req.cmd == "set-bucket"
	switch se.Status {
	case mc.StatusAuthError:
		if o.User == "" {
			return "authentication required: give --user U (password from --password-file or " + PasswordEnv + ")"
		}
		return "authentication failed for user " + o.User
	case mc.StatusEaccess:
		switch {
		case isSet && o.User != "":
			return "permission denied: user " + o.User + " lacks the admin privilege"
		case isSet && o.hasCert():
			return "permission denied: the user of the client certificate lacks the admin privilege"
		case isSet:
			return "permission denied: " + req.cmd + " needs a user with the admin privilege (give --user U)"
		}
		return withReason("access denied")
	case mc.StatusEinval:
		if reason == "" {
			return "invalid request (the server gave no reason)"
		}
		return "invalid request: " + reason
	case mc.StatusKeyEnoent:
		switch {
		case req.cmd == "set-bucket":
			return "unknown bucket " + req.arg
		case se.Op == mc.OpStat && req.hasArg:
			return "unknown stats group " + req.arg
		}
		return withReason("not found")
	case mc.StatusEtmpfail:
		if reason == "" {
			reason = "no reason given"
		}
		return "proxy temporarily unavailable: " + reason
	case mc.StatusUnknownCommand:
		return "the server does not support this command (is it a kvthrottle proxy?)"
	case mc.StatusNotSupported:
		return withReason("the server does not support this request")
	}
	return withReason(fmt.Sprintf("%s failed with status %s (0x%02x)", se.Op, se.Status, uint16(se.Status)))
}

// netCause returns the innermost useful text of a network error, without
// the "dial tcp ADDR:" prefixes the message already carries.
func netCause(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err.Error()
	}
	return err.Error()
}
