package proxy

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// A user's logins at one address beside guesses at that user from the
// same address (issue 27 point 2: "penalise the credentials that failed,
// not the address's correct ones"), attacked as an attacker at the pool's
// own address would, on the engine's fake clock. The other side of the
// rule, floods and rotations, is in authsameuser_test.go.

// startGuessProxy starts a proxy configured by tc on a fake engine clock,
// each bcrypt run counted as sameUserBcrypt.
func startGuessProxy(t *testing.T, tc testConfig) (*testProxy, *throttle.FakeClock) {
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, tc, clock)
	p.fixedBcrypt.Store(int64(sameUserBcrypt))
	return p, clock
}

// sendGuess opens n connections from 127.0.0.1 that each present the
// pool user's wrong password pw, without reading the answers.
func sendGuess(t *testing.T, addr, pw string, n int) []*rawConn {
	conns := make([]*rawConn, n)
	for i := range conns {
		conns[i] = dialFrom(t, addr, "127.0.0.1")
		plainAuth(conns[i], poolUser, pw)
	}
	return conns
}

// closeAll closes the client side of each connection.
func closeAll(conns []*rawConn) {
	for _, rc := range conns {
		_ = rc.c.Close()
	}
}

// failFirstGuess sends one wrong password for the pool user and waits for
// it to fail: the user at 127.0.0.1 is penalised until sameUserPenalty.
func failFirstGuess(t *testing.T, p *testProxy) {
	t.Helper()
	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, livenessWait, "the first guess to fail", func() bool {
		return authCount(p.Server, "PLAIN", "failure") == 1
	})
}

// TestPenalisedSourceServesMostConnectionsFirst: at each turn of a user at
// an address under penalty, the check the most connections wait for goes
// first (authwait.go). A guess that an attacker at the pool's address
// presents on one more connection than the cold pool has goes before it,
// turn after turn: the documented limit (a pool's login and such a guess
// look alike; the guessing rate stays one per turn,
// TestRepeatedGuessOneCheckPerPenalty). At the first turn where no guess
// has more connections, the pool logs in, all of it.
func TestPenalisedSourceServesMostConnectionsFirst(t *testing.T) {
	const pool = 32
	p, clock := startGuessProxy(t, testConfig{tail: poolTail(t)})

	// A first guess fails at 0: the user at the address is penalised
	// until sameUserPenalty.
	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, livenessWait, "the first guess to fail", func() bool {
		return waitingOn(p, poolUser, "guess-0") == 0 && authCount(p.Server, "PLAIN", "failure") == 1
	})
	conns := sendPool(t, p.Addr, pool)
	eventually(t, livenessWait, "the pool's logins to wait for one check", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	for k, n := range []int{pool + 1, pool + 1, pool - 1} {
		guess := fmt.Sprintf("guess-%d", k+1)
		sendGuess(t, p.Addr, guess, n)
		eventually(t, livenessWait, guess+"'s logins to wait", func() bool {
			return waitingOn(p, poolUser, guess) == n
		})
		clock.Advance(sameUserPenalty)
		eventually(t, livenessWait, "the check of the source's turn to be answered", func() bool {
			return waitingOn(p, poolUser, guess) == 0 || waitingOn(p, poolUser, poolPass) == 0
		})
		poolServed := waitingOn(p, poolUser, poolPass) == 0
		if want := n < pool; poolServed != want {
			t.Fatalf("turn %d (%v): the pool of %d served %v beside %s on %d connections, want %v",
				k+1, clock.Now(), pool, poolServed, guess, n, want)
		}
	}
	readPool(t, conns, "at the first turn with no guess on more connections")
}

// TestSameUserPoolLogsInBesideManyGuesses: 128 distinct guesses at the
// pool user, each presented on two connections the attacker holds, at the
// pool's address (when a user's places at an address were 64, half of
// these filled them with checks nobody could displace, and the pool got
// Etmpfail, every login); the cold pool of 32 that comes next from the
// same address waits, and logs in whole at the source's next turn: its
// check is the one most connections wait for.
func TestSameUserPoolLogsInBesideManyGuesses(t *testing.T) {
	const pool, guesses = 32, 128
	p, clock := startGuessProxy(t, testConfig{tail: poolTail(t)})
	src := authPair("127.0.0.1", poolUser)

	failFirstGuess(t, p)
	for i := range guesses {
		sendGuess(t, p.Addr, fmt.Sprintf("guess-%d", i+1), 2)
	}
	eventually(t, livenessWait, "the guesses to wait", func() bool {
		n, _ := queuedChecks(p, src)
		return n == guesses
	})
	conns := sendPool(t, p.Addr, pool)
	eventually(t, livenessWait, "the pool's logins to wait", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	if n := authCount(p.Server, "PLAIN", "refused"); n != 0 {
		t.Fatalf("%d logins refused, want none", n)
	}
	clock.Advance(sameUserPenalty)
	readPool(t, conns, fmt.Sprintf("beside %d guesses waiting", guesses))
}

// TestSameUserPoolNotLockedOutByPinnedLogins: a penalised source's check
// may have maxPenalisedWaiters (64) connections waiting on it, so one
// address can fill its share of unauthenticated connections
// (unauthSourceLimit, 45 here) with one guess at one user repeated on
// every connection. Those connections wait on a penalised check and may be
// closed for another such login (evictRank): the address's next
// connection, the user's own correct pool, takes the place of one of them,
// waits its turn and logs in. When connections waiting on any check were
// never evicted, the pool's connection was closed at once.
func TestSameUserPoolNotLockedOutByPinnedLogins(t *testing.T) {
	const maxConns = 200 // share 180 on the one loop, a source 45
	p, clock := startGuessProxy(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 200", tail: poolTail(t), loops: 1})
	limit := unauthSourceLimit(int(unauthLimit(maxConns)))

	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, livenessWait, "the first guess to fail", func() bool {
		return authCount(p.Server, "PLAIN", "failure") == 1
	})
	// The refused first connection is evicted by the last of these.
	sendGuess(t, p.Addr, "guess-1", limit)
	eventually(t, livenessWait, "the source's share to wait on one check", func() bool {
		return waitingOn(p, poolUser, "guess-1") == limit
	})
	conns := sendPool(t, p.Addr, 1)
	eventually(t, livenessWait, "the pool's login to wait its turn", func() bool {
		return waitingOn(p, poolUser, poolPass) == 1
	})
	clock.Advance(sameUserPenalty) // guess-1 fails
	eventually(t, livenessWait, "guess-1 to be answered", func() bool {
		return waitingOn(p, poolUser, "guess-1") == 0
	})
	clock.Advance(sameUserPenalty) // the pool's turn
	readPool(t, conns, fmt.Sprintf("beside %d connections waiting on one guess", limit))
}

// TestRepeatedGuessOneCheckPerPenalty: an attacker at one address
// presenting each guess at a user on 40 connections (to be served first,
// authwait.go) still gets one check per penalty: a guess fails at 0, two
// more wait on 40 connections each, and the second is checked only at
// sameUserPenalty, the third only at twice that.
func TestRepeatedGuessOneCheckPerPenalty(t *testing.T) {
	const conns = 40
	var checks atomic.Int64
	testHookAuthAnswered = func() { checks.Add(1) }
	t.Cleanup(func() { testHookAuthAnswered = nil })
	p, clock := startGuessProxy(t, testConfig{tail: poolTail(t)})

	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, livenessWait, "the first guess to be checked", func() bool { return checks.Load() == 1 })
	sendGuess(t, p.Addr, "guess-1", conns)
	sendGuess(t, p.Addr, "guess-2", conns)
	eventually(t, livenessWait, "the guesses to wait", func() bool {
		return waitingOn(p, poolUser, "guess-1") == conns && waitingOn(p, poolUser, "guess-2") == conns
	})
	for k := int64(1); k <= 2; k++ {
		clock.Advance(sameUserPenalty - 1)
		if n := checks.Load(); n != k {
			t.Fatalf("at %v, %d checks ran, want %d", clock.Now(), n, k)
		}
		clock.Advance(1)
		eventually(t, livenessWait, "the next guess to be checked", func() bool { return checks.Load() == k+1 })
		if k == 1 { // guess-2 waits a whole penalty
			armedAt(t, clock, clock.Now()+sameUserPenalty)
		}
	}
}

// TestClosedGuessesAreWithdrawn: a login whose connection closes leaves
// its check, and a check no login waits for is withdrawn, not run. An
// attacker that presents 64 distinct guesses at the pool user on two
// connections each and closes them at once (which, when closed logins
// still counted, filled the user's 64 places at the address with checks
// nobody could displace: the cold pool got Etmpfail, 32 of 32) leaves
// nothing queued; the pool logs in whole at the next turn, and no guess
// was checked.
func TestClosedGuessesAreWithdrawn(t *testing.T) {
	const pool, guesses = 32, 64
	var checks atomic.Int64
	testHookAuthAnswered = func() { checks.Add(1) }
	t.Cleanup(func() { testHookAuthAnswered = nil })
	p, clock := startGuessProxy(t, testConfig{tail: poolTail(t)})
	src := authPair("127.0.0.1", poolUser)

	failFirstGuess(t, p)
	for i := range guesses {
		conns := sendGuess(t, p.Addr, fmt.Sprintf("guess-%d", i+1), 2)
		guess := fmt.Sprintf("guess-%d", i+1)
		eventually(t, livenessWait, guess+" to wait", func() bool { return waitingOn(p, poolUser, guess) == 2 })
		closeAll(conns)
	}
	eventually(t, livenessWait, "the closed guesses to be withdrawn", func() bool {
		n, _ := queuedChecks(p, src)
		return n == 0
	})
	conns := sendPool(t, p.Addr, pool)
	eventually(t, livenessWait, "the pool's logins to wait", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	clock.Advance(sameUserPenalty)
	readPool(t, conns, "after the closed guesses")
	if n := checks.Load(); n != 2 {
		t.Fatalf("%d checks ran, want 2: the first guess and the pool's", n)
	}
}

// TestClosedGuessConnectionsDoNotCount: the order "most connections
// first" counts the logins still waiting. A guess presented on pool+1
// connections that then close goes no longer before the waiting pool:
// the pool logs in at the first turn. (When closed logins still counted,
// the documented limit cost an attacker connections opened, none held.)
func TestClosedGuessConnectionsDoNotCount(t *testing.T) {
	const pool = 32
	p, clock := startGuessProxy(t, testConfig{tail: poolTail(t)})

	failFirstGuess(t, p)
	conns := sendPool(t, p.Addr, pool)
	eventually(t, livenessWait, "the pool's logins to wait", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	guess := sendGuess(t, p.Addr, "guess-1", pool+1)
	eventually(t, livenessWait, "the guess to wait", func() bool {
		return waitingOn(p, poolUser, "guess-1") == pool+1
	})
	closeAll(guess)
	eventually(t, livenessWait, "the closed logins to leave", func() bool {
		return waitingOn(p, poolUser, "guess-1") == 0
	})
	clock.Advance(sameUserPenalty)
	readPool(t, conns, "at the first turn")
}

// TestPenalisedPoolWaitersOutlastOtherConnections: a pool that arrives
// while its user at its address is penalised waits its turn; connections
// of its address that merely send a frame rank before it for eviction
// (evictRank), so an attacker opening the address's whole share of them
// (45 at max_connections 200, one loop) closes its own, not the pool's.
// When the pool's waiting connections ranked as any other, all 32 were
// closed before their turn. Each pool login is answered.
func TestPenalisedPoolWaitersOutlastOtherConnections(t *testing.T) {
	const pool, maxConns = 32, 200
	p, clock := startGuessProxy(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 200", tail: poolTail(t), loops: 1})
	limit := unauthSourceLimit(int(unauthLimit(maxConns)))

	failFirstGuess(t, p)
	conns := sendPool(t, p.Addr, pool)
	eventually(t, livenessWait, "the pool's logins to wait", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	for range limit {
		rc := dialFrom(t, p.Addr, "127.0.0.1")
		rc.send(mc.OpNoop, nil, nil, nil)
		if st := readAnswer(t, rc, "noop"); st != mc.StatusSuccess {
			t.Fatalf("noop: %v", st)
		}
	}
	clock.Advance(sameUserPenalty)
	readPool(t, conns, fmt.Sprintf("beside %d connections of its address", limit))
}

// TestKnownWrongElsewherePenalisesItsSource: a password whose check failed
// for a login from one address is refused without a check from another,
// answered a bcrypt run's time later as a check would be, and puts that
// other address's user under the penalty the check's failure would have:
// its next, new guess waits until then. A guesser thus cannot tell, from
// the pace of its guesses, that someone else tried that password (an old
// one, after a rotation). From the address whose check failed, the same
// password again adds no penalty: old instances retrying slow nobody.
func TestKnownWrongElsewherePenalisesItsSource(t *testing.T) {
	var checks atomic.Int64
	testHookAuthAnswered = func() { checks.Add(1) }
	t.Cleanup(func() { testHookAuthAnswered = nil })
	p, clock := startGuessProxy(t, testConfig{proxy: `plain_auth = "anywhere"`, tail: poolTail(t)})
	first, other := authPair("127.0.0.2", poolUser), authPair("127.0.0.3", poolUser)

	old := dialFrom(t, p.Addr, "127.0.0.2")
	plainAuth(old, poolUser, "old")
	if st := readAnswer(t, old, "the old password's check"); st != mc.StatusAuthError {
		t.Fatalf("the old password: %v, want AuthError", st)
	}
	eventually(t, livenessWait, "the check to be counted", func() bool { return checks.Load() == 1 })
	if got := p.authQ.turn(first, "127.0.0.2"); got != sameUserPenalty {
		t.Fatalf("the first address's next check at %v, want %v", got, sameUserPenalty)
	}
	retry := dialFrom(t, p.Addr, "127.0.0.2") // where it failed
	plainAuth(retry, poolUser, "old")
	elsewhere := dialFrom(t, p.Addr, "127.0.0.3")
	plainAuth(elsewhere, poolUser, "old")
	// Answered one bcrypt run from now (elsewhere), and at the first
	// address's next turn plus one (the retry).
	armedAt(t, clock, sameUserBcrypt, sameUserPenalty+sameUserBcrypt)
	clock.Advance(sameUserBcrypt)
	if st := readAnswer(t, elsewhere, "the old password elsewhere"); st != mc.StatusAuthError {
		t.Fatalf("the old password elsewhere: %v, want AuthError", st)
	}
	if got, want := p.authQ.turn(other, "127.0.0.3"), sameUserBcrypt+sameUserPenalty; got != want {
		t.Fatalf("elsewhere, the next check at %v, want %v: the penalty of a failed check", got, want)
	}
	if got := p.authQ.turn(first, "127.0.0.2"); got != sameUserPenalty {
		t.Fatalf("the retry moved its address's next check to %v, want %v", got, sameUserPenalty)
	}
	if n := checks.Load(); n != 1 {
		t.Fatalf("%d checks ran, want 1", n)
	}
	clock.Advance(sameUserPenalty) // the retry's answer (else the proxy's stop waits for it)
	if st := readAnswer(t, retry, "the retry where it failed"); st != mc.StatusAuthError {
		t.Fatalf("the retry: %v, want AuthError", st)
	}
}

// TestClosedWaitingLoginsLeaveNoCheckNorJob: logins waiting on a
// penalised user at an address leave their checks when their connections
// close, however many (here 2000 distinct guesses, one connection each,
// closed at once): every check is withdrawn, the queue's counts return to
// zero, and the off-loop job count a graceful shutdown waits for returns
// to zero without the clock moving (no check ran, none waits for a turn).
func TestClosedWaitingLoginsLeaveNoCheckNorJob(t *testing.T) {
	const n = 2000
	p, _ := startGuessProxy(t, testConfig{tail: poolTail(t)})
	src := authPair("127.0.0.1", poolUser)
	failFirstGuess(t, p)
	var conns []*rawConn
	for i := range n {
		conns = append(conns, sendGuess(t, p.Addr, fmt.Sprintf("guess-%d", i+1), 1)...)
	}
	eventually(t, livenessWait, "the guesses to wait", func() bool { k, _ := queuedChecks(p, src); return k == n })
	closeAll(conns)
	eventually(t, livenessWait, "the closed guesses to be withdrawn", func() bool {
		q := p.authQ
		q.mu.Lock()
		defer q.mu.Unlock()
		as := q.sources[src]
		return (as == nil || len(as.jobs) == 0) && q.n == 0 && q.over == 0
	})
	done := make(chan struct{})
	go func() { p.jobs.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(livenessWait):
		t.Fatal("the off-loop job count never returned to zero: a graceful shutdown would hang")
	}
}

// TestPenalisedPoolWaitersOutlastTheirAddressPastTheScan: a login waiting
// its turn under a penalty is closed to admit a new connection of its
// address only when all the address's other unauthenticated connections
// wait that way too (docs/operations.md, "Password guessing"; evictRank).
// That holds however many unauthenticated connections of other addresses
// are older than the pool: here 250 connections of 127.0.0.2, then the
// cold pool of 32 from 127.0.0.1 waiting on its penalised user, then
// connections of 127.0.0.1 that merely send a NOOP, up to the address's
// share and 40 past it. The pool must all log in at its turn.
func TestPenalisedPoolWaitersOutlastTheirAddressPastTheScan(t *testing.T) {
	const pool, maxConns, others = 32, 2000, 250
	p, clock := startGuessProxy(t, testConfig{proxy: fmt.Sprintf("default_bucket = \"\"\nmax_connections = %d", maxConns),
		tail: poolTail(t), loops: 1})
	limit := unauthSourceLimit(int(unauthLimit(maxConns)))

	failFirstGuess(t, p)
	for range others {
		rc := dialFrom(t, p.Addr, "127.0.0.2")
		rc.send(mc.OpNoop, nil, nil, nil)
		if st := readAnswer(t, rc, "noop of 127.0.0.2"); st != mc.StatusSuccess {
			t.Fatalf("noop: %v", st)
		}
	}
	conns := sendPool(t, p.Addr, pool)
	eventually(t, livenessWait, "the pool's logins to wait", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	for range limit + 40 {
		rc := dialFrom(t, p.Addr, "127.0.0.1")
		rc.send(mc.OpNoop, nil, nil, nil)
		if st := readAnswer(t, rc, "noop of 127.0.0.1"); st != mc.StatusSuccess {
			t.Fatalf("noop: %v", st)
		}
	}
	clock.Advance(sameUserPenalty)
	ok, closed := 0, 0
	for _, rc := range conns {
		switch st, _, err := rc.read(); {
		case err != nil:
			closed++
		case st == mc.StatusSuccess:
			ok++
		}
	}
	if ok != pool {
		t.Fatalf("beside %d older connections of 127.0.0.2 and %d of its own address: %d of %d pool logins succeeded, %d connections closed",
			others, limit+40, ok, pool, closed)
	}
}
