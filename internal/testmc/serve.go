package testmc

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Runner is a server a test runs with Serve; *proxy.Server is one. (This
// package cannot name proxy.Server: the proxy's own tests import it.)
type Runner interface {
	// Serve serves until Shutdown; it returns nil after a clean Shutdown.
	Serve() error
	// Started is closed once the server accepts connections.
	Started() <-chan struct{}
	// Shutdown drains the server and makes Serve return.
	Shutdown(ctx context.Context) error
}

// Serve runs s.Serve on a goroutine of its own and waits until s has
// started; the test fails at once if Serve returns first or s has not
// started within 60 s (liveness: a loaded machine's start can take
// seconds, and nothing is judged by it). It returns stop, which shuts s
// down with a drain deadline of 5 s (connections with commands in flight
// are closed then), waits up to a minute for Serve to return (liveness: on
// a loaded machine the event loops' own stop took over 5 s), and reports on
// t a failure of either (or a Serve that returns an error). stop may be
// called more than once (later calls do nothing); it runs when the test
// ends at the latest.
func Serve(t testing.TB, s Runner) (stop func(t testing.TB)) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	select {
	case <-s.Started():
	case err := <-done:
		t.Fatalf("server did not start: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("server did not start within 60s")
	}
	var once sync.Once
	stop = func(t testing.TB) {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := s.Shutdown(ctx); err != nil {
				t.Errorf("shutdown: %v", err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("serve: %v", err)
				}
			case <-time.After(time.Minute):
				t.Error("Serve did not return within a minute of Shutdown")
			}
		})
	}
	t.Cleanup(func() { stop(t) })
	return stop
}
