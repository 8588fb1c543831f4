package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// passwordEnv is the environment variable ctl reads the password from when
// --password-file is not given.
const passwordEnv = "KVTHROTTLE_PASSWORD"

const ctlUsage = `usage: kvthrottle ctl [--addr HOST:PORT] [--user U [--password-file F]] COMMAND

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
  --user U               authenticate as U with SASL PLAIN
  --password-file F      read U's password from F (first line); without it
                         the password comes from $KVTHROTTLE_PASSWORD
  --timeout D            bound on each request (default 5s)
  --interval D           top: refresh period (default 1s)
  --iterations N         top: stop after N frames (default 0: until Ctrl-C)

exit status: 0 ok, 1 request failed, 2 usage error
`

// ctlOptions are the parsed flags and arguments of `kvthrottle ctl`.
type ctlOptions struct {
	addr         string
	user         string
	passwordFile string
	password     string
	timeout      time.Duration
	interval     time.Duration
	iterations   int
	cmd          string
	args         []string
}

// cmdCtl runs `kvthrottle ctl`: the admin client of a running proxy. It
// returns the exit code: 0 ok, 1 request failed, 2 usage error.
func cmdCtl(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, code, ok := parseCtlArgs(args, stdout, stderr)
	if !ok {
		return code
	}
	if err := o.readPassword(); err != nil {
		fmt.Fprintf(stderr, "kvthrottle ctl: %v\n", err)
		return 2
	}
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

	c, err := o.connect()
	if err != nil {
		fmt.Fprintf(stderr, "kvthrottle ctl: %s\n", o.describe(err))
		return 1
	}
	defer c.Close()

	switch o.cmd {
	case "set-node", "set-bucket":
		var resp []byte
		if o.cmd == "set-node" {
			resp, err = c.SetNodeThrottle(body)
		} else {
			resp, err = c.SetBucketThrottle(o.args[0], body)
		}
		if err != nil {
			break
		}
		fmt.Fprintln(stdout, "ok")
		if r := strings.TrimRight(string(resp), "\r\n"); r != "" {
			fmt.Fprintln(stdout, r)
		}
	case "stats":
		group := ""
		if len(o.args) > 0 {
			group = o.args[0]
		}
		var kv [][2]string
		if kv, err = c.Stats(group); err != nil {
			break
		}
		if group == "throttle" {
			var ts mcclient.ThrottleStats
			if ts, err = mcclient.ParseThrottleStats(kv); err != nil {
				err = fmt.Errorf("unexpected answer from the server: %w", err)
				break
			}
			_, err = io.WriteString(stdout, formatThrottleTable(ts))
		} else {
			_, err = io.WriteString(stdout, formatStats(kv))
		}
	case "top":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
		defer stop()
		err = runTop(ctx, o, c, stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "kvthrottle ctl: %s\n", o.describe(err))
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
			return usageErr("there is no --password flag (it would show in ps and the shell history); use --password-file FILE or the %s environment variable", passwordEnv)
		}
	}

	fs := flag.NewFlagSet("kvthrottle ctl", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:11311", "")
	fs.StringVar(&o.user, "user", "", "")
	fs.StringVar(&o.passwordFile, "password-file", "", "")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "")
	fs.DurationVar(&o.interval, "interval", time.Second, "")
	fs.IntVar(&o.iterations, "iterations", 0, "")
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
	if o.addr == "" {
		return usageErr("--addr HOST:PORT is empty")
	}
	if o.cmd == "set-bucket" && o.args[0] == "" {
		return usageErr("set-bucket: empty bucket name")
	}
	if o.timeout <= 0 {
		return usageErr("--timeout must be positive")
	}
	if o.interval <= 0 {
		return usageErr("--interval must be positive")
	}
	if o.iterations < 0 {
		return usageErr("--iterations must be 0 (until interrupted) or more")
	}
	if o.user == "" && o.passwordFile != "" {
		return usageErr("--password-file needs --user")
	}
	return o, 0, true
}

// readPassword fills o.password from --password-file or $KVTHROTTLE_PASSWORD
// when a user is given. Its errors never contain the password.
func (o *ctlOptions) readPassword() error {
	if o.user == "" {
		return nil
	}
	if o.passwordFile != "" {
		b, err := os.ReadFile(o.passwordFile)
		if err != nil {
			return fmt.Errorf("cannot read the password file: %v", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		o.password = strings.TrimRight(line, "\r")
		if o.password == "" {
			return fmt.Errorf("the password file %s is empty", o.passwordFile)
		}
		return nil
	}
	if pw, ok := os.LookupEnv(passwordEnv); ok && pw != "" {
		o.password = pw
		return nil
	}
	return fmt.Errorf("--user %s needs a password: give --password-file FILE or set %s", o.user, passwordEnv)
}

// connect dials the proxy and authenticates when a user is given.
func (o *ctlOptions) connect() (*mcclient.Client, error) {
	c, err := mcclient.Dial(o.addr)
	if err != nil {
		return nil, &dialError{err}
	}
	c.Timeout = o.timeout
	if o.user != "" {
		if err := c.AuthPlain(o.user, o.password); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// dialError marks a failure to connect (as opposed to a lost connection).
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// describe turns an error of a ctl request into the one-line message shown
// to the operator.
func (o *ctlOptions) describe(err error) string {
	var de *dialError
	var se *mcclient.StatusError
	var ne net.Error
	switch {
	case errors.As(err, &de):
		return fmt.Sprintf("cannot connect to %s: %s", o.addr, netCause(de.err))
	case errors.As(err, &se):
		return o.statusMessage(se)
	case errors.Is(err, mcclient.ErrNoPlainMech):
		return fmt.Sprintf("cannot authenticate user %s: %v", o.user, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Sprintf("%s closed the connection", o.addr)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("no answer from %s within %s", o.addr, o.timeout)
	case errors.As(err, &ne):
		return fmt.Sprintf("connection to %s failed: %s", o.addr, netCause(err))
	}
	return err.Error()
}

// statusMessage explains a failure status of the server.
func (o *ctlOptions) statusMessage(se *mcclient.StatusError) string {
	reason := sanitize(strings.TrimSpace(se.Reason))
	withReason := func(msg string) string {
		if reason == "" {
			return msg
		}
		return msg + ": " + reason
	}
	isSet := o.cmd == "set-node" || o.cmd == "set-bucket"
	switch se.Status {
	case mc.StatusAuthError:
		if o.user == "" {
			return "authentication required: give --user U (password from --password-file or " + passwordEnv + ")"
		}
		return "authentication failed for user " + o.user
	case mc.StatusEaccess:
		switch {
		case isSet && o.user != "":
			return "permission denied: user " + o.user + " lacks the admin privilege"
		case isSet:
			return "permission denied: " + o.cmd + " needs a user with the admin privilege (give --user U)"
		}
		return withReason("access denied")
	case mc.StatusEinval:
		if reason == "" {
			return "invalid request (the server gave no reason)"
		}
		return "invalid request: " + reason
	case mc.StatusKeyEnoent:
		switch {
		case o.cmd == "set-bucket":
			return "unknown bucket " + o.args[0]
		case se.Op == mc.OpStat && len(o.args) > 0:
			return "unknown stats group " + o.args[0]
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

// formatStats returns STAT pairs as aligned "key value" lines.
func formatStats(kv [][2]string) string {
	w := 0
	for _, p := range kv {
		w = max(w, len(p[0]))
	}
	var b strings.Builder
	for _, p := range kv {
		fmt.Fprintf(&b, "%-*s %s\n", w, sanitize(p[0]), sanitize(p[1]))
	}
	return b.String()
}

// formatThrottleTable returns the STAT group "throttle" as a node summary
// and a table with one row per bucket, sorted by name.
func formatThrottleTable(ts mcclient.ThrottleStats) string {
	var b strings.Builder
	fmt.Fprintf(&b, "node capacity:  %s units/s\n", ts.Node.Capacity)
	fmt.Fprintf(&b, "node free pool: %s units/s\n\n", ts.Node.FreePool)
	buckets := slices.Clone(ts.Buckets)
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].Name < buckets[j].Name })
	rows := [][]string{{"BUCKET", "RESERVED", "HARD_LIMIT", "UNITS/S", "UNITS", "READ", "WRITE", "COMMANDS", "THROTTLED", "REJECTED", "HELD", "CONNS"}}
	for _, bs := range buckets {
		rows = append(rows, []string{
			bs.Name, bs.Reserved.String(), bs.HardLimit.String(),
			u64(bs.UnitsPerSec), u64(bs.UnitsTotal), u64(bs.ReadUnitsTotal), u64(bs.WriteUnitsTotal),
			u64(bs.CommandsTotal), u64(bs.ThrottledTotal), u64(bs.RejectedTotal),
			u64(bs.HeldSessions), u64(bs.Connections),
		})
	}
	if len(buckets) == 0 {
		b.WriteString("no buckets visible\n")
		return b.String()
	}
	b.WriteString(alignTable(rows))
	return b.String()
}

// alignTable lays out rows as columns separated by two spaces: the first
// column left-aligned, the others (numbers) right-aligned.
func alignTable(rows [][]string) string {
	var widths []int
	for _, r := range rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		for i, c := range r {
			switch {
			case i == 0:
				fmt.Fprintf(&b, "%-*s", widths[i], c)
			default:
				fmt.Fprintf(&b, "  %*s", widths[i], c)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// u64 formats n in decimal.
func u64(n uint64) string { return strconv.FormatUint(n, 10) }

// sanitize replaces control characters so that text from the server cannot
// drive the terminal.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}
