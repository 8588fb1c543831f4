package proxy

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// plainAuth sends a SASL PLAIN AUTH of user with password pw on rc,
// without waiting for its answer.
func plainAuth(rc *rawConn, user, pw string) {
	rc.send(mc.OpSASLAuth, nil, []byte("PLAIN"), []byte("\x00"+user+"\x00"+pw))
}

// readAnswer reads the status answering a request sent on rc.
func readAnswer(t testing.TB, rc *rawConn, what string) mc.Status {
	t.Helper()
	st, _, err := rc.read()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return st
}

// TestPlainPenaltyIsFailedCheckTimesShare: a wrong PLAIN password costs
// its source (the user at that address) a wait of (failedAuthShare-1)
// times what its bcrypt run took, at most maxFailedAuthPenalty, on the
// engine's clock: with bcrypt fixed at 20 ms, the user's next login from
// the address is checked exactly 980 ms after the failure, not a
// nanosecond sooner, while another user of the same address logs in with
// the clock standing still; with bcrypt at 100 ms the wait is capped at
// 2 s.
func TestPlainPenaltyIsFailedCheckTimesShare(t *testing.T) {
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{tail: tenantTail(t)}, clock)
	p.fixedBcrypt.Store(int64(20 * time.Millisecond))
	guesses := 0
	fail := func() time.Duration { // a new wrong password each time (a repeated one is known wrong: authbad.go)
		t.Helper()
		rc := dialFrom(t, p.Addr, "127.0.0.1")
		at := clock.Now()
		guesses++
		plainAuth(rc, "bob", fmt.Sprintf("wrong-%d", guesses))
		if st := readAnswer(t, rc, "wrong password"); st != mc.StatusAuthError {
			t.Fatalf("wrong password: %s", st)
		}
		return at
	}
	failedAt := fail()
	armedAt(t, clock) // a connection's first refusal is answered at once
	end := failedAt + 20*time.Millisecond*(failedAuthShare-1)

	bob := dialFrom(t, p.Addr, "127.0.0.1")
	plainAuth(bob, "bob", "bob-pw")
	armedAt(t, clock, end) // the auth worker waits for bob's turn
	// Another user at the address is not penalised.
	if ok, err := tryPlain(dialFrom(t, p.Addr, "127.0.0.1"), "alice", "alice-pw"); !ok || err != nil {
		t.Fatalf("alice beside bob's penalty: %v %v", ok, err)
	}
	clock.Advance(end - clock.Now() - 1)
	stillArmed(t, clock, end)
	clock.Advance(1)
	if st := readAnswer(t, bob, "bob after the penalty"); st != mc.StatusSuccess {
		t.Fatalf("bob after the penalty: %s", st)
	}

	// A slow failure is charged at most maxFailedAuthPenalty.
	p.fixedBcrypt.Store(int64(100 * time.Millisecond))
	failedAt = fail()
	bob = dialFrom(t, p.Addr, "127.0.0.1")
	plainAuth(bob, "bob", "bob-pw")
	end = failedAt + maxFailedAuthPenalty
	armedAt(t, clock, end)
	clock.Advance(maxFailedAuthPenalty - 1)
	stillArmed(t, clock, end)
	clock.Advance(1)
	if st := readAnswer(t, bob, "bob after the capped penalty"); st != mc.StatusSuccess {
		t.Fatalf("bob after the capped penalty: %s", st)
	}
}

// TestPlainDecoyAnsweredAsLateAsBcrypt: a login naming a user that does
// not exist runs no bcrypt, but is answered exactly as late as the
// worker's last bcrypt run took (fixed at 30 ms here), on the engine's
// clock, and its failure costs its source the same penalty a wrong
// password with that run would: the next try of that name from the
// address is checked exactly maxFailedAuthPenalty after the decoy's
// answer.
func TestPlainDecoyAnsweredAsLateAsBcrypt(t *testing.T) {
	const took = 30 * time.Millisecond
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{tail: tenantTail(t)}, clock)
	p.fixedBcrypt.Store(int64(took))
	login(t, p.Addr, "alice").Close() // a bcrypt run, timed
	rc := dialFrom(t, p.Addr, "127.0.0.1")
	at := clock.Now()
	plainAuth(rc, "nobody", "guess")
	armedAt(t, clock, at+took)
	clock.Advance(took - 1)
	stillArmed(t, clock, at+took)
	clock.Advance(1)
	if st := readAnswer(t, rc, "unknown user"); st != mc.StatusAuthError {
		t.Fatalf("unknown user: %s, want AuthError", st)
	}
	// Charged as that run: a penalty of min(took*(failedAuthShare-1),
	// maxFailedAuthPenalty) from when the run would have ended.
	end := at + took + min(took*(failedAuthShare-1), maxFailedAuthPenalty)
	again := dialFrom(t, p.Addr, "127.0.0.1")
	plainAuth(again, "nobody", "guess2")
	armedAt(t, clock, end)
	clock.Advance(end - clock.Now() - 1)
	stillArmed(t, clock, end)
	clock.Advance(1)
	armedAt(t, clock, end+took) // checked now, answered a run's time later
	clock.Advance(took)
	if st := readAnswer(t, again, "unknown user again"); st != mc.StatusAuthError {
		t.Fatalf("unknown user again: %s, want AuthError", st)
	}
}

// A refused login's penalty is in force by the time its client reads the
// refusal: the worker is stopped right after it hands the answer over,
// and the user's correct password, cached, is still made to wait out the
// penalty (before, the penalty was recorded after the answer, and a
// client quick enough logged in from the cache at once).
func TestPenaltyInForceByTheRefusal(t *testing.T) {
	clock := throttle.NewFakeClock(0)
	var armed atomic.Bool // stop the worker after its next answer
	var answered atomic.Int64
	entered, unblock := make(chan struct{}), make(chan struct{})
	testHookAuthAnswered = func() {
		if armed.CompareAndSwap(true, false) {
			close(entered)
			<-unblock
		}
		answered.Add(1)
	}
	t.Cleanup(func() { testHookAuthAnswered = nil })
	p := startProxyClock(t, testConfig{tail: tenantTail(t)}, clock)
	defer close(unblock)
	p.fixedBcrypt.Store(int64(20 * time.Millisecond))
	login(t, p.Addr, "bob").Close() // bob's password cached
	armedAt(t, clock)
	// The worker hands a check's answer over before it calls the hook:
	// arming before it is through the hook of bob's check would stop it
	// there, and the next check would never run.
	eventually(t, 10*time.Second, "bob's check through the hook", func() bool { return answered.Load() == 1 })

	armed.Store(true)
	rc := dialFrom(t, p.Addr, "127.0.0.1")
	at := clock.Now()
	plainAuth(rc, "bob", "wrong")
	if st := readAnswer(t, rc, "wrong password"); st != mc.StatusAuthError {
		t.Fatalf("wrong password: %s", st)
	}
	<-entered // the worker stands just after the answer
	bob := dialFrom(t, p.Addr, "127.0.0.1")
	plainAuth(bob, "bob", "bob-pw")
	unblock <- struct{}{}
	end := at + 20*time.Millisecond*(failedAuthShare-1)
	armedAt(t, clock, end) // bob's cached password waits out the penalty
	clock.Advance(end - clock.Now())
	if st := readAnswer(t, bob, "bob after the penalty"); st != mc.StatusSuccess {
		t.Fatalf("bob after the penalty: %s", st)
	}
}
