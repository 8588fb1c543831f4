package proxy

import (
	"context"
	be "encoding/binary"
	"sync"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// maxRelativeDelay is memcached's REALTIME_MAXDELTA: a flush delay (or an
// expiration) up to 30 days is relative, a greater one a Unix time.
const maxRelativeDelay = 30 * 24 * 3600

// flushDeadline returns the Unix time (seconds) at which a FLUSH with
// delay d, received at now, empties its bucket, or 0 for at once: a zero
// delay, and an absolute time not in the future. (memcached flushes, for
// an absolute time in the past, only the items stored before it; here the
// whole bucket goes, as after a FLUSH at that time and nothing since.)
func flushDeadline(d uint32, now time.Time) int64 {
	if d == 0 {
		return 0
	}
	n := now.Unix()
	if d <= maxRelativeDelay {
		return n + int64(d)
	}
	if at := int64(d); at > n {
		return at
	}
	return 0
}

// syncFlushes moves every bucket in force to the namespace epoch of the
// state in force, if that is later (flushed on another instance), and
// gives it the state's pending flush (none when the state has none, or
// when the bucket reached its epoch already). The caller holds adminMu
// (or the Server is not serving yet).
func (srv *Server) syncFlushes() {
	for name, b := range srv.ten.Load().buckets {
		var pending *bucketcfg.PendingFlush
		if f, ok := srv.state.Flushes[name]; ok {
			pending = &f
		}
		if b.syncFlushes(srv.state.Epochs[name], pending) {
			srv.log.Info().Str("bucket", name).Uint64("epoch", b.gen.Load()).Msg("bucket flushed on another instance")
		}
	}
}

// applyDueFlush puts b's delayed flush in effect when its time has come;
// called before each of b's key commands that finds one pending.
func (srv *Server) applyDueFlush(b *bucket) {
	if b.applyDueFlush(srv.wall) {
		srv.log.Info().Str("bucket", b.name).Uint64("epoch", b.gen.Load()).Msg("bucket flushed (delayed flush due)")
	}
}

// applyDueState applies the pending flushes of st due at now to a copy of
// st; it returns st itself when none is due or void.
func applyDueState(st *bucketcfg.State, now time.Time) (*bucketcfg.State, bool) {
	next := st.Clone()
	if !next.ApplyFlushes(now.Unix()) {
		return st, false
	}
	return next, true
}

// flushBucket handles FLUSH/FLUSHQ: only for buckets with flush_enabled,
// and only that bucket's keys: the bucket moves to a fresh namespace, whose
// epoch is persisted (off the loop) before the response, so flushed keys
// stay gone across restarts. A FLUSH with a delay (4-byte extras, in
// memcached's units: seconds, or a Unix time when over 30 days) schedules
// that move for its deadline instead (flushDeadline, PendingFlush),
// persisted before the response too; a later FLUSH of the bucket, delayed
// or not, replaces it. A FLUSH is metered as a write of one unit and
// admitted like any metered command: held, or answered EWouldThrottle, when
// its bucket has no room. It returns false when the session is held and r
// must be dispatched again. From the admission of an immediate FLUSH until
// its new epoch is in effect the bucket's key commands wait
// (bucket.flushing).
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
	srv := s.lp.srv
	if g, wait := b.tb.AdmitCost(&s.waiter, s.mode(), throttle.Cost{Known: 1}); g.Domain == throttle.Held {
		return s.throttled(r, b, wait)
	}
	if s.heldAt != 0 {
		srv.throttleWait(b, srv.throttle.Now()-s.heldAt)
		s.heldAt = 0
	}
	b.writeUnits.Add(1) // the one unit, billed in full at admission
	var at int64
	if len(r.extras) == 4 {
		at = flushDeadline(be.BigEndian.Uint32(r.extras), srv.wall())
	}
	quiet := r.op == binary.OpFlushQ
	if at == 0 {
		b.flushing.Add(1)
	}
	done := func() {
		if at == 0 {
			b.flushing.Add(-1)
		}
	}
	c := s.offLoop(r)
	if !c.handOff(func() bool {
		srv.queueFlush(flushReq{b: b, at: at, done: func(err error) {
			done()
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
		}})
		return true
	}) {
		done()
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

// flushReq is one admitted FLUSH of bucket b, at Unix time at (0: at
// once); done receives the outcome of the state file write, off the loop.
type flushReq struct {
	b    *bucket
	at   int64
	done func(error)
}

// queueFlush moves r.b to a fresh namespace (or schedules that move for
// r.at) with the next batched state file write and then calls r.done (from
// another goroutine) with its error. Safe from any goroutine.
func (srv *Server) queueFlush(r flushReq) {
	q := &srv.flushes
	q.mu.Lock()
	q.pending = append(q.pending, r)
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

// flushBuckets applies batch, in order, with one state file write: an
// immediate FLUSH moves its bucket to a new namespace epoch (one per
// bucket, however many of its immediate FLUSHes the batch holds: they all
// arrived before the move) and cancels its pending flush; a delayed one
// replaces the bucket's pending flush. The new epochs and pending flushes
// take effect only once persisted: were the epoch raised first, writes
// acknowledged in the new namespace before a crash would be there again
// after the next FLUSH following the restart.
func (srv *Server) flushBuckets(batch []flushReq) error {
	srv.adminMu.Lock()
	defer srv.adminMu.Unlock()
	now := srv.wall().Unix()
	if link := srv.fleet; link != nil && link.storeUp.Load() {
		// In fleet mode the new epoch and the pending flushes are set in
		// the store, against the fleet's (compare-and-set): a FLUSH on
		// another instance at the same time gets a later one, so neither
		// is lost. The other instances move at their next sync.
		ctx, cancel := context.WithTimeout(context.Background(), min(fleetTimeout, link.fl.Period()))
		defer cancel()
		err := srv.fleetChange(ctx, func(st *bucketcfg.State) error {
			applyFlushBatch(st, batch, now, nil)
			return nil
		})
		if err == nil {
			srv.logFlushes(batch)
			return nil
		}
		srv.log.Warn().Err(err).Msg("FLUSH: the fleet store did not answer; flushing here, the store learns it later")
	}
	next := srv.state.Clone()
	var pick func(uint64) uint64
	if srv.fleet != nil {
		// Without the store, instances FLUSHing one bucket must not pick
		// the same epoch (the later FLUSH would be lost when the epochs
		// merge, the greatest winning): the epoch is the time in ms since
		// 2026, later FLUSHes getting greater ones (as far as the
		// instances' clocks agree).
		pick = func(e uint64) uint64 {
			return max(e, uint64(max(0, time.Since(flushEpochBase).Milliseconds())))
		}
	}
	epochs := applyFlushBatch(next, batch, now, pick)
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
	}
	srv.syncFlushes()
	srv.logFlushes(batch)
	if srv.fleet != nil {
		// A store that cannot be reached does not fail the FLUSH: the
		// epochs and pending flushes go to the store once it is back (the
		// later epoch wins).
		srv.fleet.pushEpochs.Store(true)
	}
	return nil
}

// applyFlushBatch applies batch to st in order (see flushBuckets) and
// returns the buckets moved at once with their new epochs. A bucket's
// epoch starts from the greater of st's and the one in force here (a
// delayed flush applied by a key command is not in st yet); pick, when
// not nil, chooses each new epoch from the next one in sequence.
func applyFlushBatch(st *bucketcfg.State, batch []flushReq, now int64, pick func(uint64) uint64) map[*bucket]uint64 {
	for _, r := range batch {
		if cur := r.b.gen.Load(); st.Epochs[r.b.name] < cur {
			st.Epochs[r.b.name] = cur
		}
	}
	st.ApplyFlushes(now)
	moved := make(map[*bucket]uint64, len(batch))
	for _, r := range batch {
		name := r.b.name
		switch _, done := moved[r.b]; {
		case r.at != 0:
			st.ScheduleFlush(name, r.at)
		case done:
			delete(st.Flushes, name)
		default:
			e := st.FlushNow(name)
			if pick != nil {
				e = pick(e)
				st.Epochs[name] = e
			}
			moved[r.b] = e
		}
	}
	return moved
}

// logFlushes logs the outcome of a batch of FLUSHes once per bucket.
func (srv *Server) logFlushes(batch []flushReq) {
	seen := make(map[*bucket]bool, len(batch))
	for _, r := range batch {
		if seen[r.b] {
			continue
		}
		seen[r.b] = true
		ev := srv.log.Info().Str("bucket", r.b.name).Uint64("epoch", r.b.gen.Load())
		if f := r.b.pending.Load(); f != nil {
			ev.Int64("flush_at", f.At).Uint64("flush_epoch", f.Epoch).Msg("bucket flush scheduled")
			continue
		}
		ev.Msg("bucket flushed")
	}
}

// testHookFlushSave, when set (by tests, before the Server starts), runs
// before a FLUSH's epoch is written to the state file.
var testHookFlushSave func()

// flushEpochBase is the origin of the namespace epochs chosen by a FLUSH
// while the fleet store is unreachable.
var flushEpochBase = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
