// Package ctl is the admin client of a running kvthrottle proxy, the work
// behind `kvthrottle ctl`: set the node's and a bucket's throttle
// properties (opcodes 0x2c and 0x2a), print a STAT group, and the live
// `top` view. cmd/kvthrottle parses the command line and calls it.
//
// Every operation dials the proxy (over TLS when the Options say so, the
// proxy's certificate verified, a client certificate presented when
// given), authenticates with SASL (PLAIN, SCRAM-SHA256 or SCRAM-SHA512:
// see Mech) when Options.User is set, and writes its result for a person
// to the writer it is given. An operation that fails returns an error whose text is one line
// meant for the operator (what failed and why, e.g. "cannot connect to
// ADDR: connection refused" or "permission denied: user U lacks the admin
// privilege"), with the cause reachable through errors.As and errors.Is.
// Neither the output nor an error ever contains the password, and text that
// comes from the server has its control characters replaced, so that it
// cannot drive the terminal.
package ctl

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
)

// PasswordEnv is the environment variable ReadPassword falls back on when
// no password file is given.
const PasswordEnv = "KVTHROTTLE_PASSWORD"

// DefaultTimeout is the bound on each request when Options.Timeout is 0.
const DefaultTimeout = 5 * time.Second

// Options say which proxy to talk to, how, and as whom.
type Options struct {
	// Addr is the proxy's HOST:PORT (its [tls] listen address with TLS).
	Addr string
	// User authenticates with SASL, the mechanism as Mech says; "" sends
	// no SASL (the user of the client certificate, else the proxy's
	// default bucket, if it has one, then applies).
	User string
	// Password is User's password. It is used only in the SASL exchange
	// (with SCRAM it never leaves this process) and never written
	// anywhere.
	Password string
	// Mech is the SASL mechanism; "" is MechAuto (see there).
	Mech Mech
	// Timeout bounds each request, the SASL exchange included (dialing and
	// the TLS handshake have bounds of their own, 5 s each); 0 means
	// DefaultTimeout.
	Timeout time.Duration

	// TLS connects over TLS (to the proxy's [tls] listener), the proxy's
	// certificate verified; any of the settings below implies it.
	TLS bool
	// CAFile is a PEM file of the certificates that may sign the proxy's
	// certificate; "" means the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate and its key (PEM),
	// for a proxy with tls.client_ca_file: the user the certificate names
	// is logged in by the handshake, so User and Password are not needed.
	CertFile, KeyFile string
	// ServerName is the name the proxy's certificate must carry; "" means
	// the host of Addr (a DNS name or an IP address).
	ServerName string

	// dialer, when set (tests), dials the TCP connection, e.g. from a
	// chosen local address.
	dialer *net.Dialer
}

func (o Options) timeout() time.Duration {
	if o.Timeout <= 0 {
		return DefaultTimeout
	}
	return o.Timeout
}

// ReadPassword returns user's password: the first line of file (without
// its line end) when file is not "", else the value of $KVTHROTTLE_PASSWORD.
// It returns "" and no error when user is "" (no authentication). It fails
// when the file cannot be read or its first line is empty, or when neither
// source gives a password; its errors never contain the password.
func ReadPassword(user, file string) (string, error) {
	if user == "" {
		return "", nil
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("cannot read the password file: %w", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		pw := strings.TrimRight(line, "\r")
		if pw == "" {
			return "", fmt.Errorf("the password file %s is empty", file)
		}
		return pw, nil
	}
	if pw, ok := os.LookupEnv(PasswordEnv); ok && pw != "" {
		return pw, nil
	}
	return "", fmt.Errorf("--user %s needs a password: give --password-file FILE or set %s", user, PasswordEnv)
}

// SetNode sends body, the JSON of SetNodeThrottleProperties (0x2c, e.g.
// `{"capacity": 25000}`), to the proxy. On success it writes "ok" and the
// server's answer, if it sent one, each on a line of their own, to w (a
// failure to write there is not reported: the change is made). It needs a
// user with the admin privilege; a refusal, an invalid body or a network
// failure is returned as an error for the operator (see the package
// comment).
func SetNode(o Options, body []byte, w io.Writer) error {
	req := request{cmd: "set-node"}
	return o.run(req, func(c *mcclient.Client) error {
		resp, err := c.SetNodeThrottle(body)
		if err != nil {
			return err
		}
		writeOK(w, resp)
		return nil
	})
}

// SetBucket sends body, the JSON of SetBucketThrottleProperties (0x2a, e.g.
// `{"reserved": 1000, "hard_limit": "unlimited"}`), for bucket to the proxy.
// On success it writes "ok" and the server's answer (the properties now in
// force), each on a line of their own, to w, as SetNode does. It needs a
// user with the admin privilege; an unknown bucket, a refusal, an invalid
// body or a network failure is returned as an error for the operator.
func SetBucket(o Options, bucket string, body []byte, w io.Writer) error {
	req := request{cmd: "set-bucket", arg: bucket, hasArg: true}
	return o.run(req, func(c *mcclient.Client) error {
		resp, err := c.SetBucketThrottle(bucket, body)
		if err != nil {
			return err
		}
		writeOK(w, resp)
		return nil
	})
}

// Stats reads the STAT group group ("" for the general one) and writes it
// to w: the group "throttle" as a node summary and a table with one row per
// bucket the user may see, sorted by name (in fleet mode with the fleet's
// state, this instance's shares and the fleet's usage beside this
// instance's, see formatThrottleTable); any other group as aligned
// "key value" lines in the server's order. An unknown group, a refusal, an
// answer that breaks the "throttle" group's contract or a network failure
// is returned as an error for the operator.
func Stats(o Options, group string, w io.Writer) error {
	req := request{cmd: "stats", arg: group, hasArg: group != ""}
	return o.run(req, func(c *mcclient.Client) error {
		kv, err := c.Stats(group)
		if err != nil {
			return err
		}
		if group != "throttle" {
			_, err = io.WriteString(w, formatStats(kv))
			return err
		}
		ts, err := mcclient.ParseThrottleStats(kv)
		if err != nil {
			return fmt.Errorf("unexpected answer from the server: %w", err)
		}
		_, err = io.WriteString(w, formatThrottleTable(ts))
		return err
	})
}

// run connects, calls do with the client and closes the connection; any
// error is described for the operator.
func (o Options) run(req request, do func(*mcclient.Client) error) error {
	c, err := o.connect()
	if err == nil {
		err = noAnswer(c.Conn(), do(c))
		c.Close()
	}
	if err != nil {
		return o.describe(req, err)
	}
	return nil
}

// writeOK writes "ok" and the server's answer, if any, as lines to w. A
// write error is not reported: the change it confirms is made.
func writeOK(w io.Writer, resp []byte) {
	out := "ok\n"
	if r := strings.TrimRight(string(resp), "\r\n"); r != "" {
		out += r + "\n"
	}
	_, _ = io.WriteString(w, out)
}
