package throttle

import (
	"testing"
	"time"
)

// TestResetAtIsAReading: a timer armed for a reading fires when the fake
// clock gets there, or at once if the clock is already there; one armed
// with a delay computed from a reading the clock has since left fires
// that delay after the new reading, which is why callers that know the
// reading use ResetAt (a proxy's event loop once waited forever for a
// wake-up so armed).
func TestResetAtIsAReading(t *testing.T) {
	clk := NewFakeClock(0)
	fired := make(chan time.Duration, 4)
	f := func() { fired <- clk.Now() }
	expect := func(want time.Duration) {
		t.Helper()
		select {
		case got := <-fired:
			if got != want {
				t.Fatalf("fired at %v, want %v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("did not fire (clock at %v, want %v)", clk.Now(), want)
		}
	}
	none := func() {
		t.Helper()
		select {
		case got := <-fired:
			t.Fatalf("fired at %v, want not yet", got)
		case <-time.After(10 * time.Millisecond):
		}
	}
	tm := AtFunc(clk, 10, f)
	clk.Advance(9)
	none()
	clk.Advance(1)
	expect(10)

	// Armed for 20 by a delay read at 10, after the clock moved to 15:
	// it would fire at 25. ResetAt(20) fires at 20.
	d := 20 - clk.Now()
	clk.Advance(5)
	tm.Reset(d)
	clk.Advance(5)
	none()
	if !ResetAt(clk, tm, 20) {
		t.Error("ResetAt reported the timer disarmed, want armed")
	}
	expect(20)

	// A reading the clock has passed: at once.
	if ResetAt(clk, tm, 19) {
		t.Error("ResetAt reported the timer armed, want fired")
	}
	expect(20)
	AtFunc(clk, 5, f)
	expect(20)
}
