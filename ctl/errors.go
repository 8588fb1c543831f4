package ctl

import (
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
	var de *dialError
	var se *mcclient.StatusError
	var ne net.Error
	switch {
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
	return err.Error()
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
