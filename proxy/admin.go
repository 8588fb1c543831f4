package proxy

import (
	"context"
	"crypto/tls"
	be "encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
	"github.com/kvthrottle/kvthrottle/upstream"
)

// adminError is an admin change refused with a status and a reason.
type adminError struct {
	status binary.Status
	reason string
}

func (e *adminError) Error() string { return e.reason }

// admin handles SetBucketThrottleProperties (0x2a) and
// SetNodeThrottleProperties (0x2c). The body is checked on the loop; the
// change is persisted and applied off the loop, and the session answers
// (and dispatches its next command) once the state file is written.
func (s *session) admin(r *request) {
	if !s.isAdmin() {
		s.localStatus(r, binary.StatusEaccess, r.op.String()+" needs the admin privilege")
		return
	}
	srv := s.lp.srv
	who := s.user.Name
	var apply func() error
	switch r.op {
	case binary.OpSetBucketThrottleProperties:
		name := string(r.key)
		bp, err := bucketcfg.ParseBucketProperties(r.value)
		if err != nil {
			s.localStatus(r, binary.StatusEinval, err.Error())
			return
		}
		if srv.ten.Load().bucket(name) == nil {
			s.localStatus(r, binary.StatusKeyEnoent, "no such bucket")
			return
		}
		apply = func() error { return srv.SetBucketThrottle(name, bp, who) }
	default:
		if len(r.key) != 0 {
			s.localStatus(r, binary.StatusEinval, "SetNodeThrottleProperties takes no key")
			return
		}
		nt, err := bucketcfg.ParseNodeThrottle(r.value)
		if err != nil {
			s.localStatus(r, binary.StatusEinval, err.Error())
			return
		}
		apply = func() error { return srv.SetNodeThrottle(nt, who) }
	}
	c := s.offLoop(r)
	c.run(func() func([]byte) []byte {
		err := apply()
		return func(b []byte) []byte {
			var ae *adminError
			switch {
			case err == nil:
				return s.codec.appendError(b, c.sl.req, binary.StatusSuccess, "")
			case errors.As(err, &ae):
				return s.codec.appendError(b, c.sl.req, ae.status, ae.reason)
			default:
				return s.codec.appendError(b, c.sl.req, binary.StatusEinternal, err.Error())
			}
		}
	})
}

// SetBucketThrottle changes a bucket's limits, and its weight when
// bp.Weight is not 0 (else the bucket keeps its weight): it writes the
// state file atomically, then applies the change on every event loop at
// once. who names the caller in the log. Errors: an *adminError-like
// refusal for an unknown bucket or invalid limits or weight, or the state
// file write's error (the change is then not applied). Safe from any
// goroutine; may block on I/O.
func (srv *Server) SetBucketThrottle(name string, bp bucketcfg.BucketProperties, who string) error {
	bt := bp.Throttle
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	before := srv.ten.Load().cfg.Bucket(name)
	if before == nil || srv.ten.Load().bucket(name) == nil {
		return &adminError{binary.StatusKeyEnoent, "no such bucket"}
	}
	err := srv.change(func(next *bucketcfg.State) error {
		if err := next.SetBucket(name, bt); err != nil {
			return &adminError{binary.StatusEinval, err.Error()}
		}
		if bp.Weight != 0 {
			if err := next.SetWeight(name, bp.Weight); err != nil {
				return &adminError{binary.StatusEinval, err.Error()}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	after := srv.ten.Load().cfg.Bucket(name)
	ev := srv.log.Info().Str("user", who).Str("bucket", name).Str("before", before.Throttle.String()).
		Str("after", bt.String())
	if after != nil && after.Weight != before.Weight {
		ev = ev.Int("weight_before", before.Weight).Int("weight_after", after.Weight)
	}
	ev.Msg("bucket throttle properties changed")
	srv.warnOvercommit(srv.ten.Load().cfg)
	return nil
}

// SetNodeThrottle changes the node capacity and/or the defaults for buckets
// created later, persisted like SetBucketThrottle.
func (srv *Server) SetNodeThrottle(nt bucketcfg.NodeThrottle, who string) error {
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	cur := srv.ten.Load().cfg
	err := srv.change(func(next *bucketcfg.State) error {
		if err := next.SetNode(nt, cur); err != nil {
			return &adminError{binary.StatusEinval, err.Error()}
		}
		return nil
	})
	if err != nil {
		return err
	}
	after := srv.ten.Load().cfg
	srv.log.Info().Str("user", who).
		Str("capacity_before", cur.Throttle.Capacity.String()).Str("capacity_after", after.Throttle.Capacity.String()).
		Str("defaults_before", cur.Throttle.Defaults.String()).Str("defaults_after", after.Throttle.Defaults.String()).
		Msg("node throttle properties changed")
	srv.warnOvercommit(after)
	return nil
}

// change applies change to a copy of the runtime state and makes the result
// the state in force: persisted, then applied. In fleet mode the change is
// made to the fleet's state document in the store first (fleetChange), and
// reaches the other instances at their next sync. The caller holds adminMu.
func (srv *Server) change(change func(next *bucketcfg.State) error) error {
	if srv.fleet != nil {
		ctx, cancel := context.WithTimeout(context.Background(), fleetTimeout)
		defer cancel()
		return srv.fleetChange(ctx, change)
	}
	next := srv.state.Clone()
	if err := change(next); err != nil {
		return err
	}
	return srv.commit(next)
}

// commit persists next and applies it. The caller holds adminMu.
func (srv *Server) commit(next *bucketcfg.State) error {
	eff, err := bucketcfg.Effective(srv.file, next)
	if err != nil {
		return &adminError{binary.StatusEinval, err.Error()}
	}
	if err := next.Save(srv.opts.statePath); err != nil {
		srv.log.Error().Err(err).Str("state_file", srv.opts.statePath).Msg("could not persist throttle state; change not applied")
		return &adminError{binary.StatusEinternal, "could not persist the change"}
	}
	srv.state = next
	return srv.apply(eff)
}

// apply makes eff the configuration in force on every loop. The caller
// holds adminMu.
func (srv *Server) apply(eff *bucketcfg.Config) error {
	if err := srv.throttle.SetCapacity(srv.localCapacity(eff)); err != nil {
		return fmt.Errorf("capacity: %w", err)
	}
	if err := srv.throttle.SetFreePoolMode(eff.Throttle.FreePool); err != nil {
		return fmt.Errorf("free_pool: %w", err)
	}
	ten, err := buildTenants(srv.throttle, eff, srv.ten.Load(), srv.metrics, srv.state.Epochs, srv.localLimits)
	srv.ten.Store(ten)
	srv.eachLoop(func(lp *loop) {
		_ = lp.el.Execute(context.Background(), gnet.RunnableFunc(lp.recheckSessions))
	})
	srv.wakeHeld()
	return err
}

// warnOvercommit logs when the reservations exceed the node capacity.
func (srv *Server) warnOvercommit(eff *bucketcfg.Config) {
	capacity, ok := eff.Throttle.Capacity.Finite()
	if !ok {
		return
	}
	var sum int64
	for _, b := range eff.Buckets {
		if n, ok := b.Throttle.Reserved.Finite(); ok {
			sum += n
		}
	}
	if sum > capacity {
		srv.log.Warn().Int64("reserved_sum", sum).Int64("capacity", capacity).
			Msg("reservations exceed the node capacity: the free pool is empty and the node may run above capacity")
	}
}

// upstreamTLS loads [upstream.tls]: nil when TLS to memcached is off.
// Errors name the key of the file at fault.
func upstreamTLS(t *bucketcfg.UpstreamTLSConfig) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	return upstream.LoadTLSConfig(upstream.TLSFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile, ServerName: t.ServerName})
}

// prepareUpstreamTLS reads the files of a reloaded [upstream.tls]: its
// files and server_name apply to the connections and probes opened after
// the reload; open connections keep theirs. enabled takes effect only at
// a restart: a reload that changes it is refused.
func prepareUpstreamTLS(cur, next *bucketcfg.UpstreamTLSConfig) (*tls.Config, error) {
	if next.Enabled != cur.Enabled {
		return nil, errors.New("upstream.tls.enabled changed; it takes effect only at a restart")
	}
	return upstreamTLS(next)
}

// Reload makes cfg (a freshly loaded configuration file) the one in force:
// the runtime state still overrides its throttle values, new buckets get
// the current defaults, removed buckets close their sessions once their
// pending responses are written. Safe from any goroutine.
func (srv *Server) Reload(cfg *bucketcfg.Config) error {
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	// Everything that can refuse the file is checked before anything is
	// persisted or applied: a refused reload leaves no trace.
	next, changed := trackBuckets(srv.state, cfg)
	eff, err := bucketcfg.Effective(cfg, next)
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	if err := poolConfig(cfg).Validate(); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	if !sameListeners(srv.file.Listeners, cfg.Listeners) {
		return errors.New("reload: [[listener]] tables changed; they take effect only at a restart")
	}
	tlsNext, err := srv.tls.prepareReload(cfg) // certificates re-read (tls.go)
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	upTLSNext, err := prepareUpstreamTLS(&srv.file.Upstream.TLS, &cfg.Upstream.TLS)
	if err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	// A removed bucket that comes back later must not find its old keys
	// (maybe another tenant's by then): its namespace epoch moves on,
	// persisted before the removal takes effect.
	if changed {
		if err := next.Save(srv.opts.statePath); err != nil {
			return fmt.Errorf("reload: persist namespace epochs: %w", err)
		}
		srv.state = next
	}
	if err := srv.pool.Update(poolConfig(cfg)); err != nil {
		return fmt.Errorf("reload: %w", err) // not reached: validated above
	}
	if upTLSNext != nil {
		_ = srv.pool.SetTLSConfig(upTLSNext) // cannot fail: TLS was on and stays on
	}
	prevFile := srv.file
	srv.file = cfg
	if err := srv.apply(eff); err != nil {
		return fmt.Errorf("reload: %w", err)
	}
	srv.tls.installReload(tlsNext)
	if srv.fleet != nil {
		// The file's changed limits become the fleet's, as admin
		// changes do (and override the state like them).
		if change := fileLimitChanges(prevFile, cfg); change != nil {
			ctx, cancel := context.WithTimeout(context.Background(), fleetTimeout)
			err := srv.fleetChange(ctx, change)
			cancel()
			if err != nil {
				srv.log.Warn().Err(err).Msg("reload: the file's changed limits did not reach the fleet store; reload again once it is back")
			} else {
				eff = srv.ten.Load().cfg
			}
		}
	}
	srv.log.Info().Str("config", cfg.Path()).Int("buckets", len(eff.Buckets)).Int("users", len(eff.Users)).Msg("configuration reloaded")
	srv.warnOvercommit(eff)
	return nil
}

// recheckSessions applies a new configuration to open sessions; on the
// loop. A session whose user was deleted, or whose bucket was removed, is
// closed once its pending responses are written; a user's privileges and
// bucket access are taken from the new configuration, and a session that
// may no longer use its bucket loses it.
func (lp *loop) recheckSessions(context.Context) error {
	ten := lp.srv.ten.Load()
	for s := range lp.sessions {
		if s.user != nil {
			u := ten.cfg.User(s.user.Name)
			if u == nil {
				lp.srv.log.Info().Str("user", s.user.Name).Str("remote", s.remote).Msg("user removed by reload; closing its connection")
				s.unhold()
				s.quit()
				continue
			}
			s.user = u
		}
		if s.bkt == nil {
			continue
		}
		if s.bkt.gone.Load() {
			s.unhold()
			s.quit()
			continue
		}
		allowed := s.bkt.name == s.homeBucket(ten)
		if s.user != nil {
			allowed = s.user.CanAccess(s.bkt.name)
		}
		if !allowed {
			s.setBucket(nil)
		}
	}
	lp.flushClients()
	return nil
}

// flushBucket handles FLUSH/FLUSHQ: only for buckets with flush_enabled,
// and only that bucket's keys: the bucket moves to a fresh namespace, whose
// epoch is persisted (off the loop) before the response, so flushed keys
// stay gone across restarts. A FLUSH is metered as a write of one unit and
// admitted like any metered command: held, or answered EWouldThrottle, when
// its bucket has no room. A delay (non-zero 4-byte extras) is refused with
// NotSupported. It returns false when the session is held and r must be
// dispatched again. From its admission until the new epoch is in effect
// the bucket's key commands wait (bucket.flushing).
func (s *session) flushBucket(r *request) bool {
	if err := binary.ValidateRequest(&r.frame); err != nil {
		s.localStatus(r, binary.StatusEinval, err.Error())
		return true
	}
	b := s.bkt
	if b == nil {
		s.noBucket(r)
		return true
	}
	if !b.flushEnabled.Load() {
		s.localStatus(r, binary.StatusEaccess, "FLUSH is disabled for bucket "+b.name)
		return true
	}
	if len(r.extras) == 4 && be.BigEndian.Uint32(r.extras) != 0 {
		// memcached empties the cache when the delay has passed; here that
		// would be a timer per bucket that has to survive restarts (a
		// delay that ends while the proxy is down must still flush), for a
		// feature clients rarely use: refuse it, the client can send the
		// FLUSH when the time comes.
		s.localStatus(r, binary.StatusNotSupported, "FLUSH with a delay is not supported; send it when the bucket should be emptied")
		return true
	}
	srv := s.lp.srv
	if g, wait := b.tb.AdmitCost(&s.waiter, s.mode(), throttle.Cost{Known: 1}); g.Domain == throttle.Held {
		return s.throttled(r, b, g, wait)
	}
	if s.heldAt != 0 {
		srv.throttleWait(b, srv.throttle.Now()-s.heldAt)
		s.heldAt = 0
	}
	b.writeUnits.Add(1) // the one unit, billed in full at admission
	quiet := r.op == binary.OpFlushQ
	b.flushing.Add(1)
	c := s.offLoop(r)
	if !c.handOff(func() bool {
		srv.queueFlush(b, func(err error) {
			b.flushing.Add(-1)
			srv.wakeHeld()
			c.reply(func(out []byte) []byte {
				switch {
				case err != nil:
					return s.codec.appendError(out, c.sl.req, binary.StatusEinternal, "could not persist the flush")
				case quiet:
					return out
				default:
					return s.codec.appendError(out, c.sl.req, binary.StatusSuccess, "")
				}
			})
		})
		return true
	}) {
		b.flushing.Add(-1)
		c.answer(func(out []byte) []byte {
			return s.codec.appendError(out, c.sl.req, binary.StatusEtmpfail, "the proxy is shutting down")
		})
	}
	return true
}

// flushQueue batches the state file writes of FLUSHes (group commit): the
// FLUSHes queued while one write runs share the next, so a burst of them,
// from any number of connections and buckets, costs one fsync per write
// time instead of one each. The zero value is ready.
type flushQueue struct {
	mu      sync.Mutex
	pending []flushReq
	running bool // a goroutine (counted in Server.jobs) is writing batches
}

// flushReq is one admitted FLUSH of bucket b; done receives the outcome of
// the state file write, off the loop.
type flushReq struct {
	b    *bucket
	done func(error)
}

// queueFlush moves b to a fresh namespace with the next batched state file
// write and then calls done (from another goroutine) with its error. Safe
// from any goroutine.
func (srv *Server) queueFlush(b *bucket, done func(error)) {
	q := &srv.flushes
	q.mu.Lock()
	q.pending = append(q.pending, flushReq{b: b, done: done})
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		if !srv.jobs.add() {
			// Shutting down, past waiting for jobs: the batch is dropped
			// with the connections.
			return
		}
		go srv.runFlushes()
	}
}

// runFlushes writes batches until none is pending.
func (srv *Server) runFlushes() {
	defer srv.jobs.done()
	q := &srv.flushes
	for {
		q.mu.Lock()
		batch := q.pending
		q.pending = nil
		if len(batch) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		err := srv.flushBuckets(batch)
		for _, r := range batch {
			r.done(err)
		}
	}
}

// flushBuckets moves every bucket of batch to a new namespace epoch (one
// per bucket, however many of its FLUSHes the batch holds: they all arrived
// before the move) with one state file write. The new epochs take effect
// only once persisted: were the epoch raised first, writes acknowledged in
// the new namespace before a crash would be there again after the next
// FLUSH following the restart.
func (srv *Server) flushBuckets(batch []flushReq) error {
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	var bs []*bucket
	for _, r := range batch {
		if !slices.Contains(bs, r.b) {
			bs = append(bs, r.b)
		}
	}
	if link := srv.fleet; link != nil && link.storeUp.Load() {
		// In fleet mode the new epoch is chosen in the store, against the
		// fleet's (compare-and-set): a FLUSH on another instance at the
		// same time gets a later one, so neither is lost. The other
		// instances move at their next sync.
		ctx, cancel := context.WithTimeout(context.Background(), min(fleetTimeout, link.fl.Period()))
		defer cancel()
		err := srv.fleetChange(ctx, func(st *bucketcfg.State) error {
			for _, b := range bs {
				if cur := b.gen.Load(); st.Epochs[b.name] < cur {
					st.Epochs[b.name] = cur
				}
				st.BumpEpoch(b.name)
			}
			return nil
		})
		if err == nil {
			for _, b := range bs {
				srv.log.Info().Str("bucket", b.name).Uint64("epoch", b.gen.Load()).Msg("bucket flushed")
			}
			return nil
		}
		srv.log.Warn().Err(err).Msg("FLUSH: the fleet store did not answer; flushing here, the store learns it later")
	}
	next := srv.state.Clone()
	epochs := make(map[*bucket]uint64, len(bs))
	for _, b := range bs {
		if cur := b.gen.Load(); next.Epochs[b.name] < cur {
			next.Epochs[b.name] = cur
		}
		epochs[b] = next.BumpEpoch(b.name)
		if srv.fleet != nil {
			// Without the store, instances FLUSHing one bucket must not
			// pick the same epoch (the later FLUSH would be lost when
			// the epochs merge, the greatest winning): the epoch is the
			// time in ms since 2026, later FLUSHes getting greater ones
			// (as far as the instances' clocks agree).
			e := max(epochs[b], uint64(max(0, time.Since(flushEpochBase).Milliseconds())))
			next.Epochs[b.name] = e
			epochs[b] = e
		}
	}
	if testHookFlushSave != nil {
		testHookFlushSave()
	}
	if err := next.Save(srv.opts.statePath); err != nil {
		srv.log.Error().Err(err).Int("flushes", len(batch)).Msg("could not persist a flush; buckets not flushed")
		return err
	}
	srv.state = next
	for b, e := range epochs {
		b.setEpoch(e)
		srv.log.Info().Str("bucket", b.name).Uint64("epoch", e).Msg("bucket flushed")
	}
	if srv.fleet != nil {
		// A store that cannot be reached does not fail the FLUSH: the
		// epochs go to the store once it is back (the later epoch wins).
		srv.fleet.pushEpochs.Store(true)
	}
	return nil
}

// testHookFlushSave, when set (by tests, before the Server starts), runs
// before a FLUSH's epoch is written to the state file.
var testHookFlushSave func()

// flushEpochBase is the origin of the namespace epochs chosen by a FLUSH
// while the fleet store is unreachable.
var flushEpochBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fileLimitChanges returns a change that writes the throttle values that
// differ between two configuration files (capacity, defaults, limits and
// weights a bucket sets itself) into a state as overrides; nil when none
// differ.
func fileLimitChanges(prev, next *bucketcfg.Config) func(*bucketcfg.State) error {
	var set []func(*bucketcfg.State)
	if c := next.Throttle.Capacity; c != prev.Throttle.Capacity {
		set = append(set, func(st *bucketcfg.State) { st.Capacity = &c })
	}
	if d := next.Throttle.Defaults; d != prev.Throttle.Defaults {
		set = append(set, func(st *bucketcfg.State) { st.Defaults = &d })
	}
	for _, b := range next.Buckets {
		old := prev.Bucket(b.Name)
		if old == nil {
			continue
		}
		if b.WeightSet && old.Weight != b.Weight {
			name, w := b.Name, b.Weight
			set = append(set, func(st *bucketcfg.State) { st.Weights[name] = w })
		}
		if !(b.ReservedSet || b.HardLimitSet) || old.Throttle == b.Throttle {
			continue
		}
		name, bt := b.Name, b.Throttle
		set = append(set, func(st *bucketcfg.State) { st.Buckets[name] = bt })
	}
	if len(set) == 0 {
		return nil
	}
	return func(st *bucketcfg.State) error {
		for _, f := range set {
			f(st)
		}
		return nil
	}
}
