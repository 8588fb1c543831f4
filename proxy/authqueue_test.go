package proxy

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

func jobFor(user string) *authJob { return &authJob{user: user} }

func popUsers(t *testing.T, q *authQueue, now time.Duration) []string {
	t.Helper()
	var got []string
	for {
		j, _ := q.pop(now)
		if j == nil {
			return got
		}
		got = append(got, j.user)
	}
}

// Round robin between sources, FIFO within one.
func TestAuthQueueRoundRobin(t *testing.T) {
	t.Parallel()
	q := newAuthQueue(throttle.NewFakeClock(0))
	now := time.Minute
	for _, p := range [][2]string{{"A", "a1"}, {"A", "a2"}, {"A", "a3"}, {"B", "b1"}, {"C", "c1"}, {"B", "b2"}} {
		if !q.push(p[0], jobFor(p[1]), now) {
			t.Fatalf("push %v refused", p)
		}
	}
	got := popUsers(t, q, now)
	want := []string{"a1", "b1", "c1", "a2", "b2", "a3"}
	if len(got) != len(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("order %v, want %v", got, want)
		}
	}
	if q.n != 0 || len(q.sources) != 0 || len(q.order) != 0 {
		t.Errorf("empty queue keeps %d checks, %d sources, %d in order", q.n, len(q.sources), len(q.order))
	}
}

// One source cannot fill the queue: it counts maxQueuedAuthPerSource
// checks in the bounds, and waits at most maxWaitingAuthPerSource; all
// sources together are bounded too.
func TestAuthQueueBounds(t *testing.T) {
	t.Parallel()
	q := newAuthQueue(throttle.NewFakeClock(0))
	now := time.Minute
	for i := 0; i < maxWaitingAuthPerSource; i++ {
		if !q.push("attacker", jobFor("x"), now) {
			t.Fatalf("check %d of one source refused", i+1)
		}
	}
	if q.push("attacker", jobFor("x"), now) {
		t.Fatal("a source queued more than maxWaitingAuthPerSource checks")
	}
	if q.n != maxQueuedAuthPerSource || q.over != maxWaitingAuthPerSource-maxQueuedAuthPerSource {
		t.Fatalf("one source counts %d checks in the bounds, %d over; want %d and %d",
			q.n, q.over, maxQueuedAuthPerSource, maxWaitingAuthPerSource-maxQueuedAuthPerSource)
	}
	if !q.push("someone else", jobFor("y"), now) {
		t.Fatal("another source refused while one source is at its bound")
	}
	for i := 0; q.n < maxQueuedAuth; i++ {
		if !q.push(string(rune('a'+i)), jobFor("z"), now) {
			t.Fatalf("refused at %d queued checks", q.n)
		}
	}
	if q.push("late", jobFor("z"), now) {
		t.Fatal("more than maxQueuedAuth checks queued")
	}
	// The other source's check is served second, not after the eight.
	j1, _ := q.pop(now)
	j2, _ := q.pop(now)
	if j1.user != "x" || j2.user != "y" {
		t.Errorf("served %s then %s, want x then y", j1.user, j2.user)
	}
}

// A source whose check failed waits (failedAuthShare-1) times the check's
// duration, capped; others are served meanwhile; draining lifts the wait.
func TestAuthQueueFailurePenalty(t *testing.T) {
	t.Parallel()
	q := newAuthQueue(throttle.NewFakeClock(0))
	now := time.Minute
	q.push("A", jobFor("a1"), now)
	j, _ := q.pop(now)
	q.failed(j.src, 10*time.Millisecond, now)
	q.push("A", jobFor("a2"), now)
	q.push("B", jobFor("b1"), now)
	if got := popUsers(t, q, now); len(got) != 1 || got[0] != "b1" {
		t.Fatalf("served %v while A is penalised, want [b1]", got)
	}
	wantWait := 10 * time.Millisecond * (failedAuthShare - 1)
	if j, wait := q.pop(now); j != nil || wait != wantWait {
		t.Fatalf("pop = %v, wait %v; want nothing for %v", j, wait, wantWait)
	}
	if j, _ := q.pop(now + wantWait - time.Millisecond); j != nil {
		t.Fatal("served before the penalty is over")
	}
	if j, _ := q.pop(now + wantWait); j == nil || j.user != "a2" {
		t.Fatalf("pop after the penalty = %v", j)
	}
	// Successes cost nothing: a source is not penalised by them.
	q.push("C", jobFor("c1"), now)
	q.push("C", jobFor("c2"), now)
	if got := popUsers(t, q, now); len(got) != 2 {
		t.Fatalf("served %v", got)
	}
	// A slow failure is capped.
	q.push("D", jobFor("d1"), now)
	j, _ = q.pop(now)
	q.failed(j.src, time.Second, now)
	q.push("D", jobFor("d2"), now)
	if _, wait := q.pop(now); wait != maxFailedAuthPenalty {
		t.Fatalf("wait after a 1 s failure = %v, want %v", wait, maxFailedAuthPenalty)
	}
	// Draining: queued checks go at once.
	q.drain()
	if j, _ := q.pop(now); j == nil || j.user != "d2" {
		t.Fatalf("pop while draining = %v", j)
	}
}

// A penalty outlives the source's queue (the attacker reconnects), and
// forgotten sources are only those with nothing queued and no penalty.
func TestAuthQueueRemembersPenalty(t *testing.T) {
	t.Parallel()
	q := newAuthQueue(throttle.NewFakeClock(0))
	now := time.Minute
	q.push("A", jobFor("a1"), now)
	j, _ := q.pop(now) // A has nothing queued now
	q.failed(j.src, 10*time.Millisecond, now)
	q.forget(now)
	q.push("A", jobFor("a2"), now)
	if j, _ := q.pop(now); j != nil {
		t.Fatal("penalty lost once the source's queue emptied")
	}
	later := now + time.Hour
	if j, _ := q.pop(later); j == nil {
		t.Fatal("not served after the penalty")
	}
	q.forget(later)
	if len(q.sources) != 0 {
		t.Errorf("%d sources remembered after their penalties ended", len(q.sources))
	}
}

// The worker wakes at the reading a penalty ends, also when the clock
// reaches it after the worker read the clock and before it armed its
// wake-up. (It armed a delay from its earlier reading, and woke a whole
// penalty late: on a fake clock, never, and
// TestSameUserPoolNotLockedOutByPinnedLogins waited out its read deadline
// in a flake run.)
func TestAuthQueueWakesAtPenaltyEnd(t *testing.T) {
	clk := throttle.NewFakeClock(time.Minute)
	q := newAuthQueue(clk)
	var once sync.Once
	testHookAuthQueueIdle = func(wait time.Duration) {
		once.Do(func() {
			clk.Advance(wait)
			select { // (the pushes' wake-up, already seen)
			case <-q.wake:
			default:
			}
		})
	}
	t.Cleanup(func() { testHookAuthQueueIdle = nil })
	q.push("A", jobFor("a1"), clk.Now())
	j, _ := q.pop(clk.Now())
	q.failed(j.src, 10*time.Millisecond, clk.Now())
	q.push("A", jobFor("a2"), clk.Now())
	var checked atomic.Int32
	stop := q.start(func(*authJob, func()) { checked.Add(1) }, func(*authJob) {})
	defer stop()
	eventually(t, time.Minute, "a2 checked once the clock reached its penalty's end", func() bool { return checked.Load() == 1 })
}

// The worker runs one check at a time; stop waits for it, hands the
// checks still queued to drop, and refuses later pushes.
func TestAuthQueueWorker(t *testing.T) {
	t.Parallel()
	q := newAuthQueue(throttle.NewFakeClock(0))
	var running, most, checked, dropped atomic.Int32
	release := make(chan struct{})
	var once sync.Once
	stop := q.start(func(j *authJob, _ func()) {
		n := running.Add(1)
		for {
			m := most.Load()
			if n <= m || most.CompareAndSwap(m, n) {
				break
			}
		}
		if j.user == "block" {
			<-release
		}
		running.Add(-1)
		checked.Add(1)
	}, func(*authJob) { dropped.Add(1) })
	now := time.Duration(0)
	for i := 0; i < 6; i++ {
		q.push(string(rune('a'+i)), jobFor("ok"), now)
	}
	eventually(t, time.Minute, "six checks", func() bool { return checked.Load() == 6 })
	q.push("x", jobFor("block"), now)
	eventually(t, time.Minute, "the blocking check to start", func() bool { return running.Load() == 1 })
	q.push("y", jobFor("left"), now)
	q.push("z", jobFor("left"), now)
	done := make(chan struct{})
	go func() { stop(); close(done) }()
	select {
	case <-done:
		t.Fatal("stop returned while a check runs")
	case <-time.After(20 * time.Millisecond):
	}
	once.Do(func() { close(release) })
	<-done
	if most.Load() != 1 {
		t.Errorf("%d checks ran at once, want 1", most.Load())
	}
	if dropped.Load() != 2 || checked.Load() != 7 {
		t.Errorf("checked %d, dropped %d; want 7 and 2", checked.Load(), dropped.Load())
	}
	if q.push("late", jobFor("x"), now) {
		t.Error("push accepted after stop")
	}
}

func TestAuthSource(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ a, b string }{
		{"10.0.0.1:1234", "10.0.0.1:999"},
		{"[::ffff:10.0.0.1]:1", "10.0.0.1:2"},
		{"[2001:db8:1:2::1]:1", "[2001:db8:1:2:ffff::9]:2"},
	} {
		if authSource(c.a) != authSource(c.b) {
			t.Errorf("%s and %s are different sources: %s, %s", c.a, c.b, authSource(c.a), authSource(c.b))
		}
	}
	for _, c := range []struct{ a, b string }{
		{"10.0.0.1:1", "10.0.0.2:1"},
		{"[2001:db8:1:2::1]:1", "[2001:db8:1:3::1]:1"},
	} {
		if authSource(c.a) == authSource(c.b) {
			t.Errorf("%s and %s are one source", c.a, c.b)
		}
	}
}
