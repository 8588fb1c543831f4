package proxy

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// jobWaitedOn is a check of user with n logins waiting for it, from
// address addr.
func jobWaitedOn(user, addr string, n int32) *authJob {
	fl := &authFlight{}
	fl.waiting.Store(n)
	return &authJob{user: user, addr: addr, flight: fl}
}

// A login whose source's checks fill maxWaitingAuthPerSource displaces the
// oldest check one login waits for, never one that more wait for; the
// bounds' counts stay those of the checks queued, and with no check to
// displace the login is refused.
func TestAdmitDisplacesOldestSingleLogin(t *testing.T) {
	t.Parallel()
	// Without -race only (PROXY_NORACE_TESTS): one goroutine calls the
	// queue, so the race detector can find nothing here, and its 4,096
	// displacements and pops, each a scan of the source's checks, took
	// 36 s of the race pass. The queue's locking runs under -race in
	// TestAuthQueueWorker and the auth flood tests.
	testmc.SkipUnderRace(t)
	q := newAuthQueue(throttle.NewFakeClock(0))
	now := time.Minute
	// A pool's check (3 logins) among the source's first, then guesses.
	if !q.push("A/u", jobWaitedOn("pool", "A", 3), now) {
		t.Fatal("the pool's check refused")
	}
	for i := 1; i < maxWaitingAuthPerSource; i++ {
		if !q.push("A/u", jobWaitedOn(fmt.Sprintf("g%d", i), "A", 1), now) {
			t.Fatalf("guess %d refused", i)
		}
	}
	if q.push("A/u", jobWaitedOn("late", "A", 1), now) {
		t.Fatal("push past maxWaitingAuthPerSource taken")
	}
	n, over, addrN := q.n, q.over, q.addrs["A"].n
	for i := 1; i <= maxWaitingAuthPerSource-1; i++ {
		ok, out := q.admit("A/u", jobWaitedOn(fmt.Sprintf("new%d", i), "A", 1), now)
		if want := fmt.Sprintf("g%d", i); !ok || out == nil || out.user != want {
			t.Fatalf("admit %d: taken %v, displaced %v, want %s displaced", i, ok, out, want)
		}
	}
	if q.n != n || q.over != over || q.addrs["A"].n != addrN || len(q.sources["A/u"].jobs) != maxWaitingAuthPerSource {
		t.Fatalf("counts %d/%d/%d, %d jobs; want %d/%d/%d, %d", q.n, q.over, q.addrs["A"].n,
			len(q.sources["A/u"].jobs), n, over, addrN, maxWaitingAuthPerSource)
	}
	// Every guess is now newer than the pool's check: the oldest single
	// login's check goes next, the pool's stays.
	if _, out := q.admit("A/u", jobWaitedOn("x", "A", 2), now); out == nil || out.user != "new1" {
		t.Fatalf("displaced %v, want new1", out)
	}
	got := popUsers(t, q, now)
	if got[0] != "pool" || len(got) != maxWaitingAuthPerSource {
		t.Fatalf("served %v: want the pool first, %d in all", got, maxWaitingAuthPerSource)
	}

	// A full source of checks that two logins wait for each: refused.
	for i := 0; i < maxWaitingAuthPerSource; i++ {
		q.push("B/u", jobWaitedOn("b", "B", 2), now)
	}
	if ok, out := q.admit("B/u", jobWaitedOn("new", "B", 1), now); ok || out != nil {
		t.Fatalf("admit beside checks of two logins each: taken %v, displaced %v", ok, out)
	}
}
