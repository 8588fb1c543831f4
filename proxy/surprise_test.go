//go:build linux

package proxy

// Surprises (values written around the proxy, read above their bill: rule
// 3 of docs/throttling.md) through a real proxy and a real memcached on
// the engine's fake clock, read by every multi-read shape a client has.

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// settledOwing waits until every loop of p has done what the fake clock's
// reading allows, counting a session whose surprise waits to be paid
// (session.owing) as waiting for the clock, as a held one is: no wake-up
// due, nothing queued, no save of the ceilings running (real time: its
// end wakes the writes that wait for it), no read in flight for a closed
// session, and every session held, owing, idle, or waiting for a raise of
// its ceiling whose old reads have not all settled (once they have, a wake
// is on its way: ReadCost.Pending false), with nothing in flight but what
// owes and nothing unsent, in the proxy's buffers or its socket's (the
// kernel's send queue: every byte written is in the client's socket).
// Then it sets each counter's received to the bytes its client's TCP has
// received: exactly what the proxy sent that client by this reading,
// whether or not the client's reader has read it yet. It checks that
// count is exact: the reader comes to read exactly that many bytes, and
// no more arrive.
func settledOwing(t *testing.T, p *testProxy, clients ...*byteCounter) {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // liveness only
	var poll backoff
	for {
		ok := true
		var ioctlErr error
		onLoop(t, p, func(lp *loop) {
			now := lp.srv.throttle.Now()
			for _, e := range lp.holds {
				if e.live() && e.at <= now {
					ok = false
				}
			}
			if len(lp.retry) > 0 || len(lp.dirty) > 0 || lp.leaseDue != 0 && lp.leaseDue <= now {
				ok = false
			}
			if lp.srv.ceilSaving.Load() {
				ok = false // a save of the ceilings, off the loop
			}
			for _, w := range lp.ceilWait {
				if w.s.pause == waitingCeiling && !w.b.tb.ReadCost().Pending() {
					ok = false // its raise's old reads settled: wakeCeiling is on its way
				}
			}
			for _, l := range lp.lanes {
				if l.orphansOut > 0 {
					ok = false // reads of closed sessions in flight upstream
				}
			}
			for s := range lp.sessions {
				unacked, err := unackedBytes(s.c.Fd())
				if err != nil {
					ioctlErr = err
				}
				switch {
				case len(s.out)+s.c.OutboundBuffered() > 0 || unacked != 0:
					ok = false
				case s.owing > 0: // its answers wait for the clock
				case s.pending() > 0 || s.unsent() > 0:
					ok = false // in flight or unsent, as unsettled says
				case s.isHeld():
				case s.pause == waitingCeiling: // for reads that wait for the clock (above)
				case s.pause != running || !s.drained():
					ok = false
				}
			}
		})
		if ioctlErr != nil {
			t.Fatalf("SIOCOUTQ of a session's socket: %v", ioctlErr)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the proxy did not settle at %v", p.Engine().Now())
		}
		poll.wait()
	}
	for _, bc := range clients {
		bc.received = tcpReceived(t, bc.c)
		eventually(t, time.Minute, "the client read what its TCP received", func() bool {
			if n := bc.n.Load(); n > bc.received {
				t.Fatalf("settled at %v with %d bytes received by %v, its reader read %d: bytes were still on their way to it", p.Engine().Now(), bc.received, bc.c.LocalAddr(), n)
			}
			return bc.n.Load() == bc.received
		})
		if r := tcpReceived(t, bc.c); r != bc.received {
			t.Fatalf("settled at %v with %d bytes received by %v, then %d: bytes were still on their way to it", p.Engine().Now(), bc.received, bc.c.LocalAddr(), r)
		}
	}
}

// TestRule3SurpriseMultiReadHeldToHardLimit: values of 1,000,000 bytes
// written straight into memcached (around the proxy: the bucket's ceiling
// stays at class 1) and read back by one client in one go, by every
// multi-read shape: a text multi-key get, gets and gat, pipelined meta mg
// with v, and a binary GETKQ pipeline ended by a NOOP. Every read is
// admitted at its bill of 1 unit; each brings 245 (rule 3: a surprise,
// paid before delivery). At a hard limit of 500 units/s (burst 50) the
// units delivered by every reading of the fake clock stay within the
// hard gauge's bound r*t + max(r*burst, largest bill) (plus the first
// bills), and all of them arrive within 4 s of engine time (liveness):
// at 2.55 s on every run, the clock moving only once the proxy has read
// the client's write (inputRead; the first settle alone was met before,
// and with the write 20 ms late the 4 s passed with no value delivered).
func TestRule3SurpriseMultiReadHeldToHardLimit(t *testing.T) {
	const n, size = 6, 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("big%d", i)
	}
	all := strings.Join(keys, " ")
	var mg, bin bytes.Buffer
	for i, k := range keys {
		fmt.Fprintf(&mg, "mg %s v k\r\n", k)
		bin.Write(binFrame(mc.OpGetKQ, k, "", nil, 0, uint32(i)))
	}
	mg.WriteString("mn\r\n")
	bin.Write(binFrame(mc.OpNoop, "", "", nil, 0, 0x99))
	shapes := []struct{ name, in string }{
		{"get", "get " + all + "\r\n"},
		{"gets", "gets " + all + "\r\n"},
		{"gat", "gat 0 " + all + "\r\n"},
		{"mg", mg.String()},
		{"GETKQ", bin.String()},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			t.Parallel()
			clk := throttle.NewFakeClock(time.Hour)
			p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, loops: 1,
				tail: "[[bucket]]\nname = \"default\"\nhard_limit = 500\n"}, clk)
			direct := dial(t, p.MC.Addr)
			for _, k := range keys {
				if r, err := direct.Set([]byte("default:"+k), bytes.Repeat([]byte("v"), size)); err != nil || r.Status() != mc.StatusSuccess {
					t.Fatalf("seed memcached: %v %v", r, err)
				}
			}
			if c := p.Engine().Bucket("default").ReadCost().Ceiling(); c != 1 {
				t.Fatalf("ceiling %d before the reads, want 1 (values written around the proxy)", c)
			}
			c := rawDial(t, p.Addr)
			waitOpen(t, p, c)
			bc := countBytes(c)
			if _, err := c.Write([]byte(sh.in)); err != nil {
				t.Fatal(err)
			}
			inputRead(t, p, c, len(sh.in)) // the reads made at the first reading

			const perValue = 245 // ceil((key + 1,000,000) / 4096)
			var elapsed time.Duration
			for {
				settledOwing(t, p, bc)
				got := int(bc.received / size) // values delivered (their framing is far below a value)
				bound := int(500*elapsed/time.Second) + 257 + n
				if got*perValue > bound {
					t.Fatalf("after %v of engine time %d values delivered (%d units), over the hard limit's bound %d", elapsed, got, got*perValue, bound)
				}
				if got == n {
					break
				}
				if elapsed > 4*time.Second {
					t.Fatalf("after %v of engine time only %d of %d values delivered", elapsed, got, n)
				}
				clk.Advance(50 * time.Millisecond)
				elapsed += 50 * time.Millisecond
			}
			t.Logf("all %d values delivered after %v of engine time", n, elapsed)
			if elapsed < time.Duration(n-1)*perValue*time.Second/500-time.Second/10 {
				t.Fatalf("all %d values delivered after %v of engine time: faster than 500 units/s", n, elapsed)
			}
			if got := p.Engine().Bucket("default").ReadCost().Ceiling(); got != 256 {
				t.Fatalf("ceiling %d after the surprises, want class 256 (245 units)", got)
			}
		})
	}
}

// TestRule3ReservedNeighbourBesideSurpriseStorm: a bucket of pipelined
// 1-unit reads within its reservation (calm: 1,000 units/s and no more,
// on a [[listener]] of its own; the free pool is noisy's 100) shares the event loop and its upstream
// connections with a bucket (noisy: hard limit 100/s) that reads, in one
// multi-get, ten values of 1,000,000 bytes written around the proxy, each
// a surprise whose excess waits in its slot for 2.4 s of engine time.
// At every 20 ms of the fake clock calm has had its reservation beyond
// the burst it had at once (98% of 1,000 units/s), whatever noisy waits for, and noisy no
// more than its hard limit's bound.
//
// Each client's write is read by the proxy (inputRead) before the clock
// moves or a reading settles. Before, calm's burst was 99 or 100 from run
// to run (its first set's unit spent before or after the clock's first
// move), and with the writes 20 ms late the first reading counted a burst
// of 0 and failed at 20 ms; now a burst of 100 and 1,100 reads by 1 s on
// every run (logged).
func TestRule3ReservedNeighbourBesideSurpriseStorm(t *testing.T) {
	t.Parallel()
	p, clk, calmAddr := noisyAndCalm(t, "capacity = 1100", "hard_limit = 100\n", "reserved = 1000\nhard_limit = 1000\n")
	direct := dial(t, p.MC.Addr)
	var keys []string
	for i := 0; i < 10; i++ {
		k := fmt.Sprintf("big%d", i)
		keys = append(keys, k)
		if r, err := direct.Set([]byte("noisy:"+k), bytes.Repeat([]byte("v"), 1_000_000)); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("seed memcached: %v %v", r, err)
		}
	}
	calm, err := net.Dial("tcp", calmAddr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { calm.Close() })
	waitOpen(t, p, calm)
	set := "set s 0 0 1 noreply\r\nx\r\n"
	if _, err := io.WriteString(calm, set); err != nil {
		t.Fatal(err)
	}
	inputRead(t, p, calm, len(set)) // its unit spent before the clock moves, not out of the burst banked
	clk.Advance(time.Second)
	var calmHits atomic.Int64
	go countHits(calm, &calmHits)
	noisy := rawDial(t, p.Addr)
	waitOpen(t, p, noisy)
	bc := countBytes(noisy)
	get := "get " + strings.Join(keys, " ") + "\r\n"
	if _, err := io.WriteString(noisy, get); err != nil {
		t.Fatal(err)
	}
	inputRead(t, p, noisy, len(get))
	settledOwing(t, p, bc)
	pipeline := strings.Repeat("mg s v\r\n", 1500)
	if _, err := io.WriteString(calm, pipeline); err != nil {
		t.Fatal(err)
	}
	inputRead(t, p, calm, len(set)+len(pipeline)) // its burst answered at the first reading
	const step = 20 * time.Millisecond
	var elapsed time.Duration
	var burst int64 // what calm had at once: its burst
	for elapsed < time.Second {
		settledOwing(t, p, bc)
		eventually(t, time.Minute, "calm read every answer", answeredAll(t, p, "calm", &calmHits))
		if elapsed == 0 {
			burst = calmHits.Load()
		}
		got, want := calmHits.Load()-burst, int64(1000*elapsed/time.Second)
		if got < want*98/100 {
			t.Fatalf("after %v of engine time calm had %d reads of 1 unit beyond its burst of %d, under 98%% of its reservation's %d", elapsed, got, burst, want)
		}
		if n := bc.received / 1_000_000; int(n)*245 > int(100*elapsed/time.Second)+257+10 {
			t.Fatalf("after %v of engine time noisy had %d values (%d units) at a hard limit of 100/s", elapsed, n, n*245)
		}
		clk.Advance(step)
		elapsed += step
	}
	settledOwing(t, p, bc)
	eventually(t, time.Minute, "calm read every answer", answeredAll(t, p, "calm", &calmHits))
	t.Logf("calm: a burst of %d, %d reads by %v; noisy: %d values", burst, calmHits.Load(), elapsed, bc.received/1_000_000)
	if bc.received >= 10*1_000_000 {
		t.Fatal("noisy had every value within a second at 100 units/s")
	}
}

// TestRule3DebtPaidWithASurpriseIsCharged: the unpaid excess of a surprise
// whose session closed (a: 1 MB written around the proxy, billed 1 unit)
// is its bucket's debt, billed with the bucket's next admission, here the
// payment of another read's surprise (b: a key listed at class 32 through
// the proxy, then overwritten with 1 MB around it). The debt is paid, not
// given back when b's read settles: the throttle charges the bucket
// exactly the units the proxy counted read and written (and, with a open
// until it pays, the same).
func TestRule3DebtPaidWithASurpriseIsCharged(t *testing.T) {
	bothWays(t, "closeA", debtPaidWithASurprise)
}

func debtPaidWithASurprise(t *testing.T, closeA bool) {
	clk := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"\nburst_ms = 100", loops: 1,
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 1000\n"}, clk)
	w := dial(t, p.Addr)
	setValue(t, w, "big1", 100_000) // listed at class 32
	direct := dial(t, p.MC.Addr)
	setValue(t, direct, "default:big0", 1_000_000) // around the proxy: 245 units
	setValue(t, direct, "default:big1", 1_000_000)
	clk.Advance(time.Second)
	a, b := rawDial(t, p.Addr), rawDial(t, p.Addr)
	waitOpen(t, p, a)
	waitOpen(t, p, b)
	ac, bc := countBytes(a), countBytes(b)
	thaw := p.MC.Freeze(t)
	for _, c := range []struct {
		conn net.Conn
		key  string
	}{{b, "big1"}, {a, "big0"}} { // billed 32 and 1, both in flight
		if _, err := fmt.Fprintf(c.conn, "mg %s v\r\n", c.key); err != nil {
			t.Fatal(err)
		}
		dispatched(t, p)
	}
	thaw()
	eventually(t, time.Minute, "both surprises waiting to be paid", func() bool { return owingSlots(t, p) == 2 })
	if closeA {
		a.Close() // its excess, 244 units, becomes the bucket's debt
		eventually(t, time.Minute, "a's session gone", func() bool { return owingSlots(t, p) == 1 })
	}
	clients := []*byteCounter{bc, ac}
	if closeA {
		clients = clients[:1]
	}
	for step := 0; bc.received < 1_000_000 || !closeA && ac.received < 1_000_000; step++ {
		if step == 100 {
			t.Fatalf("b has %d bytes of its answer after 10 s of engine time", bc.received)
		}
		clk.Advance(100 * time.Millisecond)
		settledOwing(t, p, clients...)
	}
	if u := bucketUnits(t, p, "default"); u.engine != u.read+u.write {
		t.Fatalf("the proxy counted %d units read and %d written, the throttle charged %d", u.read, u.write, u.engine)
	}
}

// TestRule3ClosedSessionSurpriseBecomesDebt: a bucket above its
// reservation (noisy, none: its commands are admitted on the free pool of
// 1,000 units/s, burst 100 ms) pipelines ten meta gets of 1 MB values
// written around the proxy (each billed 1 unit, each costs 245), and
// closes: while its answers wait to be paid (one excess is admitted on
// the paid-up pool, nine become debt), or before memcached answered
// (every excess becomes debt: the answers reach a closed session). Either
// way the excess is noisy's debt, never charged at once to the pool: a
// pool neighbour (calm) waits at most a burst and one command (before the
// fix, closing in flight charged the pool 2,440 units and calm waited
// 2.35 s).
func TestRule3ClosedSessionSurpriseBecomesDebt(t *testing.T) {
	bothWays(t, "inFlight", closedSurpriseBecomesDebt)
}

func closedSurpriseBecomesDebt(t *testing.T, inFlight bool) {
	const n = 10
	p, clk, _ := noisyAndCalm(t, "capacity = 1000\nburst_ms = 100", "", "")
	direct := dial(t, p.MC.Addr)
	var mg bytes.Buffer
	for i := 0; i < n; i++ {
		setValue(t, direct, fmt.Sprintf("noisy:big%d", i), 1_000_000) // around the proxy
		fmt.Fprintf(&mg, "mg big%d v\r\n", i)
	}
	clk.Advance(time.Second) // the pool's burst banked
	x := rawDial(t, p.Addr)
	waitOpen(t, p, x)
	countBytes(x)
	thaw := p.MC.Freeze(t)
	if _, err := x.Write(mg.Bytes()); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the ten reads admitted", func() bool { return p.Engine().Bucket("noisy").Stats().Commands == n })
	if !inFlight {
		thaw()
		eventually(t, time.Minute, "nine surprises wait to be paid", func() bool { return owingSlots(t, p) == n-1 })
	}
	x.Close()
	eventually(t, time.Minute, "x's session closed", func() bool { return sessionCount(t, p) == 0 })
	if inFlight {
		thaw()
	}
	eventually(t, time.Minute, "the reads settled", func() bool { return bucketUnits(t, p, "noisy").read == n*245 })
	calm := p.Engine().Bucket("calm")
	g, wait := calm.AdmitCost(nil, throttle.NonBlocking, throttle.Cost{Known: 1})
	if g.Domain != throttle.Held {
		calm.Settle(g, 1)
	}
	if bound := 100*time.Millisecond + 245*time.Millisecond; g.Domain == throttle.Held && wait > bound {
		t.Fatalf("a pool neighbour's 1-unit command is refused for %v of engine time after noisy's closed surprises (bound: a burst and one command, %v)", wait, bound)
	}
}

// TestRule3OwedPaymentRetriedAfterLimitChange: a surprise whose bucket has
// no rate to pay with (a reload gave the whole capacity to another
// bucket's reservation: no wake-up time) is paid once a reload gives the
// rate back (wakeAll re-tries the payments), and a write of the bucket
// whose listing waits for that read's settle goes too. Before the fix
// neither came, however long the clock ran. The read is admitted before
// the reload (inputRead: dispatched alone is met before the loop has read
// it; read after the reload, it was held, never a surprise, and the test
// waited out its minute).
func TestRule3OwedPaymentRetriedAfterLimitChange(t *testing.T) {
	t.Parallel()
	clk := throttle.NewFakeClock(time.Hour)
	tail := func(otherRes int) string {
		return fmt.Sprintf("[[bucket]]\nname = \"default\"\nhard_limit = 1000\n[[bucket]]\nname = \"other\"\nreserved = %d\nhard_limit = 1000\n", otherRes)
	}
	tc := testConfig{throttle: "capacity = 1000\nburst_ms = 100", loops: 1, tail: tail(500)}
	p := startProxyClock(t, tc, clk)
	reload := func(otherRes int) {
		t.Helper()
		c := tc
		c.tail = tail(otherRes)
		cfg, err := bucketcfg.Parse([]byte(c.render(p.opts.listen, []string{p.MC.Addr}, p.StatePath)))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Reload(cfg); err != nil {
			t.Fatal(err)
		}
	}
	setValue(t, dial(t, p.MC.Addr), "default:big", 100_000) // around the proxy: 25 units
	clk.Advance(time.Second)
	x := rawDial(t, p.Addr)
	waitOpen(t, p, x)
	bc := countBytes(x)
	thaw := p.MC.Freeze(t)
	mg := "mg big v\r\n"
	if _, err := x.Write([]byte(mg)); err != nil {
		t.Fatal(err)
	}
	inputRead(t, p, x, len(mg)) // admitted before the reload takes the free pool away
	dispatched(t, p)
	reload(1000) // the free pool is 0
	thaw()
	eventually(t, time.Minute, "the surprise waits to be paid", func() bool { return owingSlots(t, p) == 1 })
	reload(500) // the free pool is back
	y := rawDial(t, p.Addr)
	waitOpen(t, p, y)
	yc := countBytes(y)
	if _, err := fmt.Fprintf(y, "ms k2 200000\r\n%s\r\n", bytes.Repeat([]byte("v"), 200_000)); err != nil { // class 64: a listing
		t.Fatal(err)
	}
	for step := 0; bc.received < 100_000 || yc.received == 0; step++ {
		if step == 100 {
			t.Fatalf("after 10 s of engine time with the free pool back: %d bytes of the read's answer (owing %d), %d of the listing write's", bc.received, owingSlots(t, p), yc.received)
		}
		clk.Advance(100 * time.Millisecond)
		settledOwing(t, p, bc, yc)
	}
}

// noisyAndCalm starts a proxy on a fake clock with the [throttle] lines
// th and two buckets: noisy (its lines noisyLines), every connection's by
// default, and calm (calmLines), on a [[listener]] of its own at calmAddr.
func noisyAndCalm(t *testing.T, th, noisyLines, calmLines string) (p *testProxy, clk *throttle.FakeClock, calmAddr string) {
	clk = throttle.NewFakeClock(time.Hour)
	calmAddr = testmc.FreeAddr(t)
	p = startProxyClock(t, testConfig{throttle: th, loops: 1, proxy: `default_bucket = "noisy"`,
		tail: "[[bucket]]\nname = \"noisy\"\n" + noisyLines + "[[bucket]]\nname = \"calm\"\n" + calmLines +
			fmt.Sprintf("[[listener]]\nlisten = %q\nbucket = \"calm\"\n", calmAddr)}, clk)
	return p, clk, calmAddr
}

// A surprise's payment that the bucket cannot admit yet is re-tried at the
// time the engine computes (one wake entry) and at each refund (rule 5).
// Each failed re-try pushes a wake entry for the same session; only the
// latest stands (session.oweSeq). Before, none was dropped while the
// session owed: a pool neighbour's 50 refunded reads left 51 entries for
// one payment, each re-trying it when due.
func TestRule3OwedPaymentKeepsOneWakeEntry(t *testing.T) {
	t.Parallel()
	p, clk, calmAddr := noisyAndCalm(t, "capacity = 1000\nburst_ms = 100", "hard_limit = 100\n", "")
	direct := dial(t, p.MC.Addr)
	setValue(t, direct, "noisy:big", 100_000) // around the proxy: 25 units
	clk.Advance(time.Second)
	x := rawDial(t, p.Addr)
	waitOpen(t, p, x)
	countBytes(x)
	if _, err := x.Write([]byte("mg big v\r\n")); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the surprise waits to be paid", func() bool { return owingSlots(t, p) == 1 })
	calm := dial(t, calmAddr)
	setValue(t, calm, "s", 10)
	p.Engine().Bucket("calm").ReadCost().Surprise(32, 0) // calm's reads billed 32, each gives 31 back to the pool
	for i := 0; i < 50; i++ {
		if r, err := calm.Get([]byte("s")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("calm get %d: %v %v", i, r, err)
		}
	}
	if owingSlots(t, p) != 1 {
		t.Fatal("the payment went with the clock standing still")
	}
	n := 0
	onLoop(t, p, func(lp *loop) {
		for _, e := range lp.holds {
			if e.owe && e.live() {
				n++
			}
		}
	})
	if n != 1 {
		t.Fatalf("one payment waiting: %d live wake entries re-try it", n)
	}
}
