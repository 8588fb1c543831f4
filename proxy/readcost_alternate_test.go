package proxy

// A tenant that alternates small and 1 MB values gets its hard limit,
// not a stop-and-go below it, through a real proxy and memcached.

import (
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestRule2AlternatingValuesThroughProxy: one connection pipelines, again
// and again, 63 meta gets of a 100-byte value and one of a 1 MB value
// (both written through the proxy: ceiling 256), from a bucket
// hard-limited to 500 units/s. On the fake clock, moved 2 ms at a time
// (round trips of zero: see TestRule1HardLimitWithRoundTrips for longer
// ones), after a second of warm-up: every 1 s window holds at most the
// limit and one largest value (500 + 256 units: the design's least
// possible), and the 10 s after it between 98% of the limit and the limit
// and one largest value.
func TestRule2AlternatingValuesThroughProxy(t *testing.T) {
	t.Parallel()
	clk := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, loops: 1,
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 500\n"}, clk)
	ft := &fakeTime{t: t, p: p, clock: clk}
	w := dial(t, p.Addr)
	setValue(t, w, "big", 1_000_000)
	clk.Advance(time.Second)
	setValue(t, w, "small", 100)
	clk.Advance(time.Second)
	tb := p.Engine().Bucket("default")
	if c := tb.ReadCost().Bound(); c != 256 {
		t.Fatalf("ceiling %d, want 256", c)
	}
	c := rawDial(t, p.Addr)
	countBytes(c) // the client reads every answer
	cycle := strings.Repeat("mg small v\r\n", 63) + "mg big v\r\n"
	if _, err := c.Write([]byte(strings.Repeat(cycle, 30))); err != nil {
		t.Fatal(err)
	}
	const step, warm, span = 2 * time.Millisecond, time.Second, 10 * time.Second
	u0 := tb.Stats().Units
	var units []uint64 // units answered by each step (the bucket's statistics are current when answers go)
	for i := 0; time.Duration(i)*step <= warm+span; i++ {
		ft.settle(anyHeld, nil)
		units = append(units, tb.Stats().Units-u0)
		clk.Advance(step)
	}
	perSec := int(time.Second / step)
	most := uint64(0)
	for i := perSec; i < len(units); i++ {
		most = max(most, units[i]-units[i-perSec])
	}
	total := units[len(units)-1] - units[int(warm/step)]
	t.Logf("most in a second %d; %d over 10 s after warm-up (%.1f%%)", most, total, float64(total)/50)
	if most > 500+256+1 {
		t.Errorf("%d units in one second at a hard limit of 500: more than the limit and one largest value", most)
	}
	if total < 4900 || total > 5000+256 {
		t.Errorf("%d units over 10 s at a hard limit of 500, want 4,900 to 5,256", total)
	}
}
