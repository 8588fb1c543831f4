package proxy

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// review27Wait bounds, in real time, each wait for a state the fake clock
// allows (bcrypt under race on a loaded machine).
const review27Wait = 60 * time.Second

// startReviewProxy starts a proxy configured by tc on a fake engine clock,
// each bcrypt run counted as sameUserBcrypt.
func startReviewProxy(t *testing.T, tc testConfig) (*testProxy, *throttle.FakeClock) {
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

// TestPenalisedSourceServesMostConnectionsFirst (issue 27 point 2
// review): at each turn of a user at an address under penalty, the check
// the most connections wait for goes first (authwait.go). A guess that an
// attacker at the pool's address presents on one more connection than the
// cold pool has goes before it, turn after turn: the documented limit (a
// pool's login and such a guess look alike; the guessing rate stays one
// per turn, TestRepeatedGuessOneCheckPerPenalty). At the first turn where
// no guess has more connections, the pool logs in, all of it.
func TestPenalisedSourceServesMostConnectionsFirst(t *testing.T) {
	const pool = 32
	p, clock := startReviewProxy(t, testConfig{tail: poolTail(t)})

	// A first guess fails at 0: the user at the address is penalised
	// until sameUserPenalty.
	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, review27Wait, "the first guess to fail", func() bool {
		return waitingOn(p, poolUser, "guess-0") == 0 && authCount(p.Server, "PLAIN", "failure") == 1
	})
	conns := sendPool(t, p.Addr, pool)
	eventually(t, review27Wait, "the pool's logins to wait for one check", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	for k, n := range []int{pool + 1, pool + 1, pool - 1} {
		guess := fmt.Sprintf("guess-%d", k+1)
		sendGuess(t, p.Addr, guess, n)
		eventually(t, review27Wait, guess+"'s logins to wait", func() bool {
			return waitingOn(p, poolUser, guess) == n
		})
		clock.Advance(sameUserPenalty)
		eventually(t, review27Wait, "the check of the source's turn to be answered", func() bool {
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

// TestSameUserPoolNotRefusedBesideFullSource (issue 27 point 2 review):
// 64 connections at the pool's address each present a distinct guess at
// the pool user (maxWaitingAuthPerSource checks, the first failing at 0):
// the user at the address has no room left. The cold pool of 32 that
// comes next from the same address displaces the oldest guess (refused
// Etmpfail, authQueue.admit), waits, and logs in whole at the source's
// next turn. Before admit, every one of its logins got Etmpfail at once.
func TestSameUserPoolNotRefusedBesideFullSource(t *testing.T) {
	const pool = 32
	p, clock := startReviewProxy(t, testConfig{tail: poolTail(t)})
	src := authPair("127.0.0.1", poolUser)

	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, review27Wait, "the first guess to fail", func() bool {
		return authCount(p.Server, "PLAIN", "failure") == 1
	})
	for i := range maxWaitingAuthPerSource {
		sendGuess(t, p.Addr, fmt.Sprintf("guess-%d", i+1), 1)
	}
	eventually(t, review27Wait, "the guesses to fill the source", func() bool {
		n, _ := queuedChecks(p, src)
		return n == maxWaitingAuthPerSource
	})
	conns := sendPool(t, p.Addr, pool)
	eventually(t, review27Wait, "the pool's logins to wait", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool
	})
	if n := authCount(p.Server, "PLAIN", "refused"); n != 1 {
		t.Fatalf("%d logins refused, want 1: the oldest guess, displaced", n)
	}
	clock.Advance(sameUserPenalty)
	readPool(t, conns, fmt.Sprintf("beside %d guesses queued", maxWaitingAuthPerSource))
}

// TestSameUserPoolNotLockedOutByPinnedLogins (issue 27 point 2 review): a
// penalised source's check may have maxPenalisedWaiters (64) connections
// waiting on it, so one address can fill its share of unauthenticated
// connections (unauthSourceLimit, 45 here) with one guess at one user
// repeated on every connection. Those connections wait on a penalised
// check and may be closed (evictRank): the address's next connection, the
// user's own correct pool, takes the place of one of them, waits its turn
// and logs in. Before, connections waiting on any check were never
// evicted, and the pool's connection was closed at once.
func TestSameUserPoolNotLockedOutByPinnedLogins(t *testing.T) {
	const maxConns = 200 // share 180 on the one loop, a source 45
	p, clock := startReviewProxy(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 200", tail: poolTail(t), loops: 1})
	limit := unauthSourceLimit(int(unauthLimit(maxConns)))

	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, review27Wait, "the first guess to fail", func() bool {
		return authCount(p.Server, "PLAIN", "failure") == 1
	})
	// The refused first connection is evicted by the last of these.
	sendGuess(t, p.Addr, "guess-1", limit)
	eventually(t, review27Wait, "the source's share to wait on one check", func() bool {
		return waitingOn(p, poolUser, "guess-1") == limit
	})
	conns := sendPool(t, p.Addr, 1)
	eventually(t, review27Wait, "the pool's login to wait its turn", func() bool {
		return waitingOn(p, poolUser, poolPass) == 1
	})
	clock.Advance(sameUserPenalty) // guess-1 fails
	eventually(t, review27Wait, "guess-1 to be answered", func() bool {
		return waitingOn(p, poolUser, "guess-1") == 0
	})
	clock.Advance(sameUserPenalty) // the pool's turn
	readPool(t, conns, fmt.Sprintf("beside %d connections waiting on one guess", limit))
}

// TestRepeatedGuessOneCheckPerPenalty (issue 27 point 2 review, held): an
// attacker at one address presenting each guess at a user on 40
// connections (to be served first, authwait.go) still gets one check per
// penalty: a guess fails at 0, two more wait on 40 connections each, and
// the second is checked only at sameUserPenalty, the third only at twice
// that.
func TestRepeatedGuessOneCheckPerPenalty(t *testing.T) {
	const conns = 40
	var checks atomic.Int64
	testHookAuthAnswered = func() { checks.Add(1) }
	t.Cleanup(func() { testHookAuthAnswered = nil })
	p, clock := startReviewProxy(t, testConfig{tail: poolTail(t)})

	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, review27Wait, "the first guess to be checked", func() bool { return checks.Load() == 1 })
	sendGuess(t, p.Addr, "guess-1", conns)
	sendGuess(t, p.Addr, "guess-2", conns)
	eventually(t, review27Wait, "the guesses to wait", func() bool {
		return waitingOn(p, poolUser, "guess-1") == conns && waitingOn(p, poolUser, "guess-2") == conns
	})
	for k := int64(1); k <= 2; k++ {
		clock.Advance(sameUserPenalty - 1)
		if n := checks.Load(); n != k {
			t.Fatalf("at %v, %d checks ran, want %d", clock.Now(), n, k)
		}
		clock.Advance(1)
		eventually(t, review27Wait, "the next guess to be checked", func() bool { return checks.Load() == k+1 })
		if k == 1 { // guess-2 waits a whole penalty
			armedAt(t, clock, clock.Now()+sameUserPenalty)
		}
	}
}
