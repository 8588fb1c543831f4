package upstream

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

type failWaiter struct{ status binary.Status }

func (w *failWaiter) Deliver(*binary.Frame, bool)         {}
func (w *failWaiter) Silent()                             {}
func (w *failWaiter) Fail(status binary.Status, _ string) { w.status = status }

// A connect that never completes (the socket's registration with the loop
// failed without a word) fails the requests queued behind it once it has
// taken twice the timeout, instead of holding them for good.
func TestCheckTimeoutEndsAStuckConnect(t *testing.T) {
	c := New(Config{Addr: "127.0.0.1:1", Timeout: time.Second}, nil)
	c.state, c.dialedAt = stateConnecting, time.Now()
	w := &failWaiter{}
	c.push(entry{opaque: 1, w: w})

	c.CheckTimeout(c.dialedAt.Add(1500 * time.Millisecond))
	if c.state != stateConnecting || w.status != 0 {
		t.Fatalf("after 1.5 s: state %v, waiter status %v; want still connecting", c.state, w.status)
	}
	c.CheckTimeout(c.dialedAt.Add(2100 * time.Millisecond))
	if c.state != stateDown || w.status != binary.StatusEtmpfail || c.Inflight() != 0 {
		t.Fatalf("after 2.1 s: state %v, waiter status %v, in flight %d; want down, Etmpfail, 0", c.state, w.status, c.Inflight())
	}
}
