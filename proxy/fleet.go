package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/fleet"
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// fleetLink is the proxy's side of fleet mode (DESIGN.md section 10): the
// Fleet that keeps this instance's shares of the fleet's limits, and the
// token of the fleet's state document in force here.
//
// In fleet mode the configuration in force (the file with the state
// document's overrides) holds the fleet's limits; the throttle engine
// enforces this instance's shares of them (localLimits). The state
// document lives in the store; the state file is this instance's copy,
// used when it starts while the store is down.
type fleetLink struct {
	fl       *fleet.Fleet
	store    *fleet.Store
	instance string

	storeUp    atomic.Bool  // as of the last sync (for logging changes, and FLUSH)
	fallback   atomic.Bool  // the loss policy in force (for logging the change once)
	pushEpochs atomic.Bool  // local namespace epochs ahead of the store's
	instances  atomic.Int64 // live instances last saved in hintPath
	hintPath   string       // the state file's companion: the fleet's size

	smallerSince time.Time // since when the fleet is smaller than saved (Fleet goroutine)

	token string // the state document in force here ("id:version"); guarded by adminMu
}

// fakeFleetCallTimeout bounds a sync's store calls with Options.FleetClock
// (tests): a call that took longer than half a period of real time on a
// busy machine failed on one run and not on another.
const fakeFleetCallTimeout = 20 * time.Second

// fleetTimeout bounds a store round trip made for an admin change.
const fleetTimeout = 2 * time.Second

// fleetHint is the state file's companion in fleet mode: how many
// instances the fleet had at the last contact, for a start while the
// store is down (on_store_loss "share" divides by it).
type fleetHint struct {
	Instances int `json:"instances"`
}

func readFleetHint(path string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	var h fleetHint
	if json.Unmarshal(data, &h) != nil || h.Instances < 0 {
		return 0
	}
	return h.Instances
}

// writeFleetHint replaces the hint file atomically.
func writeFleetHint(path string, n int) error {
	data, _ := json.Marshal(fleetHint{Instances: n})
	if err := bucketcfg.WriteFileAtomic(path, append(data, '\n')); err != nil {
		return fmt.Errorf("fleet size file %w", err)
	}
	return nil
}

// hintShrinkAfter is how long the fleet must stay smaller before the
// saved size shrinks: instances stopping one after another (a rolling
// restart, or a whole fleet stopped) must not leave the last of them
// believing it is alone.
const hintShrinkAfter = 10 * time.Minute

// noteInstances saves the fleet's size when it grows, or when it has been
// smaller for hintShrinkAfter. Called from the Fleet's goroutine only.
func (link *fleetLink) noteInstances(srv *Server, n int, now time.Time) {
	saved := int(link.instances.Load())
	switch {
	case n == saved:
		link.smallerSince = time.Time{}
		return
	case n < saved:
		if link.smallerSince.IsZero() {
			link.smallerSince = now
		}
		if now.Sub(link.smallerSince) < hintShrinkAfter {
			return
		}
	}
	link.smallerSince = time.Time{}
	link.instances.Store(int64(n))
	if err := writeFleetHint(link.hintPath, n); err != nil {
		srv.log.Warn().Err(err).Msg("could not save the number of fleet instances")
	}
}

// redisLogger sends go-redis's own messages (connection pool failures,
// which repeat every period while the store is down) to the proxy's log at
// debug level: the fleet's sync failures are logged, sampled, already.
type redisLogger struct{ log zerolog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Debug().Str("component", "redis").Msg(fmt.Sprintf(format, v...))
}

// openFleet sets up fleet mode when the configuration names a store. The
// store is first contacted by startFleet. The fleet's periodic work runs on
// opts.FleetClock, else on the engine's clock (opts.Clock).
func (srv *Server) openFleet(cfg *bucketcfg.Config, opts Options) error {
	fc := cfg.Fleet
	if fc.RedisURL == "" {
		return nil
	}
	policy, err := fleet.ParseLossPolicy(fc.OnStoreLoss)
	if err != nil {
		return err
	}
	instance := fc.Instance
	if instance == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "localhost"
		}
		instance = host + "/" + cfg.Proxy.Listen
	}
	store, err := fleet.OpenStore(fc.RedisURL, fc.Name)
	if err != nil {
		return err // the URL is not in the error: it may hold a password
	}
	clock, timeout := opts.Clock, time.Duration(0)
	if opts.FleetClock != nil {
		clock, timeout = opts.FleetClock, fakeFleetCallTimeout
		store.SetClock(clock)
	}
	redis.SetLogger(redisLogger{srv.log})
	link := &fleetLink{store: store, instance: instance, hintPath: cfg.Throttle.StateFile + ".fleet"}
	link.storeUp.Store(true)
	hint := readFleetHint(link.hintPath)
	link.instances.Store(int64(hint))
	link.fl, err = fleet.New(fleet.Config{
		Store:       store,
		Instance:    instance,
		Period:      fc.GrantPeriod,
		OnStoreLoss: policy,
		Clock:       clock,
		CallTimeout: timeout,
		Instances:   hint,
	}, fleet.Hooks{
		Usage:   srv.fleetUsage,
		State:   srv.adoptFleetState,
		Seed:    srv.fleetSeed,
		Granted: srv.applyGrants,
		Synced:  srv.fleetSynced,
	})
	if err != nil {
		_ = store.Close()
		return err
	}
	srv.fleet = link
	return nil
}

// startFleet makes the first sync (so that the instance serves with its
// shares, not the whole limits) and starts the Fleet's goroutine.
func (srv *Server) startFleet() {
	if srv.fleet == nil {
		return
	}
	srv.fleet.fl.Start()
	srv.log.Info().Str("instance", srv.fleet.instance).Dur("grant_period", srv.fleet.fl.Period()).
		Bool("store_up", srv.fleet.fl.Grants().StoreUp()).Msg("fleet mode")
}

// stopFleet stops the Fleet's goroutine and closes the store.
func (srv *Server) stopFleet() {
	if srv.fleet == nil {
		return
	}
	srv.fleet.fl.Close()
	_ = srv.fleet.store.Close()
}

// trackBuckets records the buckets of cfg in service (State.TrackBuckets).
// In fleet mode a bucket's namespace is the fleet's and moves only by
// FLUSH: a bucket removed from one instance's file (maybe for a rolling
// change) and back later must find the keys the other instances serve, so
// its epoch is not raised here.
func trackBuckets(st *bucketcfg.State, cfg *bucketcfg.Config) (*bucketcfg.State, bool) {
	next, changed := st.TrackBuckets(cfg.BucketNames())
	if changed && cfg.Fleet.RedisURL != "" {
		for name, e := range st.Epochs {
			next.Epochs[name] = e
		}
	}
	return next, changed
}

// localLimits returns what the engine enforces here for a bucket whose
// limits in force are reserved and hard: the same outside fleet mode, this
// instance's shares in it.
func (srv *Server) localLimits(name string, reserved, hard throttle.Limit) (throttle.Limit, throttle.Limit) {
	if srv.fleet == nil {
		return reserved, hard
	}
	return srv.fleet.fl.Grants().Limits(name, reserved, hard)
}

// localCapacity returns the capacity the engine enforces here: the node's
// outside fleet mode; in it, this instance's shares of the reservations
// plus its share of the free pool.
func (srv *Server) localCapacity(eff *bucketcfg.Config) throttle.Limit {
	c := eff.Throttle.Capacity
	if srv.fleet == nil || c == throttle.Unlimited {
		return c
	}
	g := srv.fleet.fl.Grants()
	fp, ok := g.FreePool(freePool(eff)).Finite()
	if !ok {
		return throttle.Unlimited
	}
	sum := fp
	for _, b := range eff.Buckets {
		r, _ := srv.localLimits(b.Name, b.Throttle.Reserved, b.Throttle.HardLimit)
		if n, ok := r.Finite(); ok {
			sum += n
		}
	}
	return throttle.Limit(min(sum, throttle.MaxUnits))
}

// freePool is the free pool of the configuration in force: the capacity
// less the finite reservations, at least 0.
func freePool(eff *bucketcfg.Config) throttle.Limit {
	c, ok := eff.Throttle.Capacity.Finite()
	if !ok {
		return throttle.Unlimited
	}
	for _, b := range eff.Buckets {
		if r, ok := b.Throttle.Reserved.Finite(); ok {
			c -= r
		}
	}
	return throttle.Limit(max(0, c))
}

// fleetUsage reports the buckets in force to the Fleet.
func (srv *Server) fleetUsage(dst []fleet.Usage) (fleet.Node, []fleet.Usage) {
	ten := srv.ten.Load()
	for _, bc := range ten.cfg.Buckets {
		b := ten.bucket(bc.Name)
		if b == nil {
			continue
		}
		st := b.tb.Stats()
		dst = append(dst, fleet.Usage{
			Name: bc.Name, Reserved: bc.Throttle.Reserved, HardLimit: bc.Throttle.HardLimit,
			Units: st.Units, Rejected: st.Rejected, Waiting: st.Waiting, Weight: b.tb.Weight(),
		})
	}
	return fleet.Node{Capacity: ten.cfg.Throttle.Capacity, FreePool: freePool(ten.cfg),
		Fair: ten.cfg.Throttle.FreePool == throttle.FreePoolFair}, dst
}

// applyGrants puts new shares in force on the engine and wakes the held
// sessions, whose wait may now be shorter. An admin change in progress
// (which may wait on the store) is not waited for: it applies the shares
// in force when it commits, and the next period's grants follow anyway.
func (srv *Server) applyGrants(g *fleet.Grants) {
	link := srv.fleet
	if link.storeUp.Swap(g.StoreUp()) != g.StoreUp() {
		if g.StoreUp() {
			srv.log.Info().Int("instances", g.Instances()).Msg("fleet store reachable again")
		} else {
			srv.log.Warn().Msg("fleet store unreachable; keeping the last grants")
		}
	}
	if g.StoreUp() {
		link.noteInstances(srv, g.Instances(), time.Now())
	}
	changed := false
	if srv.adminMu.TryLock() {
		changed = srv.enforce(srv.ten.Load().cfg)
		srv.adminMu.Unlock()
	}
	push := link.pushEpochs.Load() && g.StoreUp()
	if link.fallback.Swap(g.Fallback()) != g.Fallback() && g.Fallback() {
		srv.log.Warn().Int("instances", g.Instances()).Str("on_store_loss", srv.file.Fleet.OnStoreLoss).
			Msg("fleet store lost for 3 grant periods; enforcing the loss policy")
	}
	if changed {
		srv.wakeHeld()
	}
	if push {
		srv.pushFleetEpochs()
	}
}

// enforce sets the engine's limits from eff and the shares in force, and
// reports whether any changed. The caller holds adminMu.
func (srv *Server) enforce(eff *bucketcfg.Config) bool {
	changed := false
	ten := srv.ten.Load()
	for _, bc := range eff.Buckets {
		b := ten.bucket(bc.Name)
		if b == nil {
			continue
		}
		res, hard := srv.localLimits(bc.Name, bc.Throttle.Reserved, bc.Throttle.HardLimit)
		if r0, h0 := b.tb.Limits(); r0 == res && h0 == hard {
			continue
		}
		if err := b.tb.SetLimits(res, hard); err != nil {
			srv.log.Error().Err(err).Str("bucket", bc.Name).Msg("could not apply the fleet's grant")
			continue
		}
		changed = true
	}
	if c := srv.localCapacity(eff); c != srv.throttle.Capacity() {
		if err := srv.throttle.SetCapacity(c); err != nil {
			srv.log.Error().Err(err).Msg("could not apply the fleet's capacity grant")
		}
		changed = true
	}
	srv.enforceShares(eff)
	return changed
}

// shareFloor is the least weight enforceShares gives a bucket: a tenth of
// the largest.
const shareFloor = throttle.MaxWeight / 10

// enforceShares makes the engine split this instance's free pool in fair
// mode in proportion to the buckets' shares of it from the store
// (BucketGrant.Pool), so that the fleet's free pool is shared by weight
// fleet-wide: a bucket's weight here is its share scaled so that the
// largest is throttle.MaxWeight (at least shareFloor). In fcfs mode, or
// without shares from the store, the buckets' own weights apply. Called in
// fleet mode only; the caller holds adminMu.
func (srv *Server) enforceShares(eff *bucketcfg.Config) {
	ten := srv.ten.Load()
	g := srv.fleet.fl.Grants()
	fair := eff.Throttle.FreePool == throttle.FreePoolFair
	var most int64
	for _, bc := range eff.Buckets {
		if bg, ok := g.Bucket(bc.Name); ok && fair && !g.Fallback() {
			most = max(most, bg.Pool)
		}
	}
	for _, bc := range eff.Buckets {
		b := ten.bucket(bc.Name)
		if b == nil {
			continue
		}
		w := 0 // the bucket's own weight
		if bg, ok := g.Bucket(bc.Name); ok && most > 0 && bg.Pool >= 0 {
			// At least a tenth of the largest: a bucket idle here until now
			// has a share of next to nothing until the store hears of its
			// demand, one or two periods on; meanwhile it is not starved.
			w = int(min(max(bg.Pool*throttle.MaxWeight/most, shareFloor), throttle.MaxWeight))
		}
		if err := b.tb.SetShareWeight(w); err != nil {
			srv.log.Error().Err(err).Str("bucket", bc.Name).Msg("could not apply the fleet's free pool share")
		}
	}
}

// fleetSynced records a sync in the metrics.
func (srv *Server) fleetSynced(d time.Duration, err error) {
	if srv.metrics != nil {
		srv.metrics.FleetSyncObserver().Observe(d.Seconds())
	}
	switch {
	case errors.Is(err, fleet.ErrNameTaken):
		srv.log.Error().Err(err).
			Msg("another live instance uses this fleet.instance name (or this one restarted within a grant period and its first sync failed); give each instance a name of its own")
	case err != nil:
		srv.logFleetSync.event(&srv.log, zerolog.WarnLevel).Err(err).Msg("fleet sync failed")
	}
}

// fleetSeed returns this instance's state document for an empty store.
func (srv *Server) fleetSeed() []byte {
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	doc, err := json.Marshal(fleetDoc(srv.state))
	if err != nil {
		return []byte(`{"version":1}`) // not reached: a State always marshals
	}
	srv.log.Info().Msg("fleet store empty; seeding it with this instance's state")
	return doc
}

// fleetDoc is st as the fleet shares it: without the buckets this instance
// has retired (which buckets are in service is each instance's own
// configuration).
func fleetDoc(st *bucketcfg.State) *bucketcfg.State {
	d := st.Clone()
	clear(d.Retired)
	return d
}

// parseFleetDoc reads a state document from the store.
func parseFleetDoc(doc []byte) (*bucketcfg.State, error) {
	st := bucketcfg.NewState()
	if err := json.Unmarshal(doc, st); err != nil {
		return nil, fmt.Errorf("fleet state document: %w", err)
	}
	return st, nil
}

// mergeFleetState returns the fleet's document as this instance keeps it
// at Unix time now: the fleet's limits, each bucket's namespace epoch the
// later of the two (a FLUSH on any instance moves the bucket everywhere),
// the fleet's pending flushes and those of this instance the fleet lacks
// (scheduled while the store was unreachable, not overtaken since), every
// flush due by now applied, and this instance's own retired buckets. ahead
// reports local epochs or pending flushes the fleet's document lacks.
func mergeFleetState(fleetSt, local *bucketcfg.State, now int64) (merged *bucketcfg.State, ahead bool) {
	merged = fleetSt.Clone()
	merged.ApplyFlushes(now) // as every instance does: not ahead of the fleet
	for name, e := range local.Epochs {
		if e > merged.Epochs[name] {
			merged.Epochs[name] = e
			ahead = true
		}
	}
	for name, f := range local.Flushes {
		if _, ok := merged.Flushes[name]; !ok && f.Epoch > merged.Epochs[name] {
			merged.Flushes[name] = f
			ahead = true
		}
	}
	merged.ApplyFlushes(now)
	for name, c := range local.Ceilings {
		if m := bucketcfg.MergeCeiling(merged.Ceilings[name], c); m != merged.Ceilings[name] {
			merged.Ceilings[name] = m
			ahead = true
		}
	}
	clear(merged.Retired)
	for name := range local.Retired {
		merged.Retired[name] = true
	}
	return merged, ahead
}

// adoptFleetState makes the fleet's state document the one in force and
// saves it as the local copy. A document that cannot be adopted (it does
// not fit this instance's configuration, or the state file cannot be
// written) is logged and refused: the Fleet hands it over again at the
// next sync, and this instance keeps its limits meanwhile.
//
// Any document other than the one in force is adopted, older ones too: a
// store restored from an older snapshot, or a Sentinel failover to a
// replica behind, is the fleet's truth from then on. (The Fleet drops a
// document read before this instance's own change landed.)
func (srv *Server) adoptFleetState(doc []byte, token string) error {
	srv.adminMu.Lock()
	link := srv.fleet
	if token == link.token {
		srv.adminMu.Unlock()
		return nil
	}
	st, err := parseFleetDoc(doc)
	if err == nil {
		merged, ahead := mergeFleetState(st, srv.state, srv.wall().Unix())
		if err = srv.commit(merged); err == nil {
			link.token = token
			if ahead {
				link.pushEpochs.Store(true)
			}
		}
	}
	push := link.pushEpochs.Load()
	srv.adminMu.Unlock()
	if err != nil {
		srv.logFleetState.event(&srv.log, zerolog.ErrorLevel).Err(err).Str("token", token).
			Msg("fleet state document not adopted; keeping the local state and trying again next period")
		return err
	}
	srv.log.Info().Str("token", token).Msg("fleet state adopted")
	if push {
		srv.pushFleetEpochs()
	}
	return nil
}

// pushFleetEpochs writes the local namespace epochs that are ahead of the
// store's (a FLUSH made while the store was down) to the store.
func (srv *Server) pushFleetEpochs() {
	ctx, cancel := context.WithTimeout(context.Background(), srv.fleet.fl.Period()/2)
	defer cancel()
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	err := srv.fleetChange(ctx, func(*bucketcfg.State) error { return nil })
	if err != nil {
		srv.log.Warn().Err(err).Msg("could not write the namespace epochs to the fleet store; will retry")
		return
	}
	srv.fleet.pushEpochs.Store(false)
}

// fleetChange applies change to the fleet's state document in the store
// (compare-and-set), then makes the result the state in force here. The
// caller holds adminMu. Errors: change's own, an invalid result (Einval),
// the store being unreachable (Etmpfail: nothing changed anywhere, and
// nothing will: fleet.Store.Update resolves a lost reply before it
// answers), or the store lost after the change was sent and not reachable
// to tell whether it was made (Einternal).
func (srv *Server) fleetChange(ctx context.Context, change func(*bucketcfg.State) error) error {
	link := srv.fleet
	var next *bucketcfg.State
	tok, err := link.fl.Update(ctx, func(doc []byte) ([]byte, error) {
		base := srv.state
		if doc != nil {
			st, err := parseFleetDoc(doc)
			if err != nil {
				srv.log.Error().Err(err).Msg("fleet state document unreadable; replacing it with this instance's")
			} else {
				base = st
			}
		}
		st, _ := mergeFleetState(base, srv.state, srv.wall().Unix())
		if err := change(st); err != nil {
			return nil, err
		}
		if _, err := bucketcfg.Effective(srv.file, st); err != nil {
			return nil, &adminError{binary.StatusEinval, err.Error()}
		}
		next = st
		return json.Marshal(fleetDoc(st))
	})
	if err != nil {
		var ae *adminError
		if errors.As(err, &ae) {
			return err
		}
		if errors.Is(err, fleet.ErrOutcomeUnknown) {
			// The write was sent and may have been made: neither success
			// nor Etmpfail ("not applied") would be the truth.
			srv.log.Error().Err(err).Msg("fleet store lost after a change was sent; whether it is in force is unknown")
			return &adminError{binary.StatusEinternal, "fleet store lost after the change was sent; it may be in force: read it back"}
		}
		srv.log.Warn().Err(err).Msg("fleet store unavailable; change not applied")
		return &adminError{binary.StatusEtmpfail, "fleet store unavailable; change not applied"}
	}
	if err := srv.commit(next); err != nil {
		return err
	}
	link.token = tok
	return nil
}

// FleetStatus is fleet mode as seen by this instance, for STAT and ctl.
type FleetStatus struct {
	Instance  string
	StoreUp   bool
	Fallback  bool
	Instances int
}

// Fleet returns this instance's fleet status; ok is false outside fleet
// mode. Safe from any goroutine.
func (srv *Server) Fleet() (st FleetStatus, ok bool) {
	if srv.fleet == nil {
		return FleetStatus{}, false
	}
	g := srv.fleet.fl.Grants()
	return FleetStatus{Instance: srv.fleet.fl.Instance(), StoreUp: g.StoreUp(), Fallback: g.Fallback(), Instances: g.Instances()}, true
}
