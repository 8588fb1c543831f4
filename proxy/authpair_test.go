package proxy

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// pairJob is a check of user from address addr, as the proxy queues it.
func pairJob(addr, user string) *authJob { return &authJob{user: user, addr: addr} }

// TestAuthPairPenalty: a wrong password penalises its user at its address,
// not the address's other users nor the user's logins from elsewhere; an
// address failing on more than maxFailingUsersPerAddr users at once is
// penalised as a whole; one address queues at most maxQueuedAuthPerAddr
// checks, whatever the users.
func TestAuthPairPenalty(t *testing.T) {
	t.Parallel()
	q := newAuthQueue(throttle.NewFakeClock(0))
	now := time.Minute
	q.push(authPair("A", "bob"), pairJob("A", "bob"), now)
	j, _ := q.pop(now)
	q.failed(j.src, 10*time.Millisecond, now)
	if !q.penalised(authPair("A", "bob"), "A", now) {
		t.Fatal("bob at A not penalised after a failure")
	}
	if q.penalised(authPair("A", "alice"), "A", now) || q.penalised(authPair("B", "bob"), "B", now) {
		t.Fatal("alice at A, or bob at B, penalised for bob's failure at A")
	}
	q.push(authPair("A", "bob"), pairJob("A", "bob"), now)
	q.push(authPair("A", "alice"), pairJob("A", "alice"), now)
	if got := popUsers(t, q, now); len(got) != 1 || got[0] != "alice" {
		t.Fatalf("served %v while bob at A is penalised, want [alice]", got)
	}
	popUsers(t, q, now+time.Hour)

	// Failures on many users from one address: the address waits.
	for i := range maxFailingUsersPerAddr + 1 {
		src := authPair("A", fmt.Sprintf("guess%d", i))
		q.push(src, pairJob("A", "x"), now)
		j, _ := q.pop(now)
		q.failed(j.src, 10*time.Millisecond, now)
	}
	if !q.penalised(authPair("A", "carol"), "A", now) {
		t.Error("an address failing on many users does not wait for a new user")
	}
	if q.penalised(authPair("B", "carol"), "B", now) {
		t.Error("another address waits")
	}
	if d, ok := q.scramTurnFrom(authPair("A", "dave"), "A", now); !ok || d <= 0 {
		t.Errorf("SCRAM proof of a new user at the guessing address: wait %v %v, want a turn", d, ok)
	}

	// One address's checks, all users together, are bounded.
	q2 := newAuthQueue(throttle.NewFakeClock(0))
	for i := range maxQueuedAuthPerAddr {
		if !q2.push(authPair("C", fmt.Sprint(i)), pairJob("C", "u"), now) {
			t.Fatalf("check %d of address C refused", i+1)
		}
	}
	if q2.push(authPair("C", "one more"), pairJob("C", "u"), now) {
		t.Error("an address queued more than maxQueuedAuthPerAddr checks")
	}
	if !q2.push(authPair("D", "u"), pairJob("D", "u"), now) {
		t.Error("another address refused")
	}
	popUsers(t, q2, now)
	if len(q2.addrs) != 0 {
		t.Errorf("%d addresses remembered with nothing queued nor failing", len(q2.addrs))
	}
}

// TestAuthFlightsJoin: logins of the same credentials share a flight;
// another password never does; a penalised source joins only its own
// source's flight, and at most maxPenalisedWaiters wait on it.
func TestAuthFlightsJoin(t *testing.T) {
	t.Parallel()
	f := newAuthFlights()
	pushed := 0
	push := func(*authJob) bool { pushed++; return true }
	call := func() *offLoopCall { return &offLoopCall{} }
	a := pairJob("A", "pool")
	a.pass = "pw"
	if joinResultOf(f.join(call(), a, "A/pool", false, push)) != joined || pushed != 1 {
		t.Fatal("first login: no check queued")
	}
	for range 99 {
		j := &authJob{user: "pool", pass: "pw"}
		if joinResultOf(f.join(call(), j, "A/pool", false, push)) != joined {
			t.Fatal("same credentials refused")
		}
	}
	if pushed != 1 || len(a.flight.calls) != 100 {
		t.Fatalf("%d checks for 100 logins of one credential (%d waiting)", pushed, len(a.flight.calls))
	}
	if joinResultOf(f.join(call(), &authJob{user: "pool", pass: "other"}, "A/pool", false, push)) != joined || pushed != 2 {
		t.Fatal("another password joined the check")
	}
	// From elsewhere: joins when not penalised, gets its own check when it is.
	if joinResultOf(f.join(call(), &authJob{user: "pool", pass: "pw"}, "B/pool", false, push)) != joined || pushed != 2 {
		t.Fatal("a healthy source does not share the check")
	}
	pen := &authJob{user: "pool", pass: "pw"}
	if joinResultOf(f.join(call(), pen, "C/pool", true, push)) != joined || pushed != 3 || pen.flight == a.flight {
		t.Fatal("a penalised source joined another source's check")
	}
	for range maxPenalisedWaiters - 1 {
		joinResultOf(f.join(call(), &authJob{user: "pool", pass: "pw"}, "C/pool", true, push))
	}
	if joinResultOf(f.join(call(), &authJob{user: "pool", pass: "pw"}, "C/pool", true, push)) == joined {
		t.Error("more than maxPenalisedWaiters wait on a penalised source's check")
	}
	if calls := f.finish(a.flight); len(calls) != 101 {
		t.Errorf("finish answered %d logins, want 101", len(calls))
	}
	if joinResultOf(f.join(call(), &authJob{user: "pool", pass: "pw"}, "A/pool", false, push)) != joined || pushed != 4 {
		t.Error("a login after the answer joined the finished check")
	}
}

// joinResultOf is join's result without its flight.
func joinResultOf(r joinResult, _ *authFlight) joinResult { return r }
