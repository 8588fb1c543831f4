package proxy

// A pipeline of small reads gets its hard limit when a round trip takes
// engine time. The fake clock stands still while a read is in flight, so
// a test that never moves it during a round trip sees round trips of
// zero; here memcached is frozen while the clock moves by one round trip,
// every round trip.

import (
	"bytes"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestRule1HardLimitWithRoundTrips: a client pipelines 400 meta gets of a
// 1-byte value from a bucket hard-limited to 1,000 units/s (burst 100
// units; and the same with a reservation of 1,000 and no free pool), and every read takes a round trip of 4 ms of engine time
// (memcached frozen while the clock moves). Over 40 round trips (160 ms)
// the limit allows 160 reads beyond the first burst; a bucket whose
// ceiling is class 1 gets them. So does a bucket that holds one value of
// 1 MB besides (256 units, more than its burst), written through the
// proxy: its key is listed among the bucket's large keys, and the reads
// of the small key are billed the ceiling, 1 unit. Billed 256 each (the
// ceiling before the list), they got one read per round trip, 40 (25% of
// the limit): the "one read per round trip" of issue 28.
//
// The clock first moves once the loop has read the pipeline (the burst
// admitted, the next read held: the bucket's held count, read before the
// pipeline is sent): a loop that read it a round trip late got the burst
// then, not the burst and a round trip's reads (with the pipeline written
// 20 ms late, 12 to 40 reads fewer).
func TestRule1HardLimitWithRoundTrips(t *testing.T) {
	const hard = "capacity = \"unlimited\"|hard_limit = 1000"
	const reserved = "capacity = 1000|reserved = 1000" // a free pool of 0: the reservation alone
	for _, tc := range []struct {
		name, limits string
		large        bool
	}{
		{"hard limit, ceiling 1", hard, false}, {"hard limit, one 1 MB value", hard, true},
		{"reservation, ceiling 1", reserved, false}, {"reservation, one 1 MB value", reserved, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			roundTrips(t, tc.limits, tc.large)
		})
	}
}

// roundTrips runs the test's pipeline with limits: the [throttle] line
// and the bucket's line, split by '|'.
func roundTrips(t *testing.T, limits string, large bool) {
	const rtt, trips, limit = 4 * time.Millisecond, 40, 1000
	clk := throttle.NewFakeClock(time.Hour)
	node, bkt, _ := strings.Cut(limits, "|")
	p := startProxyClock(t, testConfig{throttle: node, loops: 1,
		tail: "[[bucket]]\nname = \"default\"\n" + bkt + "\n"}, clk)
	w := dial(t, p.Addr)
	if large { // its 256 units pass the burst: the gauge is paid up
		if r, err := w.Set([]byte("big"), bytes.Repeat([]byte("v"), 1<<20-512)); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("set big: %v %v", r, err)
		}
		clk.Advance(time.Second)
	}
	if r, err := w.Set([]byte("s"), []byte("x")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set: %v %v", r, err)
	}
	tb := p.Engine().Bucket("default")
	clk.Advance(time.Second) // the writes paid, the burst banked
	t.Logf("ceiling %d units, bound %d", tb.ReadCost().Ceiling(), tb.ReadCost().Bound())
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	waitOpen(t, p, c)
	var hits atomic.Int64
	go countHits(c, &hits)
	ft := &fakeTime{t: t, p: p, clock: clk}
	held0 := tb.Stats().Held
	for i := 0; i < trips; i++ {
		thaw := p.MC.Freeze(t)
		if i == 0 {
			if _, err := io.WriteString(c, strings.Repeat("mg s v\r\n", 400)); err != nil {
				t.Fatal(err)
			}
			// The loop has read the pipeline: the burst admitted, the
			// next read held (dispatched alone is met by a session that
			// has not read its input yet: the clock then moved first).
			eventually(t, time.Minute, "the pipeline read, its burst admitted and the rest held", func() bool { return tb.Stats().Held == held0+1 })
		}
		dispatched(t, p) // the reads admitted at this reading are in flight
		clk.Advance(rtt) // for one round trip
		thaw()           // (those the clock's move admits are answered at once: more reads, not fewer)
		// Held again (the pipeline outlasts the 40 round trips), every
		// answer read.
		ft.settle(1, answeredAll(t, p, "default", &hits))
	}
	got := hits.Load()
	want := int64(limit * trips * rtt / time.Second) // beyond the burst
	const burst = limit / 10                         // burst_ms 100 (the default), banked before the first read
	t.Logf("%d reads in %v of engine time at %v a round trip (limit %d/s)", got, trips*rtt, rtt, limit)
	// got counts the banked burst too: the reads beyond it are got-burst,
	// exactly the limit's on the fake clock.
	if beyond := got - burst; beyond != want {
		t.Fatalf("%d reads of 1 unit in %v of engine time at a limit of %d/s: %d beyond the burst of %d, want %d",
			got, trips*rtt, limit, beyond, burst, want)
	}
}
