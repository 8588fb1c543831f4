//go:build linux

package bareforward

import (
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

// A quiet request, which gets no response of its own, closes the client
// instead of desynchronising the routing of everyone else's responses.
func TestRefusesQuietRequests(t *testing.T) {
	addr := start(t, 1)
	c, err := mcclient.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Send(mcclient.Request{Opcode: mc.OpGetQ, Key: []byte("k")})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = c.Conn().SetReadDeadline(time.Now().Add(5 * time.Second))
	if r, err := c.Read(); err == nil {
		t.Fatalf("got a response %v to a quiet request; want the connection closed", r.Header)
	}
	other, err := mcclient.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if r, err := other.Get([]byte("k")); err != nil || r.Status() != mc.StatusKeyEnoent {
		t.Fatalf("another client afterwards: %v, %v", r, err)
	}
}
