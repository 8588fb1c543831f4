package throttle

import (
	"math"
	"strconv"
)

// Limit is a rate in units per second. A Limit >= 0 is a finite rate (0
// admits nothing); [Unlimited] means no limit. Other negative values are
// invalid and rejected with [ErrInvalidLimit].
type Limit int64

// Unlimited is the Limit without a limit: as a capacity it disables the free
// pool's throttling, as a hard limit it never holds, as a reservation it
// admits every command of the bucket without charging any gauge.
const Unlimited Limit = -1

// Valid reports whether l is Unlimited or a rate >= 0.
func (l Limit) Valid() bool { return l >= 0 || l == Unlimited }

// String returns "unlimited" or the decimal rate.
func (l Limit) String() string {
	if l == Unlimited {
		return "unlimited"
	}
	return strconv.FormatInt(int64(l), 10)
}

// addLimits adds two finite limits, saturating.
func addLimits(a, b Limit) Limit {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
