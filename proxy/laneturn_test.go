package proxy

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// laneView is what the loop knows of one client's session and its lane.
type laneView struct {
	readsOut  int  // the session's reads in flight upstream
	laneWait  bool // it holds a turn in its lane's line
	paused    bool // output-paused (its input stays buffered)
	laneReads int  // the lane's reads in flight
	laneBytes int  // their expected response bytes
	waiting   int  // sessions in the lane's line
	expected  int  // the session's expected read (bytes)
}

// viewLane reads c's session and its lane on the loop (one loop).
func viewLane(t *testing.T, p *testProxy, c *mcclient.Client) laneView {
	t.Helper()
	var v laneView
	onLoop(t, p, func(lp *loop) {
		s := sessionOf(lp, c.Conn().LocalAddr())
		if s == nil || s.bkt == nil {
			return
		}
		l := s.lane()
		v = laneView{readsOut: s.readsOut, laneWait: s.laneWait, paused: s.outPaused(),
			laneReads: l.reads, laneBytes: l.bytes, waiting: l.waiting, expected: s.expectedRead()}
	})
	return v
}

// sendGets pipelines n GETs of key on c without reading their answers.
func sendGets(t *testing.T, c *mcclient.Client, key string, n int) {
	t.Helper()
	for range n {
		c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte(key)})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// readGets reads n answers of GETs on c, each a hit of size bytes.
func readGets(t *testing.T, c *mcclient.Client, who string, n, size int) {
	t.Helper()
	for i := range n {
		r, err := c.Read()
		if err != nil || r.Status() != mc.StatusSuccess || len(r.Value) != size {
			t.Fatalf("%s: GET %d of %d: %v %v", who, i+1, n, err, r)
		}
	}
}

// A connection of large reads gets its turn in its bucket's lane: while it
// waits for room (its 1 MB read does not fit beside the reads in flight),
// the bucket's other connections, whose smaller reads (20 KB) would keep
// fitting in what is left, start no reads; so the lane drains and the
// large read goes. memcached is frozen while the clients send, so nothing
// is answered and what the loop has in flight is exact: the 10 reads of
// the first small reader, none of the second's (without the turn, all 10
// of the second's fit and go, and a stream of them starves the large
// reader). Nothing here depends on time: capacity is unlimited and the
// engine's clock stands still.
func TestLargeReaderNotStarvedBySmallReaders(t *testing.T) {
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, upstream: `timeout = "30s"`, loops: 1},
		throttle.NewFakeClock(time.Hour))
	const bigSize, mediumSize = 1000 * 1000, 20000
	setup := dial(t, p.Addr)
	for key, size := range map[string]int{"big": bigSize, "medium": mediumSize} {
		if r, err := setup.Set([]byte(key), bytes.Repeat([]byte("x"), size)); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatal(err, r)
		}
	}
	large, first, second := dial(t, p.Addr), dial(t, p.Addr), dial(t, p.Addr)
	// The large reader's reads are known to be large; the bucket's, after
	// many small ones, small.
	sendGets(t, large, "big", 1)
	readGets(t, large, "large reader", 1, bigSize)
	for _, c := range []*mcclient.Client{first, second} {
		sendGets(t, c, "medium", 50)
		readGets(t, c, "small reader", 50, mediumSize)
	}
	if v := viewLane(t, p, large); v.expected < bigSize || v.laneReads != 0 {
		t.Fatalf("before the test: large reader expects %d bytes, lane has %d reads in flight; want >= %d, 0", v.expected, v.laneReads, bigSize)
	}

	thaw := p.MC.Freeze(t)
	const n = 10
	sendGets(t, first, "medium", n)
	eventually(t, 10*time.Second, "the first small reader's reads to be upstream", func() bool {
		return viewLane(t, p, first).readsOut == n
	})
	sendGets(t, large, "big", 1)
	eventually(t, 10*time.Second, "the large reader to wait for room in its lane", func() bool {
		return viewLane(t, p, large).laneWait
	})
	fv, lv := viewLane(t, p, first), viewLane(t, p, large)
	if fv.laneBytes+fv.expected > maxReadsInFlight || fv.laneBytes+lv.expected <= maxReadsInFlight {
		t.Fatalf("lane holds %d bytes; a small read (%d) must fit beside them and the large one (%d) not, under %d",
			fv.laneBytes, fv.expected, lv.expected, maxReadsInFlight)
	}
	sendGets(t, second, "medium", n)
	eventually(t, 10*time.Second, "the second small reader's GETs to be dispatched or its session paused", func() bool {
		v := viewLane(t, p, second)
		return v.paused || v.readsOut == n
	})
	sv, lv := viewLane(t, p, second), viewLane(t, p, large)
	if sv.readsOut != 0 || sv.laneReads != n || !sv.laneWait || sv.waiting != 2 || lv.readsOut != 0 || !lv.laneWait {
		t.Fatalf("while the large reader waits: second small reader has %d reads in flight (waits its turn: %v), the lane %d (line of %d), the large reader %d (waits: %v); want 0 (true), %d (2), 0 (true)",
			sv.readsOut, sv.laneWait, sv.laneReads, sv.waiting, lv.readsOut, lv.laneWait, n)
	}

	// Answered: the first reader's reads drain the lane, the large read
	// goes, then the second reader's.
	thaw()
	readGets(t, first, "first small reader", n, mediumSize)
	readGets(t, large, "large reader", 1, bigSize)
	readGets(t, second, "second small reader", n, mediumSize)
	if v := viewLane(t, p, second); v.laneReads != 0 || v.waiting != 0 || v.laneWait {
		t.Fatalf("after every answer: lane has %d reads in flight, %d waiting (second reader waits: %v); want 0, 0", v.laneReads, v.waiting, v.laneWait)
	}
}

// TestLaneTakesBackReaderThatCaughtUp: a session paused because its client
// does not read its responses holds no turn in its lane's line (or gives
// it up: loop.resumePaused), so that it does not hold up the bucket's
// other sessions. Once its client has read, it takes a place in line
// again, though those sessions keep the line from ever emptying. Before,
// it waited for good: with two sessions of the bucket streaming 1 MB
// reads, a third that had paused that way never had another read
// dispatched (seen as TestTenantBoundsItsNeighboursWait failing under
// load: one reader 7 answers in 30 s, the others 9,000).
func TestLaneTakesBackReaderThatCaughtUp(t *testing.T) {
	p, _ := startWithBigValue(t)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		r := dial(t, p.Addr)
		r.Timeout = time.Minute
		wg.Add(1)
		go func() {
			defer wg.Done()
			pipelineGets(t, r, "big", 100, stop, func(time.Time) {})
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	const n = 40 // far more than the sockets hold: the proxy pauses it
	slow := dial(t, p.Addr)
	slow.Timeout = time.Minute
	sendGets(t, slow, "big", n)
	eventually(t, time.Minute, "the slow reader to be paused, out of the line", func() bool {
		v := viewLane(t, p, slow)
		return v.paused && !v.laneWait && v.waiting > 0
	})
	readGets(t, slow, "the reader that caught up", n, 1000*1000)
}
