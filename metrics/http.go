package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// Timeouts of the server started by [Metrics.Serve]. Scrapes are small and
// local; these only bound what a stuck or hostile client can hold.
const (
	readHeaderTimeout = 5 * time.Second
	readTimeout       = 10 * time.Second
	writeTimeout      = 30 * time.Second
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 16 << 10
)

// Handler returns the HTTP handler of the metrics side server:
//
//   - GET /metrics: the registry in the Prometheus text exposition format
//     (gzip when asked for). At most a few scrapes run at once; more get 503.
//   - GET /healthz: always 200 "ok" while the process serves HTTP (liveness).
//   - GET /readyz: 200 "ok" when ready reports true; otherwise 503 with the
//     reason on one line (newlines in it are replaced by spaces; "not ready"
//     when it is empty). A nil ready means always ready. ready is called once
//     per request, from the HTTP goroutine, and must be safe for concurrent use.
//   - GET /: a short plain-text index of these paths.
//
// HEAD works wherever GET does; other methods get 405, other paths 404.
// Every call returns a new handler; they share the registry.
func (m *Metrics) Handler(ready func() (bool, string)) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", m.scrape)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		text(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready == nil {
			text(w, http.StatusOK, "ok")
			return
		}
		ok, reason := ready()
		if ok {
			text(w, http.StatusOK, "ok")
			return
		}
		reason = strings.Join(strings.Fields(reason), " ")
		if reason == "" {
			reason = "not ready"
		}
		text(w, http.StatusServiceUnavailable, reason)
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		text(w, http.StatusOK, "kvthrottle: /metrics (Prometheus), /healthz (liveness), /readyz (readiness)")
	})
	return mux
}

// text writes a one-line plain-text response.
func text(w http.ResponseWriter, code int, line string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = fmt.Fprintln(w, line)
}

// server is one run of Serve.
type server struct {
	http *http.Server
	addr string
	done chan struct{} // closed when the Serve goroutine has returned
	err  error         // why it returned, when not because of Shutdown; read after done
}

// Serve listens on addr (host:port; port 0 picks a free one) and serves
// [Metrics.Handler](ready) on a goroutine it owns until [Metrics.Shutdown].
// It returns once the listener is open, with the address actually bound, or
// with the error of the listen. Calling Serve again before Shutdown is an
// error; after Shutdown it may be called again.
func (m *Metrics) Serve(addr string, ready func() (bool, string)) (boundAddr string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.srv != nil {
		return "", fmt.Errorf("metrics: already serving on %s", m.srv.addr)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	s := &server{
		http: &http.Server{
			Handler:           m.Handler(ready),
			ReadHeaderTimeout: readHeaderTimeout,
			ReadTimeout:       readTimeout,
			WriteTimeout:      writeTimeout,
			IdleTimeout:       idleTimeout,
			MaxHeaderBytes:    maxHeaderBytes,
		},
		addr: ln.Addr().String(),
		done: make(chan struct{}),
	}
	go func() {
		defer close(s.done)
		if err := s.http.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			s.err = fmt.Errorf("metrics: serving on %s: %w", s.addr, err)
		}
	}()
	m.srv = s
	return s.addr, nil
}

// Shutdown stops the server started by [Metrics.Serve]: it closes the
// listener, lets in-flight requests finish and closes idle connections. If
// ctx ends first, the remaining connections are closed forcibly and ctx's
// error is returned. Either way, when Shutdown returns the serving goroutine
// has exited. It also returns the error that made the server stop early, if
// any. Without a running server it does nothing and returns nil.
func (m *Metrics) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	s := m.srv
	m.srv = nil
	m.mu.Unlock()
	if s == nil {
		return nil
	}
	err := s.http.Shutdown(ctx)
	if err != nil {
		_ = s.http.Close()
	}
	<-s.done
	if err == nil {
		err = s.err
	}
	return err
}
