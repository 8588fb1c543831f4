package upstream

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

type reasonWaiter struct {
	status binary.Status
	reason string
}

func (w *reasonWaiter) Deliver(*binary.Frame, bool) {}
func (w *reasonWaiter) Silent()                     {}
func (w *reasonWaiter) Fail(status binary.Status, reason string) {
	w.status, w.reason = status, reason
}

// A request written to the server before the connection failed may have
// run (a write may be applied): its Etmpfail says so, and says whether the
// server timed out. A request still buffered did not run.
func TestFailReasonSaysWhetherSent(t *testing.T) {
	for _, tc := range []struct {
		name string
		fail func(c *Conn, sentAt time.Time)
		want string
	}{
		{"timeout", func(c *Conn, sentAt time.Time) { c.CheckTimeout(sentAt.Add(2 * time.Second)) }, "upstream timed out; the command may have run"},
		{"connection lost", func(c *Conn, _ time.Time) { c.HandleClose(nil, nil) }, "upstream connection lost; the command may have run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{Addr: "127.0.0.1:1", Timeout: time.Second}, nil)
			c.state = stateUp
			sentAt := time.Now()
			sent, buffered := &reasonWaiter{}, &reasonWaiter{}
			c.push(entry{opaque: 1, w: sent})
			c.ring[c.head].sent = sentAt.UnixNano()
			c.unsent = 0
			c.push(entry{opaque: 2, w: buffered})
			tc.fail(c, sentAt)
			if sent.status != binary.StatusEtmpfail || sent.reason != tc.want {
				t.Errorf("sent request: %s %q, want Etmpfail %q", sent.status, sent.reason, tc.want)
			}
			if buffered.status != binary.StatusEtmpfail || buffered.reason != "upstream unavailable" {
				t.Errorf("buffered request: %s %q, want Etmpfail %q", buffered.status, buffered.reason, "upstream unavailable")
			}
		})
	}
}
