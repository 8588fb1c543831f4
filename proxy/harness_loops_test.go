package proxy

// Test helpers that look into the event loops (onLoop, sessionOf) and
// drive a proxy on a fake clock (fakeTime).

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// fakeTime drives a proxy whose throttle engine reads a fake clock: step
// advances the clock and waits until the proxy has done everything the new
// reading allows, so that what a test counts between steps is exact and
// the same on every run, however loaded the machine.
type fakeTime struct {
	t     testing.TB
	p     *testProxy
	clock *throttle.FakeClock
}

// settle waits until the proxy is settled at the clock's reading (see
// settled) with exactly held sessions held (any number: anyHeld), and
// ready (nil: always) holds: typically that the clients have read every
// answer the proxy sent.
func (ft *fakeTime) settle(held int, ready func() bool) {
	ft.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n, ok := settled(ft.t, ft.p)
		if ok && (n == held || held == anyHeld) && (ready == nil || ready()) {
			return
		}
		if time.Now().After(deadline) {
			ft.t.Fatalf("at %v the proxy did not settle with %d sessions held (%d held, settled %v)", ft.clock.Now(), held, n, ok)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

// anyHeld, as fakeTime's held, settles with any number of sessions held.
const anyHeld = -1

// stepWhileHeld moves the clock by d each time the proxy is settled with
// a session held, until done is closed: the clients' commands beyond
// their budget are held on every run, whatever the machine's speed, and
// the clock never runs ahead of clients that are still sending.
func (ft *fakeTime) stepWhileHeld(d time.Duration, done <-chan struct{}) {
	ft.t.Helper()
	for {
		select {
		case <-done:
			return
		default:
		}
		if held, ok := settled(ft.t, ft.p); ok && held > 0 {
			ft.step(d, anyHeld, nil)
		} else {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// step advances the clock by d and settles (settle).
func (ft *fakeTime) step(d time.Duration, held int, ready func() bool) {
	ft.t.Helper()
	ft.clock.Advance(d)
	ft.settle(held, ready)
}

// settled reports whether every loop of p has done all it can at the
// engine clock's reading, and how many sessions are held: no wake-up due,
// no session queued for a re-try or a flush, no lease stock due to go
// back, and every session either held (by the throttle: a session waiting
// for a raise of its bucket's ceiling waits for work, not for the clock)
// or idle (its input all dispatched), with nothing in flight upstream and
// nothing unsent.
func settled(t testing.TB, p *testProxy) (held int, ok bool) {
	ok = true
	onLoop(t, p, func(lp *loop) {
		now := lp.srv.throttle.Now()
		for _, e := range lp.holds {
			if e.live() && e.at <= now {
				ok = false
			}
		}
		if len(lp.retry) > 0 || len(lp.dirty) > 0 || lp.leaseDue != 0 && lp.leaseDue <= now {
			ok = false
		}
		for s := range lp.sessions {
			switch {
			case s.pending() > 0 || s.unsent() > 0:
				ok = false
			case s.isHeld():
				held++
			case s.pause == waitingCeiling:
				ok = false // work in progress: upstream answers, a save of the ceilings (real time)
			case s.pause != running || !s.drained():
				ok = false
			}
		}
	})
	return held, ok
}

// onLoop runs fn on each event loop of p in turn and waits for it.
func onLoop(t testing.TB, p *testProxy, fn func(lp *loop)) {
	t.Helper()
	p.eachLoop(func(lp *loop) {
		done := make(chan struct{})
		if err := lp.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
			defer close(done)
			fn(lp)
			return nil
		})); err != nil {
			t.Fatalf("run on the loop: %v", err)
		}
		<-done
	})
}

// sessionOf returns the session of the client whose local address is
// addr, or nil (closed, or not yet opened). On the loop.
func sessionOf(lp *loop, addr net.Addr) *session {
	for s := range lp.sessions {
		if s.remote == addr.String() {
			return s
		}
	}
	return nil
}
