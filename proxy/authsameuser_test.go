package proxy

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// Wrong passwords for a user from an address beside that user's own pool
// from the same address (issue 27 point 2: "penalise the credentials that
// failed, not the address's correct ones"), on the engine's fake clock with
// every bcrypt run counted as sameUserBcrypt: a failed check then costs
// the user at the address a penalty of sameUserPenalty (2 s).
const (
	sameUserBcrypt  = 50 * time.Millisecond
	sameUserPenalty = min(sameUserBcrypt*(failedAuthShare-1), maxFailedAuthPenalty)
	// livenessWait bounds, in real time, each wait for the proxy to reach
	// a state the fake clock allows (it stands meanwhile): real bcrypt
	// runs under race beside a CPU hog took over 10 s.
	livenessWait = 60 * time.Second
)

// queuedChecks is how many checks source src has queued, and how many of
// them wait over its first maxQueuedAuthPerSource (authwait.go).
func queuedChecks(p *testProxy, src string) (n, over int) {
	q := p.authQ
	q.mu.Lock()
	defer q.mu.Unlock()
	if as := q.sources[src]; as != nil {
		return len(as.jobs), as.over
	}
	return 0, 0
}

// waitingOn is how many logins wait for a check of user's password pass.
func waitingOn(p *testProxy, user, pass string) int {
	f := p.flights
	cred := f.credKey(user, pass)
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, fl := range f.m[cred] {
		n += len(fl.calls)
	}
	return n
}

// sendPool opens n connections from 127.0.0.1 and sends the pool user's
// login on each, without reading the answers.
func sendPool(t *testing.T, addr string, n int) []*rawConn {
	conns := make([]*rawConn, n)
	for i := range conns {
		conns[i] = dialFrom(t, addr, "127.0.0.1")
		_ = conns[i].c.SetDeadline(time.Now().Add(clientPatience))
		plainAuth(conns[i], poolUser, poolPass)
	}
	return conns
}

// readPool reads the answer of each pool connection: all must succeed.
func readPool(t *testing.T, conns []*rawConn, when string) {
	t.Helper()
	ok := 0
	for i, rc := range conns {
		if st := readAnswer(t, rc, fmt.Sprintf("pool login %d %s", i, when)); st == mc.StatusSuccess {
			ok++
		}
	}
	if ok != len(conns) {
		t.Fatalf("%s: %d of %d pool logins succeeded, want all", when, ok, len(conns))
	}
}

// poolAtPenaltyEnd checks that the pool logins sent on conns at 0, after a
// failure at 0, still wait at sameUserPenalty-1 and all log in at
// sameUserPenalty, the clock standing there.
func poolAtPenaltyEnd(t *testing.T, p *testProxy, clock *throttle.FakeClock, conns []*rawConn) {
	t.Helper()
	clock.Advance(sameUserPenalty - 1)
	if w := waitingOn(p, poolUser, poolPass); w != len(conns) {
		t.Fatalf("before the penalty ends, %d pool logins wait, want %d", w, len(conns))
	}
	clock.Advance(1)
	// The check runs now (bcrypt, slow under the race detector on a
	// loaded machine); the clock stands still meanwhile.
	eventually(t, 60*time.Second, "the pool's check to be answered", func() bool {
		return waitingOn(p, poolUser, poolPass) == 0
	})
	readPool(t, conns, "at the end of the penalty")
	if now := clock.Now(); now != sameUserPenalty {
		t.Fatalf("the pool logged in at %v, want %v", now, sameUserPenalty)
	}
}

// TestWrongPasswordFloodSparesSameUserPool: from 127.0.0.1, 8 connections
// send guess after guess (each a new wrong password) for the pool user,
// whose cold pool of 32 then logs in from the same address with the right
// password. The first guess fails at 0: the user at the address waits
// until sameUserPenalty for its next check, and each flooding connection
// has a guess queued for that turn, filling the source's
// maxQueuedAuthPerSource. The pool's login waits over them (one check
// for its 32 connections) and, the check most logins wait for, is served
// first at that turn: all 32 log in at exactly sameUserPenalty on the
// engine's clock, not after the queued guesses (each one more penalty).
// The flood stays paced: its next guess fails at that turn too, and the
// one after waits for a second penalty. Before the fix, the pool got
// Etmpfail at once (0 of 32): the source's bound was full of guesses.
func TestWrongPasswordFloodSparesSameUserPool(t *testing.T) {
	const pool, flooders = 32, 8
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{tail: poolTail(t)}, clock)
	p.fixedBcrypt.Store(int64(sameUserBcrypt))
	flood := startAttemptFlood(t, p.Addr, flooders, func(rc *rawConn, seq int64) (mc.Status, error) {
		st, _, err := rawExchange(rc, mc.OpSASLAuth, "PLAIN", fmt.Sprintf("\x00%s\x00wrong-%d", poolUser, seq))
		return st, err
	})
	src := authPair("127.0.0.1", poolUser)
	eventually(t, livenessWait, "one guess to fail and one of each flooding connection to be queued", func() bool {
		n, _ := queuedChecks(p, src)
		return flood.refused.Load() == 1 && n == flooders
	})
	armedAt(t, clock, sameUserPenalty) // the worker waits for the source's turn

	conns := sendPool(t, p.Addr, pool)
	eventually(t, livenessWait, "the pool's logins to wait for one check, over the guesses", func() bool {
		n, over := queuedChecks(p, src)
		return waitingOn(p, poolUser, poolPass) == pool && n == flooders+1 && over == 1
	})
	stillArmed(t, clock, sameUserPenalty)
	poolAtPenaltyEnd(t, p, clock, conns)
	eventually(t, livenessWait, "the flood's next guess to fail and the one after to wait for the next penalty", func() bool {
		return authCount(p.Server, "PLAIN", "failure") == 2 && slices.Contains(clock.Armed(), 2*sameUserPenalty)
	})
}

// TestWrongPasswordRotationSparesSameUserPool: the password rotation case.
// From 127.0.0.1, 8 connections keep sending the pool user's old password
// (an old instance's pool retrying), and the user's pool of 32 with the new
// one comes from the same address. The old password runs bcrypt once: it
// fails at 0, and the pool, cold, waits for that one failure's penalty and
// logs in at exactly sameUserPenalty. The old password, known wrong, is
// then refused again and again (the flood's connections are closed at
// their fifth refusal and reconnect) without another check and without a
// new penalty: a second pool logs in at once, with the clock standing
// still. Before the fix, each repeat was a bcrypt run and a new penalty,
// and the pool waited behind them.
func TestWrongPasswordRotationSparesSameUserPool(t *testing.T) {
	const pool, flooders = 32, 8
	var checks atomic.Int64
	testHookAuthAnswered = func() { checks.Add(1) }
	t.Cleanup(func() { testHookAuthAnswered = nil })
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{tail: poolTail(t)}, clock)
	p.fixedBcrypt.Store(int64(sameUserBcrypt))
	flood := startAttemptFlood(t, p.Addr, flooders, func(rc *rawConn, _ int64) (mc.Status, error) {
		st, _, err := rawExchange(rc, mc.OpSASLAuth, "PLAIN", "\x00"+poolUser+"\x00old-pw")
		return st, err
	})
	eventually(t, livenessWait, "the old password to fail", func() bool { return flood.refused.Load() >= 1 })

	conns := sendPool(t, p.Addr, pool)
	eventually(t, livenessWait, "the pool's logins to wait for one check", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	poolAtPenaltyEnd(t, p, clock, conns)

	// The flood goes on: every connection is refused five times and
	// replaced, twice over.
	const repeats = 2 * maxAuthFailures * flooders
	refusedBefore := flood.refused.Load()
	for deadline := time.Now().Add(clientPatience); flood.refused.Load() < refusedBefore+repeats; {
		if time.Now().After(deadline) {
			t.Fatalf("the old password was refused %d times in %v, want %d", flood.refused.Load()-refusedBefore, clientPatience, repeats)
		}
		clock.Advance(10 * time.Millisecond)
		time.Sleep(200 * time.Microsecond)
	}
	if n := checks.Load(); n != 2 {
		t.Errorf("%d password checks ran, want 2 (the old password's one and the pool's)", n)
	}
	if got, refused := authCount(p.Server, "PLAIN", "failure"), flood.refused.Load(); got < uint64(refused) {
		t.Errorf("%d failures counted for %d refusals of the wrong password", got, refused)
	}

	at := clock.Now()
	readPool(t, sendPool(t, p.Addr, pool), "beside the old password's flood")
	if now := clock.Now(); now != at {
		t.Errorf("the second pool logged in at %v, want %v (at once)", now, at)
	}
}
