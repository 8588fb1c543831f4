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

// TestSameUserPoolNotOutnumberedByRepeatedGuess (issue 27 point 2 review):
// the worker serves a source's check that most logins wait for first
// (authwait.go), so that a pool "waits at most for the source's next turn".
// An attacker at the pool's address presents each guess at the pool user
// on one more connection than the pool has (33 for a pool of 32; up to
// maxPenalisedWaiters, 64, fit one check): at every turn its guess
// outnumbers the pool's check and is served first, and the cold pool
// waits turn after turn, past auth_timeout (10 s, 5 turns), though only
// one guess per turn is checked (the guessing rate is not raised).
func TestSameUserPoolNotOutnumberedByRepeatedGuess(t *testing.T) {
	t.Skip("issue 27 review: a guess repeated on pool+1 connections is served before the pool at every turn (fake clock: pool of 32 still waiting after 3 turns, 6 s; real proxy + pylibmc, 40 connections per guess: pool 0/32 within auth_timeout 10 s, also with the cache warm; guessing rate unchanged, 1 per 2.07 s)")
	const pool, turns = 32, 3
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
	for k := 1; k <= turns; k++ {
		guess := fmt.Sprintf("guess-%d", k)
		sendGuess(t, p.Addr, guess, pool+1)
		eventually(t, review27Wait, guess+"'s logins to wait", func() bool {
			return waitingOn(p, poolUser, guess) == pool+1
		})
		clock.Advance(sameUserPenalty)
		eventually(t, review27Wait, "the check of the source's turn to be answered", func() bool {
			return waitingOn(p, poolUser, guess) == 0 || waitingOn(p, poolUser, poolPass) == 0
		})
		if waitingOn(p, poolUser, poolPass) == 0 {
			readPool(t, conns, fmt.Sprintf("at turn %d", k))
			if k != 1 {
				t.Fatalf("the pool logged in at turn %d (%v), want its source's next turn", k, clock.Now())
			}
			return
		}
		t.Logf("turn %d at %v: %s (%d connections) checked before the pool (%d connections still waiting)",
			k, clock.Now(), guess, pool+1, waitingOn(p, poolUser, poolPass))
	}
	t.Fatalf("after %d turns (%v on the engine's clock) the pool of %d has not been checked: each turn served a guess presented on %d connections",
		turns, clock.Now(), pool, pool+1)
}

// TestSameUserPoolNotRefusedBesideFullSource (issue 27 point 2 review):
// 64 connections at the pool's address each present a distinct guess at
// the pool user (maxWaitingAuthPerSource checks, the first failing at 0):
// the user at the address has no room left, and the cold pool of 32 that
// comes next from the same address gets Etmpfail at once, every one of
// its logins, though its one check would cost one turn. The same holds
// with the password cache warm: a login of a penalised source does not
// use it.
func TestSameUserPoolNotRefusedBesideFullSource(t *testing.T) {
	t.Skip("issue 27 review: 64 distinct guesses at the user from the address fill maxWaitingAuthPerSource and the cold pool gets Etmpfail at once (fake clock: 0 of 32; real proxy + pylibmc: 8 flooders 32/32 at p50 1.2 s, 64 flooders 0/32 refused in 0.03 s)")
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
	eventually(t, review27Wait, "the pool's logins to be answered or wait", func() bool {
		return waitingOn(p, poolUser, poolPass) == pool || authCount(p.Server, "PLAIN", "refused") == pool
	})
	clock.Advance(sameUserPenalty)
	readPool(t, conns, fmt.Sprintf("beside %d guesses queued", maxWaitingAuthPerSource))
}

// TestSameUserPoolNotLockedOutByPinnedLogins (issue 27 point 2 review):
// connections whose password is being checked are never evicted
// (evictRank), and a penalised source's check may have
// maxPenalisedWaiters (64) of them, its user maxWaitingAuthPerSource (64)
// checks: one address can hold its whole share of unauthenticated
// connections (unauthSourceLimit, 45 here) with one guess at one user
// repeated on every connection. The address's next connection, the
// user's own correct pool, is then closed at once instead of waiting for
// its turn. Before the flights, a source held at most 9 connections in a
// check (one running, maxQueuedAuthPerSource queued; more got Etmpfail and
// could be evicted).
func TestSameUserPoolNotLockedOutByPinnedLogins(t *testing.T) {
	t.Skip("issue 27 review: connections waiting on a penalised check are not evictable and one guess may hold 64 of them (its user 64x64): 45 connections on one guess hold the address's unauthenticated share and the pool's connection is reset at connect (real proxy, max_connections 200: 120 pinned, 44 held, pool 0/32 CONNECTION FAILURE)")
	const maxConns = 200 // share 180 on the one loop, a source 45
	p, clock := startReviewProxy(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 200", tail: poolTail(t), loops: 1})
	limit := unauthSourceLimit(int(unauthLimit(maxConns)))

	sendGuess(t, p.Addr, "guess-0", 1)
	eventually(t, review27Wait, "the first guess to fail", func() bool {
		return authCount(p.Server, "PLAIN", "failure") == 1
	})
	// The refused first connection is evicted by the last of these.
	sendGuess(t, p.Addr, "guess-1", limit+1)
	eventually(t, review27Wait, "the source's share to wait on one check", func() bool {
		return waitingOn(p, poolUser, "guess-1") == limit
	})
	conns := sendPool(t, p.Addr, 1)
	clock.Advance(sameUserPenalty) // guess-1 fails
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
