package ctl

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
)

// TopOptions shape the live view of Top.
type TopOptions struct {
	// Interval is the refresh period; 0 means one second.
	Interval time.Duration
	// Iterations stops Top after that many frames; 0 means until the
	// context is done.
	Iterations int
}

// Top shows the live view of the proxy's buckets on w: every
// t.Interval it reads the STAT group "throttle" and redraws a node summary
// and one line per bucket (its use against its reservation and hard limit,
// held commands per second, held sessions, connections, weight), busiest
// first; the header names the free pool mode.
// In fleet mode it adds the fleet's state and each bucket's usage by the
// whole fleet beside this instance's (see topView.lines).
// It stops, returning nil, when ctx is done (the caller cancels it on
// Ctrl-C, SIGTERM or SIGHUP), when t.Iterations frames have been drawn, or
// when writing to w fails (the terminal is gone).
//
// When w is a terminal (or any writer that is not an *os.File) each frame
// is drawn over the previous one with ANSI escape sequences, the cursor
// hidden meanwhile; when it is a regular file or a pipe, frames follow one
// another, each ended by a blank line. The size of a frame follows
// $COLUMNS (default 80) and $LINES (default: no limit).
//
// A failure to connect at the start, a status error of the server (a
// refusal, or a server that is not a kvthrottle proxy) and an answer that
// breaks the contract of the "throttle" group end it with an error for the
// operator; a connection lost later is re-established, the reason shown in
// the frame meanwhile.
func Top(ctx context.Context, o Options, t TopOptions, w io.Writer) error {
	req := request{cmd: "top"}
	c, err := o.connect()
	if err != nil {
		return o.describe(req, err)
	}
	if err := runTop(ctx, o, t, c, w); err != nil {
		// A plaintext connection closed before the first answer: the
		// error is the first STAT's (later ones are retried).
		return o.describe(req, noAnswer(c.Conn(), err))
	}
	return nil
}

// runTop is Top once connected: c is the connected, authenticated client;
// runTop closes it, and any client it reconnects with, before it returns.
func runTop(ctx context.Context, o Options, t TopOptions, c *mcclient.Client, w io.Writer) error {
	cur := c
	defer func() {
		if cur != nil {
			cur.Close()
		}
	}()
	ts, err := fetchThrottle(ctx, cur)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	cols, rows := termSize()
	v := &topView{addr: o.Addr, width: cols, height: rows}
	v.update(ts, time.Now())

	ansi := isTerminalish(w)
	if ansi {
		if _, err := io.WriteString(w, ansiHideCursor); err != nil {
			return nil // the terminal is gone: nothing to show an error on
		}
		defer io.WriteString(w, ansiShowCursor)
	}
	interval := t.Interval
	if interval <= 0 {
		interval = time.Second
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	status := ""
	for frame := 1; ; frame++ {
		if _, err := io.WriteString(w, v.render(v.lines(status, time.Now()), ansi, frame == 1)); err != nil {
			return nil
		}
		if t.Iterations > 0 && frame >= t.Iterations {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
		}
		if cur == nil {
			cl, err := o.connect()
			if err != nil {
				if fatalTopError(err) {
					return err
				}
				status = "retrying: " + o.message(request{cmd: "top"}, err)
				continue
			}
			cur = cl
		}
		ts, err := fetchThrottle(ctx, cur)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && fatalTopError(err):
			return err
		case err != nil:
			status = "reconnecting: " + o.message(request{cmd: "top"}, err)
			cur.Close()
			cur = nil
			continue
		}
		status = ""
		v.update(ts, time.Now())
	}
}

// fetchThrottle reads and parses the STAT group "throttle". Cancelling ctx
// closes the connection so that a pending read returns at once.
func fetchThrottle(ctx context.Context, c *mcclient.Client) (mcclient.ThrottleStats, error) {
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	kv, err := c.Stats("throttle")
	if err != nil {
		return mcclient.ThrottleStats{}, err
	}
	ts, err := mcclient.ParseThrottleStats(kv)
	if err != nil {
		return mcclient.ThrottleStats{}, &badStatsError{err}
	}
	return ts, nil
}

// badStatsError is a STAT answer that does not follow the contract.
type badStatsError struct{ err error }

func (e *badStatsError) Error() string { return "unexpected answer from the server: " + e.err.Error() }
func (e *badStatsError) Unwrap() error { return e.err }

// fatalTopError reports whether err should end top rather than be shown
// while reconnecting: answers of the server, a refused or unverifiable TLS
// peer, a failed login and a local setting that cannot be used, as opposed
// to network trouble.
func fatalTopError(err error) bool {
	var se *mcclient.StatusError
	var bs *badStatsError
	var ce *configError
	var oe *net.OpError
	var he *handshakeError
	var ae *authError
	switch {
	case errors.As(err, &se), errors.As(err, &bs), errors.Is(err, mcclient.ErrNoPlainMech), errors.As(err, &ce):
		return true
	case errors.As(err, &oe) && oe.Op == "remote error":
		return true
	case errors.As(err, &he):
		var cv *tls.CertificateVerificationError
		var rh tls.RecordHeaderError
		return errors.As(he.err, &cv) || errors.As(he.err, &rh)
	case errors.As(err, &ae):
		var ne net.Error
		return !errors.As(ae.err, &ne) && !errors.Is(ae.err, io.EOF) && !errors.Is(ae.err, io.ErrUnexpectedEOF)
	}
	return false
}

// isTerminalish reports whether top should draw with escape sequences: not
// when standard output is a regular file or a pipe (frames are then printed
// one after the other).
func isTerminalish(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return true
	}
	fi, err := f.Stat()
	return err != nil || fi.Mode()&os.ModeCharDevice != 0
}

// termSize returns the terminal's columns ($COLUMNS, default 80) and rows
// ($LINES, 0 when unknown: no limit). It does not ask the terminal itself
// (the ioctl TIOCGWINSZ).
func termSize() (cols, rows int) {
	cols, rows = 80, 0
	if n, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && n > 0 {
		cols = max(n, 20)
	}
	if n, err := strconv.Atoi(os.Getenv("LINES")); err == nil && n > 0 {
		rows = max(n, topMinRows)
	}
	return cols, rows
}
