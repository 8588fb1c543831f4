package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvthrottle/kvthrottle/ctl"
)

const ctlUsage = `usage: kvthrottle ctl [--addr HOST:PORT] [--user U [--password-file F]] [TLS flags] COMMAND

commands:
  set-node JSON          set the node throttle properties (opcode 0x2c), e.g.
                         '{"capacity": 25000}'
  set-bucket NAME JSON   set a bucket's throttle properties (opcode 0x2a), e.g.
                         '{"reserved": 1000, "hard_limit": "unlimited"}'
  stats [GROUP]          print a STAT group (default: general; "throttle": a table)
  top                    live view of each bucket's use against its limits

JSON may be "-" to read it from standard input.

flags:
  --addr HOST:PORT       the proxy (default 127.0.0.1:11311)
  --user U               authenticate as U with SASL (see --sasl-mech)
  --password-file F      read U's password from F (first line); without it
                         the password comes from $KVTHROTTLE_PASSWORD
  --sasl-mech M          auto (default), plain, scram-sha256 or scram-sha512;
                         auto: PLAIN over TLS or to a loopback address where
                         the proxy offers it, else the strongest SCRAM (PLAIN
                         is never sent in clear to another host)
  --tls                  connect over TLS (--addr: the proxy's [tls] listen)
  --ca F                 verify the proxy's certificate with the CA
                         certificates in F (default: the system's roots)
  --server-name NAME     the name the proxy's certificate must carry
                         (default: the host of --addr)
  --cert F --key F       client certificate and key (mutual TLS): the user it
                         names is logged in, no --user or password needed
                         (--ca, --cert, --key and --server-name imply --tls)
  --timeout D            bound on each request (default 5s)
  --interval D           top: refresh period (default 1s)
  --iterations N         top: stop after N frames (default 0: until Ctrl-C)

exit status: 0 ok, 1 request failed, 2 usage error
`

// ctlOptions are the parsed flags and arguments of `kvthrottle ctl`.
type ctlOptions struct {
	conn         ctl.Options // the password is filled in after parsing
	passwordFile string
	top          ctl.TopOptions
	cmd          string
	args         []string
}

// cmdCtl runs `kvthrottle ctl`: it parses the command line and calls the
// ctl package. It returns the exit code: 0 ok, 1 request failed, 2 usage
// error.
func cmdCtl(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, code, ok := parseCtlArgs(args, stdout, stderr)
	if !ok {
		return code
	}
	pw, err := ctl.ReadPassword(o.conn.User, o.passwordFile)
	if err != nil {
		hint := ""
		if o.conn.CertFile != "" && o.passwordFile == "" {
			hint = " (with --cert, leave out --user: the certificate names the user)"
		}
		fmt.Fprintf(stderr, "kvthrottle ctl: %v%s\n", err, hint)
		return 2
	}
	o.conn.Password = pw
	var body []byte
	if o.cmd == "set-node" || o.cmd == "set-bucket" {
		arg := o.args[len(o.args)-1]
		if arg == "-" {
			b, err := io.ReadAll(io.LimitReader(stdin, 1<<20))
			if err != nil {
				fmt.Fprintf(stderr, "kvthrottle ctl: read JSON from standard input: %v\n", err)
				return 2
			}
			arg = strings.TrimSpace(string(b))
		}
		if arg == "" {
			fmt.Fprintf(stderr, "kvthrottle ctl: %s: empty JSON\n", o.cmd)
			return 2
		}
		body = []byte(arg)
	}

	switch o.cmd {
	case "set-node":
		err = ctl.SetNode(o.conn, body, stdout)
	case "set-bucket":
		err = ctl.SetBucket(o.conn, o.args[0], body, stdout)
	case "stats":
		group := ""
		if len(o.args) > 0 {
			group = o.args[0]
		}
		err = ctl.Stats(o.conn, group, stdout)
	case "top":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
		defer stop()
		err = ctl.Top(ctx, o.conn, o.top, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvthrottle ctl: %v\n", err)
		return 1
	}
	return 0
}

// parseCtlArgs parses flags, which may appear before or after the
// sub-command ("--" ends them), and checks the sub-command's arguments. On
// failure it has printed the reason and returns ok false and the exit code.
func parseCtlArgs(args []string, stdout, stderr io.Writer) (o ctlOptions, code int, ok bool) {
	usageErr := func(format string, a ...any) (ctlOptions, int, bool) {
		fmt.Fprintf(stderr, "kvthrottle ctl: "+format+"\n\n%s", append(a, ctlUsage)...)
		return ctlOptions{}, 2, false
	}
	rest, tail := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		rest, tail = args[:i], args[i+1:]
	}
	for _, a := range rest {
		// Refuse a password flag explicitly, without echoing its value: it
		// would be visible in ps and in the shell history.
		if name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && name == "password" {
			return usageErr("there is no --password flag (it would show in ps and the shell history); use --password-file FILE or the %s environment variable", ctl.PasswordEnv)
		}
	}

	fs := flag.NewFlagSet("kvthrottle ctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.conn.Addr, "addr", "127.0.0.1:11311", "")
	fs.StringVar(&o.conn.User, "user", "", "")
	fs.StringVar(&o.passwordFile, "password-file", "", "")
	fs.BoolVar(&o.conn.TLS, "tls", false, "")
	fs.StringVar(&o.conn.CAFile, "ca", "", "")
	fs.StringVar(&o.conn.CertFile, "cert", "", "")
	fs.StringVar(&o.conn.KeyFile, "key", "", "")
	fs.StringVar(&o.conn.ServerName, "server-name", "", "")
	mech := fs.String("sasl-mech", string(ctl.MechAuto), "")
	fs.DurationVar(&o.conn.Timeout, "timeout", 5*time.Second, "")
	fs.DurationVar(&o.top.Interval, "interval", time.Second, "")
	fs.IntVar(&o.top.Iterations, "iterations", 0, "")
	var pos []string
	for {
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fmt.Fprint(stdout, ctlUsage)
				return ctlOptions{}, 0, false
			}
			return usageErr("%v", err)
		}
		rest = fs.Args()
		if len(rest) == 0 {
			break
		}
		pos, rest = append(pos, rest[0]), rest[1:]
	}
	pos = append(pos, tail...)

	if len(pos) == 0 {
		return usageErr("missing command")
	}
	o.cmd, o.args = pos[0], pos[1:]
	want := map[string][2]int{ // min, max arguments
		"set-node":   {1, 1},
		"set-bucket": {2, 2},
		"stats":      {0, 1},
		"top":        {0, 0},
	}
	n, known := want[o.cmd]
	switch {
	case o.cmd == "help":
		fmt.Fprint(stdout, ctlUsage)
		return ctlOptions{}, 0, false
	case !known:
		return usageErr("unknown command %q", o.cmd)
	case len(o.args) < n[0] || len(o.args) > n[1]:
		switch o.cmd {
		case "set-node":
			return usageErr("usage: set-node JSON")
		case "set-bucket":
			return usageErr("usage: set-bucket NAME JSON")
		case "stats":
			return usageErr("usage: stats [GROUP]")
		default:
			return usageErr("top takes no arguments")
		}
	}
	var topOnly []string
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "interval" || f.Name == "iterations" {
			topOnly = append(topOnly, "--"+f.Name)
		}
	})
	if o.cmd != "top" && len(topOnly) > 0 {
		return usageErr("%s applies to top only", strings.Join(topOnly, " and "))
	}
	if o.conn.Addr == "" {
		return usageErr("--addr HOST:PORT is empty")
	}
	if o.cmd == "set-bucket" && o.args[0] == "" {
		return usageErr("set-bucket: empty bucket name")
	}
	if o.conn.Timeout <= 0 {
		return usageErr("--timeout must be positive")
	}
	if o.top.Interval <= 0 {
		return usageErr("--interval must be positive")
	}
	if o.top.Iterations < 0 {
		return usageErr("--iterations must be 0 (until interrupted) or more")
	}
	if o.conn.User == "" && o.passwordFile != "" {
		return usageErr("--password-file needs --user")
	}
	m, err := ctl.ParseMech(*mech)
	if err != nil {
		return usageErr("--sasl-mech: %v", err)
	}
	o.conn.Mech = m
	saslMech := false
	fs.Visit(func(f *flag.Flag) { saslMech = saslMech || f.Name == "sasl-mech" })
	if saslMech && o.conn.User == "" {
		return usageErr("--sasl-mech needs --user")
	}
	if (o.conn.CertFile == "") != (o.conn.KeyFile == "") {
		return usageErr("--cert and --key go together")
	}
	return o, 0, true
}
