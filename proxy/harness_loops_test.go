package proxy

// Test helpers that look into the event loops (onLoop, sessionOf) and
// drive a proxy on a fake clock (fakeTime).

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
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
	deadline := time.Now().Add(time.Minute) // liveness only
	var poll backoff
	for {
		n, why := unsettled(ft.t, ft.p)
		if why == "" && (n == held || held == anyHeld) && (ready == nil || ready()) {
			return
		}
		if time.Now().After(deadline) {
			if why == "" {
				why = "settled"
			}
			ft.t.Fatalf("at %v the proxy did not settle with %d sessions held (%d held; %s; clients read every answer: %v)", ft.clock.Now(), held, n, why, ready == nil || ready())
		}
		poll.wait()
	}
}

// backoff paces a loop that polls for a state the proxy reaches on its
// own (settled, a tick run): the first polls come 50µs apart, for the
// common case of a state reached at once, then the pause doubles up to
// 2ms, so that a wait costs little CPU beside the tests running in
// parallel (a poll runs a function on every event loop). The zero value
// is ready to use.
type backoff struct{ pause time.Duration }

// wait sleeps the next pause.
func (b *backoff) wait() {
	switch {
	case b.pause == 0:
		b.pause = 50 * time.Microsecond
	case b.pause < 2*time.Millisecond:
		b.pause = min(2*b.pause, 2*time.Millisecond)
	}
	time.Sleep(b.pause)
}

// anyHeld, as fakeTime's held, settles with any number of sessions held.
const anyHeld = -1

// stepWhileHeld moves the clock by d each time the proxy is settled with
// a session held, until done is closed: the clients' commands beyond
// their budget are held on every run, whatever the machine's speed, and
// the clock never runs ahead of clients that are still sending.
func (ft *fakeTime) stepWhileHeld(d time.Duration, done <-chan struct{}) {
	ft.t.Helper()
	var poll backoff
	for {
		select {
		case <-done:
			return
		default:
		}
		if held, ok := settled(ft.t, ft.p); ok && held > 0 {
			ft.step(d, anyHeld, nil)
			poll = backoff{}
		} else {
			poll.wait()
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
	held, why := unsettled(t, p)
	return held, why == ""
}

// unsettled is settled with the first reason found that p is not
// settled ("" when it is), for a test's failure message.
func unsettled(t testing.TB, p *testProxy) (held int, why string) {
	return unsettledIn(t, p, false)
}

// dispatched waits until every loop of p has sent upstream all that the
// engine clock's reading admits, with commands still in flight allowed
// (memcached frozen: testmc.Server.Freeze), as settled says otherwise.
func dispatched(t testing.TB, p *testProxy) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var poll backoff
	for {
		_, why := unsettledIn(t, p, true)
		if why == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not dispatch what the clock admits: %s", why)
		}
		poll.wait()
	}
}

// unsettledIn is unsettled; with inFlight, commands in flight upstream
// (sent, not yet answered) do not count against it.
func unsettledIn(t testing.TB, p *testProxy, inFlight bool) (held int, why string) {
	onLoop(t, p, func(lp *loop) {
		now := lp.srv.throttle.Now()
		because := func(format string, args ...any) {
			if why == "" {
				why = fmt.Sprintf(format, args...)
			}
		}
		for _, e := range lp.holds {
			if e.live() && e.at <= now {
				because("a wake-up due at %v", e.at)
			}
		}
		switch {
		case len(lp.retry) > 0:
			because("%d sessions queued for a re-try", len(lp.retry))
		case len(lp.dirty) > 0:
			because("%d sessions queued for a flush", len(lp.dirty))
		case lp.leaseDue != 0 && lp.leaseDue <= now:
			because("lease stock due back at %v", lp.leaseDue)
		}
		for s := range lp.sessions {
			switch {
			case s.pending() > 0 && !inFlight || s.unsent() > 0:
				because("session %s: %d commands in flight, %d bytes unsent", s.remote, s.pending(), s.unsent())
			case s.isHeld():
				held++
			case s.pause == waitingCeiling:
				// Work in progress: upstream answers, a save of the
				// ceilings (real time).
				because("session %s waits for a raise of its ceiling", s.remote)
			case s.pause == waitingFlush:
				// Work in progress: the FLUSH's save (real time).
				because("session %s waits for its bucket's FLUSH", s.remote)
			case s.pause != running || !s.drained():
				because("session %s is %s (input drained: %v)", s.remote, pauseNames[s.pause], s.drained())
			}
		}
	})
	return held, why
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

// waitOpen waits until a loop of p has opened the session of client c
// (a dial returns once the kernel has accepted, before the loop knows of
// it: a fake-clock test that moves the clock before then moves it under
// a client that is not there yet).
func waitOpen(t testing.TB, p *testProxy, c net.Conn) {
	t.Helper()
	eventually(t, time.Minute, "the proxy opened the client's session", func() bool {
		open := false
		onLoop(t, p, func(lp *loop) { open = open || sessionOf(lp, c.LocalAddr()) != nil })
		return open
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

// admitted advances the proxy's fake clock by d and returns how many more
// commands bucket b admitted, once the proxy has done all the new reading
// allows (fakeTime: its one session held again, every wake-up due run).
func admitted(t *testing.T, p *testProxy, clock *throttle.FakeClock, b *throttle.Bucket, d time.Duration) uint64 {
	t.Helper()
	before := b.Stats().Commands
	(&fakeTime{t: t, p: p, clock: clock}).step(d, 1, nil)
	return b.Stats().Commands - before
}

// owingSlots counts the proxy's answers that wait for the excess of their
// surprise to be paid (session.owing).
func owingSlots(t testing.TB, p *testProxy) int {
	n := 0
	onLoop(t, p, func(lp *loop) {
		for s := range lp.sessions {
			n += s.owing
		}
	})
	return n
}

// sessionCount counts the proxy's open client sessions.
func sessionCount(t testing.TB, p *testProxy) int {
	n := 0
	onLoop(t, p, func(lp *loop) { n += len(lp.sessions) })
	return n
}

// answeredAll reports whether the client counting hits has read an
// answer for every read the proxy has billed bucket name: each read there
// is of a value of 1 unit (a fakeTime.settle ready function).
func answeredAll(t *testing.T, p *testProxy, name string, hits *atomic.Int64) func() bool {
	return func() bool { return hits.Load() == int64(bucketUnits(t, p, name).read) }
}
