package proxy

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/metrics"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// bucket is one tenant as the event loops see it. Its identity fields are
// immutable; counters are atomics shared by every loop.
type bucket struct {
	name string
	tb   *throttle.Bucket

	flushEnabled atomic.Bool // FLUSH allowed (reloadable)

	prefix atomic.Pointer[[]byte] // key namespace upstream; changes on FLUSH
	gen    atomic.Uint64          // flush generation
	gone   atomic.Bool            // removed by a reload
	// savedCeil is the ceiling (read units) of the current epoch known to
	// be in the state file, or that needs no saving (ceilingsave.go)
	savedCeil atomic.Int64

	// pending is the bucket's delayed flush not yet in effect (nil: none),
	// applied by the first key command at or after its deadline
	// (applyDueFlush). epochMu orders its application with the admin
	// path's changes of the epoch and of pending.
	pending atomic.Pointer[bucketcfg.PendingFlush]
	epochMu sync.Mutex

	// flushing counts the FLUSHes admitted and not yet in effect (their
	// new epoch is being persisted). While it is non-zero the bucket's
	// key commands wait (session.waitFlush), so a command read after a
	// FLUSH, on any connection, runs in the new namespace, as memcached
	// orders a flush_all before what it reads next.
	flushing atomic.Int32

	wait prometheus.Observer // kvthrottle_throttle_wait_seconds child; set before publication

	conns      atomic.Int64
	readUnits  atomic.Uint64
	writeUnits atomic.Uint64
	cmds       [nCmdStats]atomic.Uint64 // cmdstats.go
}

// keyPrefix returns the bucket's upstream key namespace for generation
// gen: "name:" at first, "name#gen:" after a FLUSH. Bucket names never
// contain ':' or '#', so no two buckets (or generations) share a prefix.
func keyPrefix(name string, gen uint64) []byte {
	if gen == 0 {
		return []byte(name + ":")
	}
	return []byte(name + "#" + strconv.FormatUint(gen, 10) + ":")
}

func newBucket(name string, flushEnabled bool, tb *throttle.Bucket, epoch uint64) *bucket {
	b := &bucket{name: name}
	b.flushEnabled.Store(flushEnabled)
	b.setEpoch(epoch) // before tb: the ceiling is the caller's to set
	b.tb = tb
	b.savedCeil.Store(tb.ReadCost().Bound())
	return b
}

// setEpoch moves the bucket to namespace generation e; after a FLUSH the
// old keys are unreachable and age out of memcached.
func (b *bucket) setEpoch(e uint64) {
	b.epochMu.Lock()
	defer b.epochMu.Unlock()
	b.storeEpoch(e)
}

// storeEpoch is setEpoch with epochMu held. A new epoch holds no value:
// the bucket's ceiling starts again at class 1.
func (b *bucket) storeEpoch(e uint64) {
	old := b.gen.Swap(e)
	if e > old && b.tb != nil {
		// Before the new namespace is published: a write that finds
		// it is checked against the new epoch's ceiling, never the old.
		b.tb.ReadCost().Reset(e)
		b.savedCeil.Store(1) // class 1 needs no saving: no saved class is read as empty servers' or M
	}
	p := keyPrefix(b.name, e)
	b.prefix.Store(&p)
}

// syncFlushes makes the bucket's namespace epoch at least e and f (nil:
// none) its delayed flush, a flush whose epoch the bucket has reached
// being void and dropped; it reports whether the epoch moved. Both change
// in one step under epochMu, the epoch first: whoever sees the pending
// flush gone sees the epoch it led to.
func (b *bucket) syncFlushes(e uint64, f *bucketcfg.PendingFlush) (moved bool) {
	b.epochMu.Lock()
	defer b.epochMu.Unlock()
	if e > b.gen.Load() {
		b.storeEpoch(e)
		moved = true
	}
	if f != nil && f.Epoch <= b.gen.Load() {
		f = nil
	}
	b.pending.Store(f)
	return moved
}

// applyDueFlush puts the bucket's delayed flush in effect when its
// deadline (Unix seconds) has come by now, which wall reads only when
// there is one; it reports whether the epoch moved. The state file needs
// no write: the pending flush it holds says the same (State.ApplyFlushes).
// Safe from any goroutine; without a pending flush it is one atomic load.
func (b *bucket) applyDueFlush(wall func() time.Time) bool {
	f := b.pending.Load()
	if f == nil || wall().Unix() < f.At {
		return false
	}
	b.epochMu.Lock()
	defer b.epochMu.Unlock()
	if b.pending.Load() != f {
		return false // replaced or applied meanwhile
	}
	b.pending.Store(nil)
	if f.Epoch <= b.gen.Load() {
		return false
	}
	b.storeEpoch(f.Epoch)
	return true
}

// tenants is the bucket table and user database every loop reads. It is
// immutable: changes publish a new one.
type tenants struct {
	cfg     *bucketcfg.Config // effective configuration
	buckets map[string]*bucket
}

func (t *tenants) bucket(name string) *bucket {
	if b := t.buckets[name]; b != nil && !b.gone.Load() {
		return b
	}
	return nil
}

// buildTenants creates or updates the engine's buckets to match eff and
// returns the new table. prev (may be nil) supplies the buckets that keep
// their state; new buckets start in namespace epochs[name], their ceiling
// (throttle.ReadCost) at startClass units (0: the largest item). Buckets of prev
// missing from eff are removed from the engine and marked gone (their
// sessions notice through recheckSessions). The caller holds adminMu.
func buildTenants(eng *throttle.Engine, eff *bucketcfg.Config, prev *tenants, m *metrics.Metrics, epochs map[string]uint64,
	startClass int64, local func(name string, reserved, hard throttle.Limit) (throttle.Limit, throttle.Limit)) (*tenants, error) {
	t := &tenants{cfg: eff, buckets: make(map[string]*bucket, len(eff.Buckets))}
	var errs []error
	for _, bc := range eff.Buckets {
		res, hard := local(bc.Name, bc.Throttle.Reserved, bc.Throttle.HardLimit)
		if prev != nil {
			if old := prev.buckets[bc.Name]; old != nil {
				if err := old.tb.SetLimits(res, hard); err != nil {
					errs = append(errs, fmt.Errorf("bucket %s: %w", bc.Name, err))
				}
				if err := old.tb.SetWeight(bc.Weight); err != nil {
					errs = append(errs, fmt.Errorf("bucket %s: weight: %w", bc.Name, err))
				}
				old.flushEnabled.Store(bc.FlushEnabled)
				t.buckets[bc.Name] = old
				continue
			}
		}
		tb := eng.Bucket(bc.Name)
		if tb == nil {
			var err error
			if tb, err = eng.AddBucket(bc.Name, res, hard); err != nil {
				errs = append(errs, fmt.Errorf("bucket %s: %w", bc.Name, err))
				continue
			}
			// Its ceiling: the start class (nothing of its namespace
			// stored), else the largest item (M) as the engine starts it.
			rc := tb.ReadCost()
			rc.Restore(epochs[bc.Name], cmp.Or(startClass, rc.Ceiling()))
		} else if err := tb.SetLimits(res, hard); err != nil {
			errs = append(errs, fmt.Errorf("bucket %s: %w", bc.Name, err))
		}
		if err := tb.SetWeight(bc.Weight); err != nil {
			errs = append(errs, fmt.Errorf("bucket %s: weight: %w", bc.Name, err))
		}
		nb := newBucket(bc.Name, bc.FlushEnabled, tb, epochs[bc.Name])
		if m != nil {
			nb.wait = m.WaitObserver(bc.Name)
		}
		t.buckets[bc.Name] = nb
	}
	if prev != nil {
		for name, old := range prev.buckets {
			if _, ok := t.buckets[name]; !ok {
				old.gone.Store(true)
				_ = eng.RemoveBucket(name)
				if m != nil {
					m.ForgetBucket(name)
				}
			}
		}
	}
	return t, errors.Join(errs...)
}
