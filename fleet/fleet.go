package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// LossPolicy says which limits an instance enforces once it has lost the
// store for longer than its grants last (DESIGN.md section 10).
type LossPolicy uint8

const (
	// Share enforces each fleet limit divided by the number of instances
	// alive at the last contact.
	Share LossPolicy = iota
	// Open enforces the fleet limits as if this instance were alone.
	Open
)

// ParseLossPolicy parses "share" or "open".
func ParseLossPolicy(s string) (LossPolicy, error) {
	switch s {
	case "share":
		return Share, nil
	case "open":
		return Open, nil
	}
	return 0, fmt.Errorf("on_store_loss %q: want \"share\" or \"open\"", s)
}

// String returns "share" or "open".
func (p LossPolicy) String() string {
	if p == Open {
		return "open"
	}
	return "share"
}

// Config configures a Fleet.
type Config struct {
	// Store is the fleet's shared store (see OpenStore). The Fleet does not
	// close it.
	Store *Store
	// Instance names this instance in the store; unique in the fleet,
	// without '|' or white space.
	Instance string
	// Period is the grant period: one store call per period, and each
	// grant lasts about one period. At least 50 ms.
	Period time.Duration
	// OnStoreLoss picks the limits enforced while the store is lost.
	OnStoreLoss LossPolicy
	// Clock times periods and usage rates; nil selects a real clock.
	Clock throttle.Clock
	// CallTimeout bounds each sync's store calls in real time (0: half a
	// period). A test on a fake clock sets it long: whether a call
	// succeeds must not depend on how busy the machine is.
	CallTimeout time.Duration
	// Instances is how many instances the fleet had when this one last
	// knew (0: unknown, taken as 1). Until the store answers it divides
	// the limits under Share, and it keeps an empty store's first caller
	// from taking the shares instances of its earlier life still hold.
	Instances int
}

// Usage is what the instance reports about one of its buckets: the fleet's
// limits as configured here and the bucket's local counters (running
// totals since the bucket was created, and the callers held right now).
type Usage struct {
	Name                string
	Reserved, HardLimit throttle.Limit
	Units               uint64 // units charged here, running total
	Rejected            uint64 // non-blocking refusals here, running total
	Waiting             int    // callers held here now
	// Weight is the bucket's weight (1..throttle.MaxWeight; 0 counts as
	// 1): its share of the fleet's free pool relative to the other buckets'
	// when the instance shares the free pool fairly (Node.Fair).
	Weight int
}

// Node is the node-wide part of a report: the fleet's capacity and its
// free pool (capacity minus the finite reservations), as configured here.
type Node struct {
	Capacity, FreePool throttle.Limit
	// Fair is set when the instance shares the free pool by weight
	// (free_pool = "fair"): the store then divides the fleet's free pool
	// among the buckets fleet-wide, by weight, and grants each bucket a
	// share here ([BucketGrant].Pool).
	Fair bool
}

// Hooks connect a Fleet to the instance it runs in. Each is called from the
// Fleet's own goroutine (or from Update's caller for State), never
// concurrently with itself; all are required.
type Hooks struct {
	// Usage reports the node and appends one Usage per bucket in force to
	// dst. It must be cheap: it runs every tenth of a period.
	Usage func(dst []Usage) (Node, []Usage)
	// State hands over the fleet's state document with its token
	// ("id:version"), different from the last one adopted. The instance
	// adopts it (and keeps its local copy) or returns why not: the
	// document is then handed over again at the next sync.
	State func(doc []byte, token string) error
	// Seed returns the document an empty store is seeded with: this
	// instance's state.
	Seed func() []byte
	// Granted announces new grants (or a change of mode).
	Granted func(*Grants)
	// Synced reports each sync's duration and outcome. An err wrapping
	// ErrNameTaken says the configured name was taken and the instance
	// now reports under another (Fleet.Instance).
	Synced func(d time.Duration, err error)
}

// Fleet keeps one instance's grants from the shared store: every period it
// reports the instance's usage and demand per bucket and takes back its
// shares of the fleet's limits (see the package documentation). Create it
// with New, start it with Start, stop it with Close.
type Fleet struct {
	cfg   Config
	hooks Hooks
	clock throttle.Clock
	epoch string

	grants    atomicGrants
	updates   sync.Mutex   // serialises Update's read-change-write
	updateGen atomic.Int64 // changes written by Update: a sync reply older than one carries a stale document
	name      atomic.Pointer[string]

	// Owned by the sync goroutine (or the test driving syncOnce).
	seq      int64
	known    string // the token of the last state document seen
	lastOK   time.Duration
	contact  bool
	lives    [liveMemory]int // the live instance counts of the last good calls (a ring)
	livesN   int             // good calls recorded in lives
	lastSync time.Duration
	samples  demandSamples
	prev     map[string]counters
	base     map[string]uint64 // units counted before the epoch began
	fleetRef map[string]fleetCount
	buf      []Usage
	moves    map[string]*moveTrack // per bucket, for the early calls (move.go)
	early    int                   // early calls since the last periodic one
	retry    bool                  // the last call failed (move.go)

	// The periodic work (run): a timer on the clock, re-armed by each
	// tick; tickMu serialises a tick with Close.
	tickMu  sync.Mutex
	timer   throttle.Timer
	closed  bool
	ticks   int          // ticks since the last sync
	next    atomic.Int64 // the clock reading the next tick is due at
	started bool
}

type counters struct{ units, rejected uint64 }

type fleetCount struct {
	units int64
	at    time.Duration
}

// New returns a Fleet for cfg; it does not contact the store until Start.
func New(cfg Config, h Hooks) (*Fleet, error) {
	if cfg.Store == nil {
		return nil, errors.New("fleet: no store")
	}
	if cfg.Period < 50*time.Millisecond {
		return nil, fmt.Errorf("fleet: grant_period %v is below 50ms", cfg.Period)
	}
	if err := CheckInstance(cfg.Instance); err != nil {
		return nil, err
	}
	if h.Usage == nil || h.State == nil || h.Seed == nil || h.Granted == nil || h.Synced == nil {
		return nil, errors.New("fleet: every hook is required")
	}
	if cfg.Clock == nil {
		cfg.Clock = throttle.NewRealClock()
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = cfg.Period / 2
	}
	f := &Fleet{
		cfg:      cfg,
		hooks:    h,
		clock:    cfg.Clock,
		epoch:    newEpoch(),
		prev:     make(map[string]counters),
		base:     make(map[string]uint64),
		fleetRef: make(map[string]fleetCount),
	}
	f.name.Store(&cfg.Instance)
	f.grants.Store(&Grants{policy: cfg.OnStoreLoss, live: max(1, cfg.Instances)})
	for i := range f.lives {
		f.lives[i] = max(1, cfg.Instances)
	}
	return f, nil
}

// fallbackLive is the number of instances a Share fallback divides each
// limit by: the most the store counted alive at any of the last liveMemory
// good calls. Not only the last: a store that comes back for a moment has
// forgotten the instances whose leases ran out meanwhile, and the first to
// call would be told it is alone; were the store lost again, it would take
// whole limits while the others kept their parts. Once the fleet has been
// seen whole again the count is exact; a fleet that really shrank is
// divided by its old size for liveMemory more good calls (erring low).
func (f *Fleet) fallbackLive() int {
	n := 1
	for _, l := range f.lives {
		n = max(n, l)
	}
	return n
}

// newEpoch names a new run of running totals: the wall clock in ns.
func newEpoch() string { return strconv.FormatInt(time.Now().UnixNano(), 36) }

// ErrNameTaken is reported (wrapped, through Hooks.Synced) when another
// live instance reports under this instance's name: this one moves to a
// name of its own so that both count, and the configuration should be
// fixed.
var ErrNameTaken = errors.New("fleet: another live instance uses this instance name")

// CheckInstance reports whether name can name an instance in the store.
func CheckInstance(name string) error {
	if name == "" || len(name) > 200 {
		return fmt.Errorf("fleet: instance name %q must be 1 to 200 bytes", name)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c == '|' || c >= 0x7f {
			return fmt.Errorf("fleet: instance name %q has a character that is not allowed (space, control, '|' or non-ASCII)", name)
		}
	}
	return nil
}

// Grants returns the grants in force. Never nil; safe from any goroutine.
func (f *Fleet) Grants() *Grants { return f.grants.Load() }

// Instance returns the name this instance reports under: the configured
// one, or after a conflict (ErrNameTaken) that name with "~" and the
// instance's epoch.
func (f *Fleet) Instance() string { return *f.name.Load() }

// Period returns the grant period.
func (f *Fleet) Period() time.Duration { return f.cfg.Period }

// Start syncs once (waiting at most one period, so that an instance joining
// a fleet starts with its shares) and then arms the periodic work on the
// Fleet's clock (Config.Clock): a sample of the callers held every
// twentieth of a period, a sync every period, until Close. Each tick runs
// in a goroutine of its own (throttle.AfterFunc), never two at once.
func (f *Fleet) Start() {
	f.sample()
	f.syncOnce()
	f.tickMu.Lock()
	defer f.tickMu.Unlock()
	f.started = true
	next := f.clock.Now() + f.tickEvery()
	f.timer = throttle.AtFunc(f.clock, next, f.tick)
	f.next.Store(int64(next)) // after the timer is armed: see tick
}

// Close stops the periodic work, waits for a tick in progress, and tells
// the store this instance has left, so that the others take its shares at
// their next call (if the store cannot be told, they do after its lease).
func (f *Fleet) Close() {
	f.tickMu.Lock()
	started := f.started && !f.closed
	f.closed = true
	if f.timer != nil {
		f.timer.Stop()
	}
	f.tickMu.Unlock()
	if !started {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.Period/2)
	defer cancel()
	_ = f.cfg.Store.leave(ctx, f.Instance(), f.epoch)
}

// tickEvery is the time between two ticks: a twentieth of a period.
func (f *Fleet) tickEvery() time.Duration { return f.cfg.Period / samplesPerPeriod }

// NextTick returns the reading of the Fleet's clock at which its next tick
// (a sample, and every samplesPerPeriod-th a sync) is due. A test driving
// a fake clock knows that every tick due by a reading has run, its hooks
// returned, once NextTick is past that reading.
func (f *Fleet) NextTick() time.Duration { return time.Duration(f.next.Load()) }

// tick is the periodic work: it samples, syncs every samplesPerPeriod-th
// time, and arms the next tick one tick after this one was due (a late
// tick does not shift the ones after it; ticks a slow sync overran are
// skipped, as a time.Ticker drops them).
func (f *Fleet) tick() {
	f.tickMu.Lock()
	defer f.tickMu.Unlock()
	if f.closed {
		return
	}
	f.ticks++
	periodic := f.ticks >= samplesPerPeriod
	if periodic {
		f.ticks = 0
	}
	f.work(periodic)
	every := f.tickEvery()
	next := time.Duration(f.next.Load()) + every
	if now := f.clock.Now(); next <= now {
		next += (now - next + every) / every * every
	}
	// Armed for the reading next, not for a delay from now: a fake clock
	// moved in between would put a delay past next, and a test waiting for
	// the tick due at next would wait forever.
	throttle.ResetAt(f.clock, f.timer, next)
	f.next.Store(int64(next))
}

// lease is how long the store counts an instance's shares after its last
// call: one period and a margin for a late call.
func (f *Fleet) lease() time.Duration {
	return f.cfg.Period + max(f.cfg.Period/4, 50*time.Millisecond)
}

// work is one tick's work: a sample, then the periodic sync when due, or
// an early one when a bucket's load moved (move.go).
func (f *Fleet) work(periodic bool) {
	f.sample()
	switch {
	case periodic:
		f.early = 0
		f.retry = !f.syncOnce()
	case f.earlyDue():
		f.early++
		f.retry = !f.syncOnce()
	}
}

// sample records the callers held per bucket now, for the demand estimate,
// and the usage the early calls watch.
func (f *Fleet) sample() {
	_, f.buf = f.hooks.Usage(f.buf[:0])
	f.samples.add(f.buf)
	f.track(f.buf)
}

// syncOnce makes one store call (two when the store must be seeded first)
// and puts its grants, or the fallback for a lost store, in force. It
// reports whether the call succeeded.
func (f *Fleet) syncOnce() bool {
	ctx, cancel := context.WithTimeout(context.Background(), f.cfg.CallTimeout)
	defer cancel()
	start := time.Now() // the call's real duration, for the metrics
	err := f.exchange(ctx)
	f.hooks.Synced(time.Since(start), err)
	if err != nil {
		f.lost()
	}
	return err == nil
}

// exchange is one report and its grants.
func (f *Fleet) exchange(ctx context.Context) error {
	node, usage := f.hooks.Usage(f.buf[:0])
	f.buf = usage
	now := f.clock.Now()
	req := f.request(node, usage, now)
	gen := f.updateGen.Load()
	rep, err := f.cfg.Store.sync(ctx, req)
	if err == nil && rep.status == "seed" {
		if _, _, err = f.cfg.Store.Seed(ctx, f.hooks.Seed()); err != nil {
			return err
		}
		// A new store: a new epoch whose running totals start now, so
		// that it counts only what is used from now on, and whose first
		// call may take the name back from an earlier run.
		f.epoch = newEpoch()
		for i, u := range usage {
			f.base[u.Name] = u.Units
			req.buckets[i].cum = 0
		}
		req.epoch = f.epoch
		f.seq = 1
		req.seq = f.seq
		rep, err = f.cfg.Store.sync(ctx, req)
	}
	if err != nil {
		return err
	}
	switch rep.status {
	case "ok":
	case "stale":
		return nil // a duplicate: the grants in force stay
	case "conflict":
		// Two live instances under one name would each take a share
		// as if alone. This one moves to a name of its own (its
		// configured name and its epoch) at its next sync, and says so.
		taken := f.Instance()
		name := f.cfg.Instance + "~" + f.epoch
		f.name.Store(&name)
		f.seq = 0
		return fmt.Errorf("%w: %q; reporting as %q from now on", ErrNameTaken, taken, name)
	default:
		return fmt.Errorf("fleet: sync: status %q", rep.status)
	}
	f.lastSync = now
	for _, u := range usage {
		f.prev[u.Name] = counters{u.Units, u.Rejected}
	}
	// A document read before an Update of this instance landed is older
	// than the one in force here: skip it (the next sync brings the
	// current one if it differs).
	if rep.state != nil && rep.token != f.known && gen == f.updateGen.Load() {
		if f.hooks.State(rep.state, rep.token) == nil {
			f.known = rep.token
		}
	}
	f.contact, f.lastOK = true, now
	f.reported(req, rep)
	f.lives[f.livesN%liveMemory] = rep.instances
	f.livesN++
	f.put(f.fromReply(rep))
	return nil
}

// lost applies the store-loss rule once the last grants are older than
// lossAfter periods: until then they stay in force. Under Share the
// fallback's parts are first capped by the last grants, for capPeriods
// more periods: the instances' last good calls were up to a period apart,
// so each falls back at its own time, and one that took its whole part
// (more than its grant, for an instance with little demand) while the
// others still held their grants would run the fleet over its limits.
func (f *Fleet) lost() {
	g := f.grants.Load()
	since := f.clock.Now() - f.lastOK
	if !f.contact || since < lossAfter*f.cfg.Period {
		if g.storeUp {
			ng := *g
			ng.storeUp = false
			f.put(&ng)
		}
		return
	}
	capped := f.cfg.OnStoreLoss == Share && since < (lossAfter+capPeriods)*f.cfg.Period
	switch {
	case g.mode == modeGranted && capped:
		f.put(&Grants{mode: modeFallback, policy: f.cfg.OnStoreLoss, live: f.fallbackLive(), last: g})
	case g.mode == modeGranted || (g.last != nil && !capped):
		f.put(&Grants{mode: modeFallback, policy: f.cfg.OnStoreLoss, live: f.fallbackLive()})
	default:
		// Offered again at every failed call: a Granted hook that could
		// not apply them once (the proxy skips a sync's grants while an
		// admin change holds its lock) does at the next call.
		f.put(g)
	}
}

func (f *Fleet) put(g *Grants) {
	f.grants.Store(g)
	f.hooks.Granted(g)
}

// Update changes the fleet's state document: change gets the document in
// force (nil when the store holds none) and returns the new one, which is
// written if nobody changed the document meanwhile (else change runs again
// on the newer one, up to 8 times). It returns the new token. Errors: the
// store's (unreachable, slow: the document was not changed, and will not
// be), ErrOutcomeUnknown (the write was sent, and the store lost before it
// could tell whether it was made), change's own, or ErrConflict after too
// many races. Safe from any goroutine; two round trips per try.
func (f *Fleet) Update(ctx context.Context, change func(doc []byte) ([]byte, error)) (string, error) {
	f.updates.Lock()
	defer f.updates.Unlock()
	for try := 0; try < 8; try++ {
		doc, tok, ok, err := f.cfg.Store.Load(ctx)
		if err != nil {
			return "", err
		}
		if !ok {
			doc = nil
		}
		next, err := change(doc)
		if err != nil {
			return "", err
		}
		if !ok {
			nt, seeded, err := f.cfg.Store.SeedResolved(ctx, next)
			if err != nil {
				return "", err
			}
			if seeded {
				f.updateGen.Add(1)
				return nt, nil
			}
			continue
		}
		nt, err := f.cfg.Store.Update(ctx, tok, next)
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil {
			return "", err
		}
		f.updateGen.Add(1)
		return nt, nil
	}
	return "", ErrConflict
}

// Dimensions of the protocol.
const (
	samplesPerPeriod = 20 // waiting callers sampled this often per period
	lossAfter        = 3  // periods a lost store's last grants stay in force
	// capPeriods is how long a Share fallback stays capped by the last
	// grants: until every other instance must have fallen back too. Their
	// last good calls were at most about a period before this one's (a
	// period between calls, plus a call's duration), and each falls back
	// at its first failed call after lossAfter periods, which comes at
	// most a period and a half (a period, plus a call timing out) later.
	// In the worst case (a slow last good call on one instance, calls
	// timing out on another) the cap lifts exactly when the last other
	// instance falls back: no margin; in the usual cases one to two
	// periods.
	capPeriods = 3
	// liveMemory is how many good calls' live counts the Share fallback
	// takes the largest of (fallbackLive).
	liveMemory = lossAfter + capPeriods
	growth     = 1.25
	headroom   = 2 // units/s an idle instance asks for each bucket
)

// request builds this period's report.
func (f *Fleet) request(node Node, usage []Usage, now time.Duration) *syncRequest {
	f.seq++
	req := &syncRequest{
		instance:   f.Instance(),
		epoch:      f.epoch,
		seq:        f.seq,
		lease:      f.lease(),
		knownToken: f.known,
		hint:       f.grants.Load().live,
		freePool:   limitArg(node.FreePool),
		fair:       node.Fair,
		buckets:    make([]bucketDemand, 0, len(usage)),
	}
	elapsed := now - f.lastSync
	if f.lastSync == 0 || elapsed <= 0 {
		elapsed = f.cfg.Period
	}
	g := f.grants.Load()
	var fpCap int64
	var fpWeight float64
	for _, u := range usage {
		prev, seen := f.prev[u.Name]
		rate := 0.0
		if seen && u.Units >= prev.units {
			rate = float64(u.Units-prev.units) / elapsed.Seconds()
		}
		waiting := f.samples.mean(u.Name)
		rejected := seen && u.Rejected > prev.rejected
		d := f.moved(u.Name, demand(rate, waiting, rejected))
		if u.Units < f.base[u.Name] {
			f.base[u.Name] = 0 // the bucket was created again
		}
		bd := bucketDemand{
			name: u.Name, reserved: limitArg(u.Reserved), hard: limitArg(u.HardLimit),
			cum: u.Units - f.base[u.Name], cap: d.cap, weight: d.weight, bucketWeight: float64(max(u.Weight, 1)),
		}
		// The free pool: what each bucket wants beyond its reservation,
		// at most its hard limit less its reservation.
		if u.Reserved != throttle.Unlimited {
			want := d.cap
			if want >= 0 {
				want -= g.reservedGrant(u.Name)
				if want < 0 {
					want = 0
				}
			}
			if h, ok := u.HardLimit.Finite(); ok {
				r, _ := u.Reserved.Finite()
				if want < 0 || want > h-r {
					want = h - r
				}
			}
			bd.poolCap = want
			if fpCap >= 0 {
				if want < 0 {
					fpCap = -1
				} else {
					fpCap += want
				}
			}
			if d.cap < 0 {
				fpWeight += d.weight
			}
		}
		req.buckets = append(req.buckets, bd)
	}
	req.fpCap = fpCap
	req.fpWeight = max(1, fpWeight)
	return req
}

// bucketWant is an instance's demand for one bucket.
type bucketWant struct {
	cap    int64   // units/s; -1 as much as it can get
	weight float64 // its weight when demands exceed the limit
}

// demand estimates what an instance wants of a bucket from its usage rate
// over the last period (units/s), the mean number of callers held over the
// last half period and whether non-blocking callers were refused. A bucket
// whose callers wait is saturated: it wants all it can get, weighted by
// how many wait (as one proxy would serve them, one waiting connection
// after another). Otherwise it wants its rate and room to grow.
func demand(rate, waiting float64, rejected bool) bucketWant {
	if waiting >= 0.5 || rejected {
		return bucketWant{cap: -1, weight: max(1, waiting)}
	}
	return bucketWant{cap: int64(math.Ceil(rate*growth)) + headroom, weight: 1}
}

func limitArg(l throttle.Limit) int64 {
	if n, ok := l.Finite(); ok {
		return n
	}
	return -1
}

// fromReply turns a store reply into the grants in force.
func (f *Fleet) fromReply(rep *syncReply) *Grants {
	g := &Grants{
		mode:     modeGranted,
		policy:   f.cfg.OnStoreLoss,
		storeUp:  true,
		live:     max(1, rep.instances),
		freePool: rep.freePool,
		buckets:  make(map[string]BucketGrant, len(rep.buckets)),
	}
	for _, b := range rep.buckets {
		bg := BucketGrant{Reserved: b.reserved, HardLimit: b.hard, Pool: b.pool, FleetUnitsPerSecond: -1}
		if ref, ok := f.fleetRef[b.name]; ok && rep.now > ref.at && b.fleetUnits >= ref.units {
			bg.FleetUnitsPerSecond = float64(b.fleetUnits-ref.units) / (rep.now - ref.at).Seconds()
		}
		f.fleetRef[b.name] = fleetCount{units: b.fleetUnits, at: rep.now}
		g.buckets[b.name] = bg
	}
	return g
}
