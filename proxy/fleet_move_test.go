package proxy

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// TestFleetLoadThatMoves is issue 29's moving load through real instances:
// two proxies and a real Redis on fake clocks (fleetFake), a bucket with
// hard_limit 1500 whose whole load (eight closed-loop clients) moves from
// one instance to the other every second, then every half second, as
// clients behind a load balancer do. Over 10 s the fleet delivers at least
// 90% (every second) or 80% (every half second) of the limit, no sliding
// 1 s window holds more than +10% of it, and at every step the hard limits
// the instances enforce add up to at most 1500 (the store's clamp). Under
// -race over 4 s (moveSpan).
func TestFleetLoadThatMoves(t *testing.T) {
	t.Parallel()
	span := testmc.UnderRace(10*time.Second, moveSpan)
	for _, c := range []struct {
		every time.Duration
		want  float64
	}{{time.Second, 0.90}, {500 * time.Millisecond, 0.80}} {
		t.Run(c.every.String(), func(t *testing.T) {
			t.Parallel()
			fleetLoadThatMoves(t, c.every, c.want, span)
		})
	}
}

// fleetLoadThatMoves runs TestFleetLoadThatMoves for span with the load
// moving every every, and checks it delivers at least want of the limit.
func fleetLoadThatMoves(t *testing.T, every time.Duration, want float64, span time.Duration) {
	const limit = 1500.0
	f, l := startMoveFleet(t)
	defer l.close(f)
	l.add(f, 0, 8)
	f.pass(2 * time.Second) // warm-up
	worstOf := watchWindows(t, f, "b", int64(limit))
	u0 := sum(f.units("b"))
	from := 0
	for range int(span / every) {
		f.pass(every)
		l.remove(f, from, 8)
		l.add(f, 1-from, 8)
		from = 1 - from
	}
	rate, worst := (sum(f.units("b"))-u0)/span.Seconds(), worstOf()
	t.Logf("load moving every %v: %.0f units/s (%.1f%% of the limit), worst 1 s window %.0f", every, rate, 100*rate/limit, worst)
	if rate < limit*want {
		t.Errorf("load moving every %v: the fleet delivered %.0f units/s, want >= %.0f", every, rate, limit*want)
	}
	if worst > limit*1.10 {
		t.Errorf("load moving every %v: %.0f units in a 1 s window, more than %.0f +10%%", every, worst, limit)
	}
	if n := l.errs.Load(); n != 0 {
		t.Errorf("%d client errors", n)
	}
}
