package proxy

import (
	"crypto/sha256"
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestFailedCredsRemembered: a credential whose check failed is known
// wrong (join does not queue it) for the user with the same password_hash,
// until failedCredTTL after the failure; another password is not, nor the
// same one once the user's hash has changed or the user has appeared. At
// most maxFailedCreds are kept, the oldest failure going first.
func TestFailedCredsRemembered(t *testing.T) {
	t.Parallel()
	cfg, err := bucketcfg.Parse([]byte(testConfig{tail: tenantTail(t)}.render("127.0.0.1:1", []string{"127.0.0.1:2"},
		filepath.Join(t.TempDir(), "state.json"))))
	if err != nil {
		t.Fatal(err)
	}
	bob, alice := cfg.User("bob"), cfg.User("alice") // alice's hash stands for bob's after a change
	f := newAuthFlights()
	push := func(*authJob) bool { return true }
	at := time.Minute
	fail := func(user, pass string) {
		t.Helper()
		j := &authJob{user: user, pass: pass, who: cfg.User(user), at: at}
		if joinResultOf(f.join(&offLoopCall{}, j, "A/"+user, false, push)) != joined {
			t.Fatalf("%s's first try not queued", user)
		}
		j.cfg = cfg
		f.failed(j, at)
		f.finish(j.flight)
	}
	fail("bob", "guess")
	if !knownWrong(f.wrong("bob", "guess", bob, at)) || knownWrong(f.wrong("bob", "other", bob, at)) {
		t.Fatal("the failed password is not known wrong, or another one is")
	}
	again := &authJob{user: "bob", pass: "guess", who: bob, at: at}
	if r := joinResultOf(f.join(&offLoopCall{}, again, "B/bob", false, push)); r != joinWrong {
		t.Fatalf("join of a known wrong password: %v, want joinWrong", r)
	}
	if knownWrong(f.wrong("bob", "guess", alice, at)) || knownWrong(f.wrong("bob", "guess", bob, at)) {
		t.Error("known wrong after the user's password_hash changed")
	}
	fail("bob", "guess")
	if !knownWrong(f.wrong("bob", "guess", bob, at+failedCredTTL-1)) || knownWrong(f.wrong("bob", "guess", bob, at+failedCredTTL)) {
		t.Error("not remembered for failedCredTTL exactly")
	}
	fail("nobody", "guess")
	if !knownWrong(f.wrong("nobody", "guess", nil, at)) || knownWrong(f.wrong("nobody", "guess", bob, at)) {
		t.Error("an unknown user's failure: not known wrong, or still known once the user exists")
	}

	var b failedCreds
	cred := func(i int) (c [sha256.Size]byte) {
		binary.BigEndian.PutUint32(c[:], uint32(i))
		return c
	}
	for i := range maxFailedCreds + 1 {
		b.add(cred(i), bob, at, "A/bob")
	}
	if len(b.m) != maxFailedCreds || b.has(cred(0), bob, at) || !b.has(cred(1), bob, at) || !b.has(cred(maxFailedCreds), bob, at) {
		t.Errorf("%d remembered; want %d, the oldest gone", len(b.m), maxFailedCreds)
	}
}

// waitedJob is a check of user from address addr that n logins wait for.
func waitedJob(addr, user string, n int32) *authJob {
	j := pairJob(addr, user)
	j.flight = &authFlight{}
	j.flight.waiting.Store(n)
	return j
}

// TestAuthQueueServesMostWaitedFirst: past maxQueuedAuthPerSource checks,
// a source's next ones wait over them, counted in neither the address's
// nor the total bound; the worker serves a source's check most logins wait
// for first (ties: the oldest), and once a counted check is served the
// oldest check over takes its place in the counts.
func TestAuthQueueServesMostWaitedFirst(t *testing.T) {
	t.Parallel()
	q := newAuthQueue(throttle.NewFakeClock(0))
	now := time.Minute
	src := authPair("A", "pool")
	for range maxQueuedAuthPerSource {
		q.push(src, waitedJob("A", "guess", 1), now)
	}
	q.push(src, waitedJob("A", "late-guess", 1), now)
	q.push(src, waitedJob("A", "pool", 32), now)
	counts := func(n, over, addr int) {
		t.Helper()
		a := 0
		if e := q.addrs["A"]; e != nil {
			a = e.n
		}
		if q.n != n || q.over != over || a != addr {
			t.Fatalf("counted %d in all, %d over, %d for the address; want %d, %d, %d", q.n, q.over, a, n, over, addr)
		}
	}
	counts(maxQueuedAuthPerSource, 2, maxQueuedAuthPerSource)
	if j, _ := q.pop(now); j == nil || j.user != "pool" {
		t.Fatalf("served %v first, want the pool's check", j)
	}
	counts(maxQueuedAuthPerSource, 1, maxQueuedAuthPerSource)
	if j, _ := q.pop(now); j == nil || j.user != "guess" {
		t.Fatalf("served %v, want the oldest guess", j)
	}
	counts(maxQueuedAuthPerSource, 0, maxQueuedAuthPerSource) // late-guess counted in its place
	got := popUsers(t, q, now)
	if len(got) != maxQueuedAuthPerSource || got[len(got)-1] != "late-guess" {
		t.Fatalf("served %v, want the guesses oldest first", got)
	}
	counts(0, 0, 0)
}

// knownWrong is wrong's answer without the source.
func knownWrong(bad bool, _ string) bool { return bad }
