package bucketcfg

import "fmt"

// Ceiling is a bucket's read ceiling as persisted (throttle.ReadCost):
// the class, in read units, that bounds every value of the bucket's
// namespace epoch Epoch. A ceiling of another epoch than the bucket's is
// void (a FLUSH emptied the namespace since).
type Ceiling struct {
	Epoch uint64 `json:"epoch"`
	Class int64  `json:"class"`
}

// SetCeiling records bucket name's ceiling c. Of two ceilings, the one of
// the greater epoch wins, then the larger class (MergeCeiling): a ceiling
// never moves down within an epoch.
func (s *State) SetCeiling(name string, c Ceiling) {
	if s.Ceilings == nil {
		s.Ceilings = map[string]Ceiling{}
	}
	s.Ceilings[name] = MergeCeiling(s.Ceilings[name], c)
}

// MergeCeiling returns the ceiling that holds for both a and b: the one of
// the greater epoch, or within one epoch the larger class.
func MergeCeiling(a, b Ceiling) Ceiling {
	switch {
	case a.Epoch > b.Epoch:
		return a
	case b.Epoch > a.Epoch:
		return b
	case a.Class >= b.Class:
		return a
	}
	return b
}

// validateCeilings checks that every ceiling names a valid bucket and has
// a class of at least one unit.
func (s *State) validateCeilings() error {
	for name, c := range s.Ceilings {
		if err := CheckBucketName(name); err != nil {
			return fmt.Errorf("ceilings: %w", err)
		}
		if c.Class < 1 {
			return fmt.Errorf("ceilings: bucket %q: class %d, want at least 1", name, c.Class)
		}
	}
	return nil
}
