package upstream

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

type countWaiter struct{ delivered, failed int }

func (w *countWaiter) Deliver(*binary.Frame, bool) { w.delivered++ }
func (w *countWaiter) Silent()                     {}
func (w *countWaiter) Fail(binary.Status, string)  { w.failed++ }

// A long pipeline of large responses that keeps arriving is not a dead
// server: the oldest request's wait counts from the server's last answer,
// so requests far down the pipeline (another tenant's among them) are not
// failed with Etmpfail while the server is still answering the ones before
// them. A server that stops answering is still caught one timeout after its
// last answer.
func TestCheckTimeoutCountsFromTheLastAnswer(t *testing.T) {
	c := New(Config{Addr: "127.0.0.1:1", Timeout: time.Second}, nil)
	c.state = stateUp
	t0 := time.Now()
	ws := make([]*countWaiter, 10)
	for i := range ws {
		ws[i] = &countWaiter{}
		c.push(entry{opaque: uint32(i + 1), w: ws[i], sent: t0.UnixNano()})
	}
	c.unsent = 0
	// One answer every 400 ms: 2.4 s after the batch was written, six
	// have been answered and the seventh has waited 400 ms.
	now := t0
	for i := 0; i < 6; i++ {
		now = now.Add(400 * time.Millisecond)
		f := binary.Frame{Header: binary.Header{Magic: binary.MagicResponse, Opaque: uint32(i + 1)}}
		if err := c.match(&f); err != nil {
			t.Fatal(err)
		}
		c.CheckTimeout(now)
		if c.state != stateUp {
			t.Fatalf("connection failed %v after the batch was written, while the server answers every 400 ms", now.Sub(t0))
		}
	}
	if ws[5].delivered != 1 || ws[6].failed != 0 {
		t.Fatalf("waiters: sixth delivered %d, seventh failed %d", ws[5].delivered, ws[6].failed)
	}
	// The server stops answering: the oldest request fails one timeout
	// after the last answer was seen, not before.
	last := now
	c.CheckTimeout(last.Add(900 * time.Millisecond))
	if c.state != stateUp {
		t.Fatal("failed 0.9 s after the last answer; timeout 1 s")
	}
	c.CheckTimeout(last.Add(1100 * time.Millisecond))
	if c.state != stateDown || ws[6].failed != 1 || c.Inflight() != 0 {
		t.Fatalf("1.1 s after the last answer: state %v, seventh failed %d, in flight %d; want down, 1, 0", c.state, ws[6].failed, c.Inflight())
	}
}
