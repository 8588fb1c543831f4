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
// (both written through the proxy: the 1 MB key listed at class 256), from
// a bucket hard-limited to r = 500 units/s (burst B = 100 ms: 50 units).
// On the fake clock, moved 2 ms at a time (round trips of zero: see
// TestRule1HardLimitWithRoundTrips for longer ones), the units answered
// by every reading are exactly those the design's rules give, the same on
// every run:
//
//   - rule 1: a small read is billed 1 unit and costs 1; the large one is
//     billed its class, c_max = 256 (the largest bill), and costs 245
//     (ceil((key + 1,000,000) / 4096)), the 11 given back at its settle,
//     at the reading it was admitted (the answer is in before the clock
//     moves);
//   - rule 2 on the hard gauge: a bill c is admitted when
//     max(tat, now) + c/r <= now + max(B, c/r), and moves tat to
//     max(tat, now) + c/r (a refund moves it back).
//
// Every bill and refund is a multiple of 2 ms of the gauge (1 unit), the
// step: from the first admission on, tat lies on the readings' grid, so
// the large read goes at the very reading the gauge is paid up and no
// unit of the rate is lost between readings. ruleTwo computes the units
// of each reading so: 50 at the first (the burst), then one a step (the
// 63rd small read at reading 13, tat then 100 ms ahead), the large read
// at the reading tat reaches (63), its 245 units at once, and so on.
//
// The contract's bounds follow, and are checked as well:
//   - any set of readings spanning w holds at most r*w + max(r*B, c_max)
//     units: 500 consecutive readings (998 ms) at most 499 + 256 = 755
//     (the design's "one value per window": <= 757 in a second);
//   - over the readings in (1 s, 11 s] (after a second of warm-up) the
//     units are r*10 s + r*(d(11 s) - d(1 s)), d = tat - now at a
//     settled reading: the session is held at every one (its 1,920 reads
//     take 18.5 s of the rate), so 0 < d <= max(B, c_max/r) = 512 ms,
//     and the total is strictly between 5,000 - 256 and 5,000 + 256 (the
//     design's 5,000 +-257 over 10 s).
//
// The client's session is opened (waitOpen) and the bucket's count read
// before the pipeline is sent, and the first reading settles with the
// session held: the burst admitted and answered at that reading, not at
// whichever the loop first read the pipeline at (before, a run that
// opened or read it a step or more late, or counted after it had, moved
// the whole trajectory: 4,928 or 4,934 over the 10 s).
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
	clk.Advance(time.Second) // the gauge paid up: its burst banked
	tb := p.Engine().Bucket("default")
	if c := tb.ReadCost().Bound(); c != 256 {
		t.Fatalf("ceiling %d, want 256", c)
	}
	c := rawDial(t, p.Addr)
	waitOpen(t, p, c)
	countBytes(c) // the client reads every answer
	cycle := strings.Repeat("mg small v\r\n", 63) + "mg big v\r\n"
	u0 := tb.Stats().Units
	if _, err := c.Write([]byte(strings.Repeat(cycle, 30))); err != nil {
		t.Fatal(err)
	}
	const step, warm, span = 2 * time.Millisecond, time.Second, 10 * time.Second
	n := int((warm+span)/step) + 1 // readings 0, step, ..., warm+span
	want := ruleTwo(500, 100*time.Millisecond, step, n, 30, 63, 256, 245)
	var units []uint64 // units answered by each reading (the bucket's statistics are current when answers go)
	for i := 0; i < n; i++ {
		ft.settle(1, nil) // the session held again: nothing more at this reading
		units = append(units, tb.Stats().Units-u0)
		if units[i] != want[i] {
			t.Fatalf("at %v (reading %d) %d units answered, rule 2 gives %d (the reading before: %d and %d)", time.Duration(i)*step, i, units[i], want[i], units[max(i-1, 0)], want[max(i-1, 0)])
		}
		clk.Advance(step)
	}
	perSec := int(time.Second / step)
	most := uint64(0)
	for i := perSec; i < len(units); i++ {
		most = max(most, units[i]-units[i-perSec])
	}
	total := units[len(units)-1] - units[int(warm/step)]
	t.Logf("most in 500 readings %d; %d over 10 s after warm-up (%.1f%%)", most, total, float64(total)/50)
	if most > 499+256 {
		t.Errorf("%d units in 500 readings (998 ms) at a hard limit of 500: more than r*w + c_max = 755", most)
	}
	if total <= 5000-256 || total >= 5000+256 {
		t.Errorf("%d units over 10 s at a hard limit of 500, want strictly between 4,744 and 5,256", total)
	}
}

// ruleTwo returns the units a pipeline of cycles of small reads (bill and
// cost 1 each) then one large read (billed bill, costing cost) has had
// answered by each of n readings, step apart, of a hard gauge of rate r
// units/s and burst b, paid up at the first reading, with every answer in
// at the reading its read was admitted (docs/throttling.md, rules 1-2):
// a bill c goes when max(tat, now) + c/r <= now + max(b, c/r).
func ruleTwo(r int64, b, step time.Duration, n, cycles, small int, bill, cost int64) []uint64 {
	per := time.Second / time.Duration(r) // one unit of the gauge
	tat := time.Duration(-1 << 62)
	next, sum := 0, uint64(0)
	out := make([]uint64, n)
	for i := range out {
		now := time.Duration(i) * step
		for ; next < cycles*(small+1); next++ {
			c, units := int64(1), int64(1)
			if next%(small+1) == small {
				c, units = bill, cost
			}
			at := max(tat, now) + time.Duration(c)*per
			if at > now+max(b, time.Duration(c)*per) {
				break
			}
			tat = at - time.Duration(c-units)*per // its settle gives c - units back
			sum += uint64(units)
		}
		out[i] = sum
	}
	return out
}
