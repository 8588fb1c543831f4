package proxy

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"
)

// TestReadGateSelfCheck: on the pinned gnet every event loop gets a read
// gate (its epoll descriptor found and checked); an event loop of
// another shape gets none, with the reason, and never a descriptor.
func TestReadGateSelfCheck(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{loops: 2})
	for i := 0; i < 4; i++ { // connections reach both loops
		textDo(t, dialText(t, p.Addr), "mn\r\n", "MN\r\n")
	}
	loops := 0
	onLoop(t, p, func(lp *loop) {
		loops++
		if !lp.gate.ok() {
			t.Errorf("event loop without a read gate: %v", lp.gate.err)
		}
	})
	if loops == 0 {
		t.Fatal("no event loop")
	}
	for _, el := range []gnet.EventLoop{nil, &fakeEventLoop{poller: 1}} {
		if g := newReadGate(el); g.ok() || g.err == nil {
			t.Errorf("newReadGate(%T) = %+v, want no gate and a reason", el, g)
		}
	}
}

// fakeEventLoop is a gnet.EventLoop that is not gnet's.
type fakeEventLoop struct {
	gnet.EventLoop
	poller int
}

// TestReadGateFallbackCloses: on an event loop without a read gate a held
// client that sends past max_held_input_bytes is closed, as before
// back-pressure, with the reason logged: memory stays bounded.
func TestReadGateFallbackCloses(t *testing.T) {
	t.Parallel()
	tc := bpConfig(1, 10*time.Millisecond)
	tc.tail = "[[bucket]]\nname = \"default\"\nhard_limit = 1\n"
	var log lockedBuffer
	tc.log = &log
	p := startProxy(t, tc)
	textDo(t, dialText(t, p.Addr), "mn\r\n", "MN\r\n") // starts the loop
	onLoop(t, p, func(lp *loop) { lp.gate.err = errors.New("test: no gate") })
	w := startPipeWriter(t, rawDial(t, p.Addr), "fb", 4096, 4000)
	select {
	case <-w.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the held client was not closed")
	}
	if w.err == nil {
		t.Fatal("the writer wrote everything: the held client was read without bound")
	}
	if !strings.Contains(log.String(), "client input buffer limit exceeded; closing connection") {
		t.Error("no log line for the closed client")
	}
}
