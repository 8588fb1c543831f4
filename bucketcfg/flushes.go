package bucketcfg

import (
	"errors"
	"fmt"
)

// PendingFlush is a delayed FLUSH (flush_all <delay>, binary FLUSH with an
// expiration) not yet in effect: at the wall-clock time At (Unix seconds)
// its bucket moves to namespace epoch Epoch, so every key stored before
// then is gone and keys stored from then on are kept. Epoch is fixed when
// the flush is scheduled (the bucket's epoch then, plus one), which makes
// applying it idempotent: instances of a fleet, or a proxy restarted after
// At, all land on the same epoch however often they apply it. A pending
// flush whose Epoch is not above the bucket's epoch has been overtaken (an
// immediate FLUSH since) and is void.
type PendingFlush struct {
	At    int64  `json:"at"`
	Epoch uint64 `json:"epoch"`
}

// ScheduleFlush records a delayed flush of bucket name at Unix time at,
// replacing any pending one (as memcached's later flush_all replaces an
// earlier one), and returns it. The target epoch is the bucket's epoch
// plus one.
func (s *State) ScheduleFlush(name string, at int64) PendingFlush {
	if s.Flushes == nil {
		s.Flushes = map[string]PendingFlush{}
	}
	f := PendingFlush{At: at, Epoch: s.Epochs[name] + 1}
	s.Flushes[name] = f
	return f
}

// FlushNow moves bucket name to a fresh namespace at once and cancels its
// pending flush, if any (an immediate flush replaces a delayed one). It
// returns the new epoch.
func (s *State) FlushNow(name string) uint64 {
	delete(s.Flushes, name)
	return s.BumpEpoch(name)
}

// ApplyFlushes puts in effect every pending flush due at Unix time now
// (its bucket's epoch becomes the flush's, if greater) and drops those
// that are void; it reports whether s changed.
func (s *State) ApplyFlushes(now int64) bool {
	changed := false
	for name, f := range s.Flushes {
		switch {
		case f.Epoch <= s.Epochs[name]:
		case now >= f.At:
			s.Epochs[name] = f.Epoch
		default:
			continue
		}
		delete(s.Flushes, name)
		changed = true
	}
	return changed
}

// validateFlushes checks the pending flushes: valid bucket names, a
// positive time and epoch.
func (s *State) validateFlushes() error {
	for name, f := range s.Flushes {
		if err := CheckBucketName(name); err != nil {
			return fmt.Errorf("flushes: %w", err)
		}
		if f.At <= 0 || f.Epoch == 0 {
			return fmt.Errorf("flushes: bucket %q: %w", name, errBadFlush)
		}
	}
	return nil
}

var errBadFlush = errors.New("a pending flush needs a positive at and epoch")
