package proxy

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

type testProxy struct {
	*Server
	Addr string
	MC   *testmc.Server
	done chan error
}

// startProxy runs a proxy in front of a fresh memcached, with opts
// adjusted by mod. It is shut down when the test ends.
func startProxy(t testing.TB, mod func(*Options)) *testProxy {
	t.Helper()
	m := testmc.Start(t)
	return startProxyTo(t, m, mod)
}

func startProxyTo(t testing.TB, m *testmc.Server, mod func(*Options)) *testProxy {
	t.Helper()
	opts := Options{
		Listen:  testmc.FreeAddr(t),
		Servers: []string{m.Addr},
		Timeout: 2 * time.Second,
		Logger:  testLogger(t),
	}
	if mod != nil {
		mod(&opts)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	p := &testProxy{Server: srv, Addr: opts.Listen, MC: m, done: make(chan error, 1)}
	go func() { p.done <- srv.Serve() }()
	select {
	case <-srv.Ready():
	case err := <-p.done:
		t.Fatalf("proxy did not start: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("proxy did not start within 5s")
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		select {
		case err := <-p.done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Shutdown")
		}
	})
	return p
}

func testLogger(t testing.TB) zerolog.Logger {
	if os.Getenv("KVTHROTTLE_TEST_LOG") != "" {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).With().Timestamp().Logger()
	}
	return zerolog.Nop()
}

func dial(t testing.TB, addr string) *mcclient.Client {
	t.Helper()
	c, err := mcclient.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// eventually polls cond until it is true or the deadline passes.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
