package bucketcfg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// StateVersion is the version of the state file format written by
// [State.Save]; [LoadState] refuses any other.
const StateVersion = 1

// maxStateBytes bounds the state file read by LoadState (it holds one small
// entry per bucket).
const maxStateBytes = 64 << 20

// State is the runtime throttle state changed by the admin opcodes and
// persisted in throttle.state_file. It overrides the configuration file's
// throttle values (see [Effective]).
//
// A nil field or a missing bucket entry means "not overridden". Buckets may
// hold entries for buckets no longer in the configuration: they are kept
// (a bucket that comes back gets its limits back) and ignored by Effective.
// Every value in a State from [LoadState], [NewState] or the Set methods is
// valid. A State is not safe for concurrent use; see [State.Clone] for the
// copy-change-save-publish pattern.
//
// The file is JSON:
//
//	{
//	  "version": 1,
//	  "capacity": 25000,
//	  "default_throttle_reserved_units": 0,
//	  "default_throttle_hard_limit": "unlimited",
//	  "buckets": {"b1": {"reserved": 100, "hard_limit": 1000}},
//	  "weights": {"b1": 3},
//	  "epochs": {"b1": 0, "b2": 3, "old": 1},
//	  "retired": ["old"],
//	  "flushes": {"b2": {"at": 1780000000, "epoch": 4}},
//	  "ceilings": {"b2": {"epoch": 4, "class": 32}}
//	}
//
// where capacity and the two defaults are optional (the defaults go
// together) and null means absent; epochs and retired are the key
// namespaces (see Epochs, Retired), written by the proxy, absent in files
// written before they existed; weights (see Weights) and flushes (see
// Flushes) are absent when empty, and in files written before they
// existed.
//
// ceilings (see Ceilings) are absent when empty. Only a State with
// weights, pending flushes or ceilings is unreadable by a proxy
// that predates them (it refuses unknown fields), as in a fleet upgraded
// one instance at a time: set weights, or send delayed flushes, once every
// instance reads them.
type State struct {
	// Capacity overrides throttle.capacity when not nil.
	Capacity *throttle.Limit
	// Defaults overrides the two throttle.default_throttle_* keys when not
	// nil.
	Defaults *BucketThrottle
	// Buckets overrides the limits of the named buckets. Never nil in a
	// State from this package.
	Buckets map[string]BucketThrottle
	// Weights overrides the weights of the named buckets (0x2a "weight";
	// DESIGN.md section 13), each 1..MaxBucketWeight. It is independent of
	// Buckets: a bucket without an entry here has the file's weight. Never
	// nil in a State from this package.
	Weights map[string]int
	// Epochs are the buckets' key-namespace generations: a FLUSH, or a
	// bucket removed and created again, moves the bucket to a fresh, empty
	// namespace by raising its epoch. Every bucket that has been in service
	// has an entry (see TrackBuckets); a missing entry is epoch 0. Never nil
	// in a State from this package.
	Epochs map[string]uint64
	// Retired holds the buckets of Epochs that are out of service: removed
	// from the configuration, their epoch already raised for when the name
	// comes back. Never nil in a State from this package.
	Retired map[string]bool
	// Flushes are the buckets' delayed flushes not yet in effect (see
	// PendingFlush): at most one per bucket, a later one replacing it.
	// Never nil in a State from this package.
	Flushes map[string]PendingFlush
	// Ceilings are the buckets' read ceilings (see Ceiling), each for the
	// epoch it was raised in. Never nil in a State from this package.
	Ceilings map[string]Ceiling
}

// NewState returns an empty State: nothing overridden.
func NewState() *State {
	return &State{Buckets: map[string]BucketThrottle{}, Weights: map[string]int{}, Epochs: map[string]uint64{}, Retired: map[string]bool{}, Flushes: map[string]PendingFlush{}, Ceilings: map[string]Ceiling{}}
}

// TrackBuckets records that exactly the buckets named inService are in
// service, whether the configuration changed by a reload or while the
// proxy was down. A bucket in service for the first time gets an epoch 0
// entry. A bucket that was in service and no longer is gets its epoch
// raised, once, and is marked retired: if the name comes back, perhaps for
// another tenant, it starts in a fresh, empty namespace instead of finding
// the old keys. It returns s itself when nothing changes, else a changed
// copy to Save before the new configuration takes effect.
func (s *State) TrackBuckets(inService []string) (next *State, changed bool) {
	live := make(map[string]bool, len(inService))
	for _, name := range inService {
		live[name] = true
	}
	next = s
	edit := func() *State {
		if !changed {
			next, changed = s.Clone(), true
		}
		return next
	}
	for _, name := range inService {
		if _, ok := s.Epochs[name]; !ok {
			edit().Epochs[name] = 0
		}
		if s.Retired[name] {
			delete(edit().Retired, name)
		}
	}
	for name := range s.Epochs {
		if !live[name] && !s.Retired[name] {
			n := edit()
			n.BumpEpoch(name)
			n.Retired[name] = true
		}
	}
	return next, changed
}

// BumpEpoch raises bucket name's namespace epoch and returns the new value.
func (s *State) BumpEpoch(name string) uint64 {
	if s.Epochs == nil {
		s.Epochs = map[string]uint64{}
	}
	s.Epochs[name]++
	return s.Epochs[name]
}

// Clone returns a deep copy of s. The admin path is: clone the current
// state, apply the change to the clone, Save it, and only when Save succeeds
// publish the clone and Effective(cfg, clone); on failure the old state
// remains both in memory and on disk.
func (s *State) Clone() *State {
	n := NewState()
	if s.Capacity != nil {
		c := *s.Capacity
		n.Capacity = &c
	}
	if s.Defaults != nil {
		d := *s.Defaults
		n.Defaults = &d
	}
	for k, v := range s.Buckets {
		n.Buckets[k] = v
	}
	for k, v := range s.Weights {
		n.Weights[k] = v
	}
	for k, v := range s.Epochs {
		n.Epochs[k] = v
	}
	for k, v := range s.Retired {
		n.Retired[k] = v
	}
	for k, v := range s.Flushes {
		n.Flushes[k] = v
	}
	for k, v := range s.Ceilings {
		n.Ceilings[k] = v
	}
	return n
}

// SetBucket records the limits of bucket name (admin opcode 0x2a). It
// returns an error, changing nothing, when name is not a valid bucket name or
// bt is invalid. Whether the bucket exists is the caller's check.
func (s *State) SetBucket(name string, bt BucketThrottle) error {
	if err := CheckBucketName(name); err != nil {
		return err
	}
	if err := bt.Validate(); err != nil {
		return err
	}
	if s.Buckets == nil {
		s.Buckets = map[string]BucketThrottle{}
	}
	s.Buckets[name] = bt
	return nil
}

// SetWeight records the weight of bucket name (admin opcode 0x2a
// "weight"). It returns an error, changing nothing, when name is not a
// valid bucket name or w is not in 1..MaxBucketWeight. Whether the bucket
// exists is the caller's check.
func (s *State) SetWeight(name string, w int) error {
	if err := CheckBucketName(name); err != nil {
		return err
	}
	if err := checkWeight(w); err != nil {
		return err
	}
	if s.Weights == nil {
		s.Weights = map[string]int{}
	}
	s.Weights[name] = w
	return nil
}

// checkWeight returns an error when w is not a bucket weight.
func checkWeight(w int) error {
	if w < 1 || w > MaxBucketWeight {
		return fmt.Errorf("weight must be an integer from 1 to %d, got %d", MaxBucketWeight, w)
	}
	return nil
}

// SetNode records a node change (admin opcode 0x2c): a non-nil
// nt.Capacity replaces the capacity, a non-nil nt.Defaults replaces the
// defaults.
//
// New defaults apply only to buckets created afterwards (DESIGN.md section
// 5). So when nt.Defaults is set and current (the Config in force, as
// returned by [Effective]) is not nil, every bucket of current that has no
// state entry and does not set both limits in the file is pinned: its
// current limits are recorded in s, so it keeps them across reloads and
// restarts. It returns an error, changing nothing, when nt.Defaults is
// invalid.
func (s *State) SetNode(nt NodeThrottle, current *Config) error {
	if nt.Defaults != nil {
		if err := nt.Defaults.Validate(); err != nil {
			return err
		}
	}
	if s.Buckets == nil {
		s.Buckets = map[string]BucketThrottle{}
	}
	if nt.Capacity != nil {
		c := *nt.Capacity
		s.Capacity = &c
	}
	if nt.Defaults != nil {
		if current != nil {
			for _, b := range current.Buckets {
				if _, ok := s.Buckets[b.Name]; ok || (b.ReservedSet && b.HardLimitSet) {
					continue
				}
				s.Buckets[b.Name] = b.Throttle
			}
		}
		d := *nt.Defaults
		s.Defaults = &d
	}
	return nil
}

// Validate checks every value of s: the defaults, each bucket entry
// (valid name, Reserved <= HardLimit) and each weight (valid name,
// 1..MaxBucketWeight).
func (s *State) Validate() error {
	if s.Defaults != nil {
		if err := s.Defaults.Validate(); err != nil {
			return fmt.Errorf("defaults: %w", err)
		}
	}
	for name, bt := range s.Buckets {
		if err := CheckBucketName(name); err != nil {
			return fmt.Errorf("buckets: %w", err)
		}
		if err := bt.Validate(); err != nil {
			return fmt.Errorf("bucket %q: %w", name, err)
		}
	}
	for name, w := range s.Weights {
		if err := CheckBucketName(name); err != nil {
			return fmt.Errorf("weights: %w", err)
		}
		if err := checkWeight(w); err != nil {
			return fmt.Errorf("bucket %q: %w", name, err)
		}
	}
	return s.validateFlushes()
}

// stateJSON is the file format of State.
type stateJSON struct {
	Version          int                        `json:"version"`
	Capacity         *throttle.Limit            `json:"capacity,omitempty"`
	DefaultReserved  *throttle.Limit            `json:"default_throttle_reserved_units,omitempty"`
	DefaultHardLimit *throttle.Limit            `json:"default_throttle_hard_limit,omitempty"`
	Buckets          map[string]stateBucketJSON `json:"buckets"`
	Weights          map[string]int             `json:"weights,omitempty"`
	Epochs           map[string]uint64          `json:"epochs,omitempty"`
	Retired          []string                   `json:"retired,omitempty"`
	Flushes          map[string]PendingFlush    `json:"flushes,omitempty"`
	Ceilings         map[string]Ceiling         `json:"ceilings,omitempty"`
}

type stateBucketJSON struct {
	Reserved  *throttle.Limit `json:"reserved"`
	HardLimit *throttle.Limit `json:"hard_limit"`
}

// MarshalJSON encodes s in the state file format (map keys sorted, so the
// output is deterministic).
func (s State) MarshalJSON() ([]byte, error) {
	j := stateJSON{Version: StateVersion, Capacity: s.Capacity, Buckets: make(map[string]stateBucketJSON, len(s.Buckets)), Weights: s.Weights, Epochs: s.Epochs, Flushes: s.Flushes, Ceilings: s.Ceilings}
	if s.Defaults != nil {
		r, h := s.Defaults.Reserved, s.Defaults.HardLimit
		j.DefaultReserved, j.DefaultHardLimit = &r, &h
	}
	for k, v := range s.Buckets {
		r, h := v.Reserved, v.HardLimit
		j.Buckets[k] = stateBucketJSON{Reserved: &r, HardLimit: &h}
	}
	for name, ok := range s.Retired {
		if ok {
			j.Retired = append(j.Retired, name)
		}
	}
	slices.Sort(j.Retired)
	return json.Marshal(j)
}

// UnmarshalJSON decodes and validates the state file format: exactly one
// object, no unknown field, "version" equal to StateVersion, both defaults or
// neither, each bucket entry with both fields and valid.
func (s *State) UnmarshalJSON(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var j stateJSON
	if err := dec.Decode(&j); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON object")
	}
	if j.Version != StateVersion {
		return fmt.Errorf("unsupported version %d (this program reads version %d)", j.Version, StateVersion)
	}
	n := NewState()
	n.Capacity = j.Capacity
	if (j.DefaultReserved == nil) != (j.DefaultHardLimit == nil) {
		return errors.New("default_throttle_reserved_units and default_throttle_hard_limit must be given together")
	}
	if j.DefaultReserved != nil {
		n.Defaults = &BucketThrottle{Reserved: *j.DefaultReserved, HardLimit: *j.DefaultHardLimit}
	}
	for name, b := range j.Buckets {
		if b.Reserved == nil || b.HardLimit == nil {
			return fmt.Errorf("bucket %q: reserved and hard_limit are both required", name)
		}
		n.Buckets[name] = BucketThrottle{Reserved: *b.Reserved, HardLimit: *b.HardLimit}
	}
	for name, w := range j.Weights {
		n.Weights[name] = w
	}
	for name, e := range j.Epochs {
		if err := CheckBucketName(name); err != nil {
			return fmt.Errorf("epochs: %w", err)
		}
		n.Epochs[name] = e
	}
	for _, name := range j.Retired {
		if _, ok := j.Epochs[name]; !ok {
			return fmt.Errorf("retired: bucket %q has no epoch", name)
		}
		n.Retired[name] = true
	}
	for name, f := range j.Flushes {
		n.Flushes[name] = f
	}
	for name, c := range j.Ceilings {
		n.Ceilings[name] = c
	}
	if err := n.validateCeilings(); err != nil {
		return err
	}
	if err := n.Validate(); err != nil {
		return err
	}
	*s = *n
	return nil
}

// LoadState reads the state file at path. A missing file is not an error:
// it returns an empty State (nothing overridden), as on a first start. An
// unreadable, corrupt or invalid file is an error naming path. Temporary
// files left next to path by an interrupted [State.Save] are ignored.
func LoadState(path string) (*State, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return NewState(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxStateBytes+1))
	if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	if len(data) > maxStateBytes {
		return nil, fmt.Errorf("state file %s: larger than %d bytes", path, maxStateBytes)
	}
	s := NewState()
	if err := json.Unmarshal(data, s); err != nil {
		return nil, fmt.Errorf("state file %s: corrupt or invalid: %w", path, err)
	}
	return s, nil
}

// Test hooks for Save; they are nil/default in production.
var (
	// saveWrite writes the data to the temporary file.
	saveWrite = func(f *os.File, data []byte) error {
		_, err := f.Write(data)
		return err
	}
	// saveBeforeRename, when set, runs after the temporary file is written,
	// synced and closed, just before the rename. A returned error aborts the
	// save; a panic simulates a crash at that point (nothing is cleaned up).
	saveBeforeRename func(tmp string) error
)

// Save writes s to path atomically and durably: it writes a temporary file
// in the same directory, fsyncs it, renames it over path and fsyncs the
// directory. A crash at any point leaves path holding either the old or the
// new state, complete (a stray temporary file ".<name>.tmp-*" may remain,
// which LoadState ignores). When Save returns an error before the rename,
// path is untouched and the temporary file removed; an error after the rename
// (directory sync) means path may hold either state. The file is created with
// mode 0600.
func (s *State) Save(path string) error {
	if err := s.Validate(); err != nil {
		return fmt.Errorf("state file %s: not saved: %w", path, err)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	data = append(data, '\n')
	if err := WriteFileAtomic(path, data); err != nil {
		return fmt.Errorf("state file %w", err)
	}
	return nil
}

// WriteFileAtomic writes data to path atomically and durably, as State.Save
// does (temporary file in the same directory, fsync, rename, directory
// fsync; mode 0600). Its errors name path and say whether path was left
// untouched ("not saved") or may hold either content (the directory sync
// failed after the rename).
func WriteFileAtomic(path string, data []byte) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	tmp := f.Name()
	fail := func(err error) error {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("%s: not saved: %w", path, err)
	}
	if err := saveWrite(f, data); err != nil {
		return fail(err)
	}
	if err := f.Sync(); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s: not saved: %w", path, err)
	}
	if saveBeforeRename != nil {
		if err := saveBeforeRename(tmp); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("%s: not saved: %w", path, err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("%s: not saved: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("%s: written, but syncing directory %s failed: %w", path, dir, err)
	}
	return nil
}

// syncDir fsyncs a directory so that a rename in it is durable. File systems
// that cannot sync directories (EINVAL) are tolerated.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, errors.ErrUnsupported) {
		return err
	}
	return nil
}

// Effective returns the Config in force: cfg with the runtime state st
// applied. st may be nil (nothing overridden). cfg itself is not modified.
//
// Rules, starting each time from the file's own values (so Effective may be
// given a Config that is itself the result of Effective):
//   - st.Capacity, when set, replaces throttle.capacity;
//   - st.Defaults, when set, replaces the two throttle defaults;
//   - a bucket of cfg with an entry in st.Buckets takes that entry;
//   - any other bucket takes the limits it sets in the file, and the
//     effective defaults for those it does not set;
//   - a bucket of cfg with an entry in st.Weights takes that weight, any
//     other the file's (1 when the file does not set one).
//
// State entries of buckets not in cfg are ignored. The error (a
// *ConfigError naming cfg's file) reports buckets whose file values no
// longer fit the state's defaults (for example reserved = 100 in the file
// and a default hard limit of 50 in the state) and invalid state values.
func Effective(cfg *Config, st *State) (*Config, error) {
	n := cfg.clone()
	n.Throttle.Capacity = cfg.fileNode.capacity
	n.Throttle.Defaults = cfg.fileNode.defaults
	var probs problems
	if st != nil {
		if st.Capacity != nil {
			n.Throttle.Capacity = *st.Capacity
		}
		if st.Defaults != nil {
			if err := st.Defaults.Validate(); err != nil {
				probs.addf("state defaults", "%s", err)
			} else {
				n.Throttle.Defaults = *st.Defaults
			}
		}
	}
	for i := range n.Buckets {
		b := &n.Buckets[i]
		b.Weight = max(b.fileWeight, throttle.DefaultWeight)
		if st != nil {
			if w, ok := st.Weights[b.Name]; ok {
				if err := checkWeight(w); err != nil {
					probs.addf(fmt.Sprintf("state bucket %q", b.Name), "%s", err)
				} else {
					b.Weight = w
				}
			}
			if e, ok := st.Buckets[b.Name]; ok {
				if err := e.Validate(); err != nil {
					probs.addf(fmt.Sprintf("state bucket %q", b.Name), "%s", err)
					continue
				}
				b.Throttle = e
				continue
			}
		}
		if err := b.resolve(n.Throttle.Defaults); err != nil {
			probs.addf(fmt.Sprintf("bucket %q", b.Name), "%s, with the defaults in force (%s)", err, n.Throttle.Defaults)
		}
	}
	if len(probs) > 0 {
		return nil, &ConfigError{Path: cfg.path, Problems: probs}
	}
	return n, nil
}
