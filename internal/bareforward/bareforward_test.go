//go:build linux

package bareforward

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

func start(t *testing.T, loops int) (addr string) {
	t.Helper()
	mcd := testmc.Start(t)
	addr = testmc.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, addr, mcd.Addr, loops) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	if err := testmc.WaitListening(addr, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	return addr
}

// Pipelined requests from many clients come back to the right client, in
// order, with their opaques.
func TestForwardsInOrderToTheRightClient(t *testing.T) {
	addr := start(t, 2)
	const clients, perClient = 8, 200
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := mcclient.Dial(addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for j := range perClient {
				key := fmt.Appendf(nil, "c%d-k%d", i, j)
				c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: key, Value: key})
				c.Send(mcclient.Request{Opcode: mc.OpGet, Key: key, Opaque: uint32(1_000_000 + j)})
			}
			if err := c.Flush(); err != nil {
				errs <- err
				return
			}
			for j := range perClient {
				set, err := c.Read()
				if err != nil {
					errs <- err
					return
				}
				get, err := c.Read()
				if err != nil {
					errs <- err
					return
				}
				want := fmt.Sprintf("c%d-k%d", i, j)
				if set.Opcode != mc.OpSet || set.Status() != mc.StatusSuccess ||
					get.Opaque != uint32(1_000_000+j) || string(get.Value) != want {
					errs <- fmt.Errorf("client %d request %d: set %v/%v, get opaque %d value %q, want %q",
						i, j, set.Opcode, set.Status(), get.Opaque, get.Value, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// Commands that do not get exactly one response on a connection memcached
// keeps open close their client instead of being forwarded on the upstream
// connection every client of the loop shares: a quiet GET (no response), a
// QUIT (memcached closes the connection), VERBOSITY (memcached answers
// after swallowing the start of the next request, whoever sent it). The
// other clients go on.
func TestRefusesWhatWouldBreakTheSharedConnection(t *testing.T) {
	addr := start(t, 1)
	other, err := mcclient.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	other.Timeout = 5 * time.Second
	if r, err := other.Set([]byte("k"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("SET: %v, %v", r, err)
	}
	for _, req := range []mcclient.Request{
		{Opcode: mc.OpGetQ, Key: []byte("k")},
		{Opcode: mc.OpQuit},
		{Opcode: mc.OpVerbosity, Extras: []byte{0, 0, 0, 0}},
	} {
		c, err := mcclient.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Timeout = 5 * time.Second
		c.Send(req)
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if r, err := c.Read(); err == nil {
			t.Errorf("%s: got a response %v; want the connection closed", req.Opcode, r.Header)
		}
		c.Close()
		if r, err := other.Get([]byte("k")); err != nil || string(r.Value) != "v" {
			t.Fatalf("another client after a %s: %v, %v", req.Opcode, r, err)
		}
	}
}

// Clients pipelining large values: more requests arrive per pass than
// memcached's responses fit in one read, and memcached stops reading while
// its responses are not read. The forwarder reads them while it waits to
// write, so neither side waits for the other for ever.
func TestPipelinedLargeValues(t *testing.T) {
	addr := start(t, 1)
	const clients, pairs = 8, 40
	val := bytes.Repeat([]byte("v"), 256<<10)
	var wg sync.WaitGroup
	errs := make(chan error, 2*clients)
	for i := range clients {
		c, err := mcclient.Dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Timeout = 20 * time.Second
		wg.Add(2)
		go func() { // writer
			defer wg.Done()
			for j := range pairs {
				key := fmt.Appendf(nil, "c%d-%d", i, j)
				c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: key, Value: val})
				c.Send(mcclient.Request{Opcode: mc.OpGet, Key: key})
			}
			if err := c.Flush(); err != nil {
				errs <- err
			}
		}()
		go func() { // reader
			defer wg.Done()
			for j := range 2 * pairs {
				r, err := c.Read()
				if err != nil {
					errs <- fmt.Errorf("client %d: response %d of %d: %v", i, j, 2*pairs, err)
					return
				}
				if r.Status() != mc.StatusSuccess || (r.Opcode == mc.OpGet && len(r.Value) != len(val)) {
					errs <- fmt.Errorf("client %d: response %d: %s %s, %d bytes", i, j, r.Opcode, r.Status(), len(r.Value))
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
