package throttle

import (
	"math/rand"
	"testing"
	"time"
)

// Helpers the tests of several files share.

const ms = time.Millisecond

// newEngine returns an engine on a fake clock reading 1 s, with no burst
// unless burst says otherwise, so that waits are exact.
func newEngine(t testing.TB, capacity Limit, burst time.Duration) (*Engine, *FakeClock) {
	t.Helper()
	clk := NewFakeClock(time.Second)
	if burst == 0 {
		burst = -1
	}
	e, err := New(Config{Capacity: capacity, Burst: burst, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return e, clk
}

func addBucket(t testing.TB, e *Engine, name string, reserved, hard Limit) *Bucket {
	t.Helper()
	b, err := e.AddBucket(name, reserved, hard)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// run admits one command of the given units, charging it at once; it
// returns the domain, or Held and the wait.
func run(b *Bucket, w *Waiter, mode Mode, units int64) (Domain, time.Duration) {
	d, wait := b.Admit(w, mode)
	if d != Held {
		b.Charge(d, units)
	}
	return d, wait
}

func wantAdmit(t *testing.T, b *Bucket, mode Mode, units int64, want Domain) {
	t.Helper()
	if d, wait := run(b, nil, mode, units); d != want {
		t.Fatalf("%s: Admit = %v (wait %v), want %v", b.Name(), d, wait, want)
	}
}

type fifoConn struct {
	id   int
	w    Waiter
	wake time.Duration
}

func equalOrder(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A simulation drives an engine on a fake clock in fixed steps. Each
// connection issues commands back to back (zero round trip: admitted,
// executed and charged at once) until it is held, then sleeps for the wait
// the engine gave it, as the proxy does; a bucket's demand is either
// saturating or open-loop at a fixed rate.

type simBucket struct {
	name           string
	reserved, hard Limit
	demand         float64 // units/s over all conns; 0 saturates
	conns          int
	mode           Mode
	maxUnits       int64                    // command sizes are 1..maxUnits units
	uDemand        float64                  // > 0 adds an Unthrottled conn with this demand
	uUntil         time.Duration            // > 0: the Unthrottled conn issues nothing from then on
	weight         int                      // 0: DefaultWeight
	start          time.Duration            // its conns issue nothing before then
	on             func(time.Duration) bool // if set, its conns issue nothing while it is false

	b        *Bucket
	units    int64           // charged after warm-up, by the conns
	resUnits int64           // of which admitted against its reservation
	uUnits   int64           // by the Unthrottled conn
	windows  []int64         // units charged by the conns in each simConfig.window from 0
	waits    []time.Duration // after warm-up: how long each held command was held
	onTime   time.Duration   // after warm-up: how long on was true (all of it without on)
}

type simConn struct {
	sb      *simBucket
	mode    Mode
	demand  float64 // units/s; 0 saturates
	backlog float64
	w       Waiter
	wake    time.Duration
	heldAt  time.Duration // when its command was first held; -1: not held
}

type simConfig struct {
	capacity   Limit
	burst      time.Duration
	step       time.Duration
	warm, span time.Duration // measure over [warm, warm+span)
	seed       int64
	freePool   FreePoolMode
	window     time.Duration // > 0: also count each bucket's units per window
	late       time.Duration // > 0: each held conn wakes up to this much (uniformly) late
}

func defaultSim(capacity Limit) simConfig {
	return simConfig{capacity: capacity, burst: 10 * ms, step: 100 * time.Microsecond,
		warm: time.Second, span: 10 * time.Second, seed: 1}
}

// simulate runs cfg and returns each bucket's measured rate in units/s.
func simulate(t testing.TB, cfg simConfig, buckets []*simBucket) map[string]float64 {
	t.Helper()
	return simulateWith(t, cfg, buckets, nil)
}

// simulateWith is simulate, calling setup (if not nil) once the buckets
// are in place.
func simulateWith(t testing.TB, cfg simConfig, buckets []*simBucket, setup func(*Engine)) map[string]float64 {
	t.Helper()
	clk := NewFakeClock(0)
	e, err := New(Config{Capacity: cfg.capacity, Burst: cfg.burst, Clock: clk, FreePool: cfg.freePool})
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewSource(cfg.seed))
	var conns []*simConn
	for _, sb := range buckets {
		sb.add(t, e)
		for i := 0; i < sb.conns; i++ {
			conns = append(conns, &simConn{sb: sb, mode: sb.mode, demand: sb.demand / float64(sb.conns), wake: sb.start, heldAt: -1})
		}
		if sb.uDemand > 0 {
			conns = append(conns, &simConn{sb: sb, mode: Unthrottled, demand: sb.uDemand, wake: sb.start, heldAt: -1})
		}
	}
	if setup != nil {
		setup(e)
	}
	end := cfg.warm + cfg.span
	for now := time.Duration(0); now < end; now += cfg.step {
		clk.Set(now)
		for _, c := range conns {
			if c.demand > 0 && now >= c.sb.start {
				c.backlog = min(c.backlog+c.demand*cfg.step.Seconds(), c.demand) // at most 1 s queued
			}
		}
		for _, sb := range buckets {
			if now >= cfg.warm && (sb.on == nil || sb.on(now)) {
				sb.onTime += cfg.step
			}
		}
		r.Shuffle(len(conns), func(i, j int) { conns[i], conns[j] = conns[j], conns[i] })
		for _, c := range conns {
			sb := c.sb
			if sb.on != nil && !sb.on(now) {
				c.w.Cancel() // an idle client has nothing held
				continue
			}
			if c.mode == Unthrottled && sb.mode != Unthrottled && sb.uUntil > 0 && now >= sb.uUntil {
				continue
			}
			for n := 0; c.wake <= now && n < 64; n++ {
				if c.demand > 0 && c.backlog < 1 {
					break
				}
				d, wait := sb.b.Admit(&c.w, c.mode)
				if d == Held {
					c.wake = now + min(wait, end)
					if cfg.late > 0 {
						c.wake += time.Duration(r.Int63n(int64(cfg.late)))
					}
					if c.heldAt < 0 {
						c.heldAt = now
					}
					break
				}
				if c.heldAt >= 0 {
					if now >= cfg.warm {
						sb.waits = append(sb.waits, now-c.heldAt)
					}
					c.heldAt = -1
				}
				u := 1 + r.Int63n(sb.maxUnits)
				sb.b.Charge(d, u)
				c.backlog -= float64(u)
				if cfg.window > 0 && c.mode == sb.mode {
					i := int(now / cfg.window)
					for len(sb.windows) <= i {
						sb.windows = append(sb.windows, 0)
					}
					sb.windows[i] += u
				}
				switch {
				case now < cfg.warm:
				case c.mode == Unthrottled && sb.mode != Unthrottled:
					sb.uUnits += u
				default:
					sb.units += u
					if d == Reserved {
						sb.resUnits += u
					}
				}
			}
		}
	}
	got := map[string]float64{}
	for _, sb := range buckets {
		got[sb.name] = float64(sb.units) / cfg.span.Seconds()
		got[sb.name+"/unthrottled"] = float64(sb.uUnits) / cfg.span.Seconds()
	}
	return got
}

// add adds the simulated bucket to e (its weight too) and defaults its
// command size to one unit.
func (sb *simBucket) add(t testing.TB, e *Engine) {
	t.Helper()
	var err error
	if sb.b, err = e.AddBucket(sb.name, sb.reserved, sb.hard); err != nil {
		t.Fatal(err)
	}
	if sb.maxUnits == 0 {
		sb.maxUnits = 1
	}
	if sb.weight != 0 {
		if err := sb.b.SetWeight(sb.weight); err != nil {
			t.Fatal(err)
		}
	}
}
