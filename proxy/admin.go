package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
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
	ten, err := buildTenants(srv.throttle, eff, srv.ten.Load(), srv.metrics, srv.state.Epochs, srv.startClass.Load(), srv.localLimits)
	srv.ten.Store(ten)
	srv.syncFlushes()
	srv.restoreCeilings(srv.state)
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
