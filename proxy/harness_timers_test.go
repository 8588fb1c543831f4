package proxy

// Asserting the auth and TLS paths' waits on a fake engine clock
// (Options.Clock): what the proxy scheduled, and for when (armedAt), and
// running the loops' periodic work at the clock's reading (tickLoops).

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// armedAt waits until the timers armed on clock are exactly those due at
// the readings want (in any order; none: no timer armed), and fails the
// test if they are not within 10 s of real time (the proxy had not even
// scheduled them then). The clock stands still meanwhile, so what it
// checks is the readings, not how fast the proxy got there.
func armedAt(t testing.TB, clock *throttle.FakeClock, want ...time.Duration) {
	t.Helper()
	want = slices.Clone(want)
	slices.Sort(want)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := clock.Armed()
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("at %v the timers armed are due at %v, want %v", clock.Now(), got, want)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// stillArmed checks that the timers armed on clock are due at the
// readings want, at once: after an Advance that made none of them due,
// none has fired (Advance fires the due ones before it returns).
func stillArmed(t testing.TB, clock *throttle.FakeClock, want ...time.Duration) {
	t.Helper()
	want = slices.Clone(want)
	slices.Sort(want)
	if got := clock.Armed(); !slices.Equal(got, want) {
		t.Fatalf("at %v the timers armed are due at %v, want %v", clock.Now(), got, want)
	}
}

// tickLoops runs every loop's periodic work (loop.tick: auth_timeout,
// idle_timeout) once, at the engine clock's reading, and waits for it.
func tickLoops(t testing.TB, p *testProxy) {
	t.Helper()
	onLoop(t, p, func(lp *loop) { _ = lp.tick(context.Background()) })
}
