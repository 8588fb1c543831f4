package throttle

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/echo"
)

// Limit is a rate in units per second. A Limit >= 0 is a finite rate (0
// admits nothing); [Unlimited] means no limit. Other negative values are
// invalid and rejected with [ErrInvalidLimit].
//
// The zero value is a finite limit of 0 units per second (nothing allowed
// beyond what other rules grant), not unlimited. Limits are comparable with
// ==.
//
// Limit is kvthrottle's one type for every rate that may be "unlimited": the
// engine's capacity, reservations and hard limits, the values of the TOML
// file, of the admin JSON bodies and of the state file, and the values of
// STAT throttle. Written out (String, and the text, JSON and TOML forms) a
// Limit is the decimal number of units per second or the exact string
// "unlimited". Read in ([ParseLimit], and the text, JSON and TOML decoders)
// it must be an integer in [0, MaxUnits] or that string: any other string, a
// negative number, a non-integer number (1.5, 1e3, 1.0), a boolean, null, an
// array or a table is rejected with an error that wraps ErrInvalidLimit and
// says what is expected and what was found (echoing at most a few dozen
// bytes of it).
type Limit int64

// Unlimited is the Limit without a limit: as a capacity it disables the free
// pool's throttling, as a hard limit it never holds, as a reservation it
// admits every command of the bucket without charging any gauge.
const Unlimited Limit = -1

// MaxUnits is the largest finite Limit the parsers accept, in units per
// second.
//
// One billion units per second (4 TB/s at the default unit size) is far above
// what any memcached node serves, and keeps rate × nanoseconds within int64
// (1e9 × 1e9 < 2^63), so the throttle engine may do that arithmetic without
// overflow checks.
const MaxUnits int64 = 1_000_000_000

// unlimitedText is the only string accepted for an unlimited Limit.
const unlimitedText = "unlimited"

// NewLimit returns the finite Limit of n units per second, or an error
// wrapping ErrInvalidLimit when n is negative or above [MaxUnits].
func NewLimit(n int64) (Limit, error) {
	if n < 0 {
		return 0, &limitError{got: strconv.FormatInt(n, 10)}
	}
	if n > MaxUnits {
		return 0, &limitError{got: strconv.FormatInt(n, 10), tooLarge: true}
	}
	return Limit(n), nil
}

// ParseLimit parses the text form of a Limit: a decimal integer in [0,
// MaxUnits] (digits only, no sign or space) or "unlimited", for example a
// command-line argument or a STAT throttle value. Errors wrap
// ErrInvalidLimit.
func ParseLimit(s string) (Limit, error) {
	if s == unlimitedText {
		return Unlimited, nil
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, &limitError{got: echo.Quote(s)}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			return 0, &limitError{got: echo.Short(s), tooLarge: true}
		}
		return 0, &limitError{got: echo.Quote(s)}
	}
	return NewLimit(n)
}

// Valid reports whether l is Unlimited or a rate >= 0.
func (l Limit) Valid() bool { return l >= 0 || l == Unlimited }

// IsUnlimited reports whether l is Unlimited.
func (l Limit) IsUnlimited() bool { return l == Unlimited }

// Finite returns the rate and true for a finite Limit (>= 0), or 0 and
// false for Unlimited (or an invalid Limit).
func (l Limit) Finite() (int64, bool) {
	if l < 0 {
		return 0, false
	}
	return int64(l), true
}

// LessOrEqual reports whether l <= o, Unlimited being larger than every
// finite Limit and equal to itself.
func (l Limit) LessOrEqual(o Limit) bool {
	if o == Unlimited {
		return true
	}
	if l == Unlimited {
		return false
	}
	return l <= o
}

// Float64 returns the rate as a float64: +Inf for Unlimited, as the
// metrics export it.
func (l Limit) Float64() float64 {
	if l == Unlimited {
		return math.Inf(1)
	}
	return float64(l)
}

// String returns "unlimited" or the decimal rate.
func (l Limit) String() string {
	if l == Unlimited {
		return "unlimited"
	}
	return strconv.FormatInt(int64(l), 10)
}

// inRange reports whether l is a Limit the parsers accept: Unlimited or in
// [0, MaxUnits].
func (l Limit) inRange() bool { return l == Unlimited || (l >= 0 && int64(l) <= MaxUnits) }

// rangeError is the error of marshalling a Limit the parsers would reject.
func (l Limit) rangeError() error {
	return &limitError{got: strconv.FormatInt(int64(l), 10), tooLarge: l > 0}
}

// MarshalText encodes l as String does. It fails, wrapping ErrInvalidLimit,
// for a Limit that ParseLimit would not accept back.
func (l Limit) MarshalText() ([]byte, error) {
	if !l.inRange() {
		return nil, l.rangeError()
	}
	return []byte(l.String()), nil
}

// UnmarshalText decodes the text form of a Limit, as ParseLimit does.
func (l *Limit) UnmarshalText(text []byte) error {
	v, err := ParseLimit(string(text))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// MarshalJSON encodes l as a JSON number, or as the string "unlimited". It
// fails, wrapping ErrInvalidLimit, for a Limit that UnmarshalJSON would not
// accept back.
func (l Limit) MarshalJSON() ([]byte, error) {
	if !l.inRange() {
		return nil, l.rangeError()
	}
	if l == Unlimited {
		return []byte(`"` + unlimitedText + `"`), nil
	}
	return strconv.AppendInt(nil, int64(l), 10), nil
}

// UnmarshalJSON decodes a JSON integer in [0, MaxUnits] or the string
// "unlimited". Everything else, including null, is an error (the usual
// encoding/json convention of null being a no-op does not apply: a limit must
// be explicit).
func (l *Limit) UnmarshalJSON(data []byte) error {
	v, err := limitFromJSON(data)
	if err != nil {
		return err
	}
	*l = v
	return nil
}

// UnmarshalTOML implements the BurntSushi/toml Unmarshaler: it accepts a
// TOML integer in [0, MaxUnits] or the string "unlimited".
func (l *Limit) UnmarshalTOML(v any) error {
	lim, err := limitFromTOML(v)
	if err != nil {
		return err
	}
	*l = lim
	return nil
}

// MarshalTOML implements the BurntSushi/toml Marshaler: an integer, or the
// quoted string "unlimited".
func (l Limit) MarshalTOML() ([]byte, error) { return l.MarshalJSON() }

// limitError is the error for a rejected Limit value. got is a short, already
// quoted or formatted rendering of what was found; it never holds more than
// a few dozen bytes of client input.
type limitError struct {
	got      string
	tooLarge bool
}

func (e *limitError) Error() string {
	if e.tooLarge {
		return fmt.Sprintf(`must be at most %d or "unlimited", got %s`, MaxUnits, e.got)
	}
	return `must be a non-negative integer or "unlimited", got ` + e.got
}

// Unwrap returns ErrInvalidLimit, for errors.Is.
func (e *limitError) Unwrap() error { return ErrInvalidLimit }

// limitFromJSON decodes one JSON value (as delivered to UnmarshalJSON or held
// in a json.RawMessage) into a Limit.
func limitFromJSON(data []byte) (Limit, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return 0, &limitError{got: "nothing"}
	}
	switch c := data[0]; {
	case c == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return 0, &limitError{got: "an invalid string"}
		}
		if s == unlimitedText {
			return Unlimited, nil
		}
		return 0, &limitError{got: echo.Quote(s)}
	case c == '-' || (c >= '0' && c <= '9'):
		if c == '-' || bytes.ContainsAny(data, ".eE") {
			return 0, &limitError{got: echo.Short(string(data))}
		}
		n, err := strconv.ParseInt(string(data), 10, 64)
		if err != nil {
			var ne *strconv.NumError
			if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
				return 0, &limitError{got: echo.Short(string(data)), tooLarge: true}
			}
			return 0, &limitError{got: echo.Short(string(data))}
		}
		return NewLimit(n)
	case c == 't' || c == 'f' || c == 'n':
		return 0, &limitError{got: echo.Short(string(data))}
	case c == '[':
		return 0, &limitError{got: "an array"}
	case c == '{':
		return 0, &limitError{got: "an object"}
	default:
		return 0, &limitError{got: "invalid JSON"}
	}
}

// limitFromTOML converts a value decoded by BurntSushi/toml into a Limit.
func limitFromTOML(v any) (Limit, error) {
	switch x := v.(type) {
	case int64:
		return NewLimit(x)
	case string:
		if x == unlimitedText {
			return Unlimited, nil
		}
		return 0, &limitError{got: echo.Quote(x)}
	case float64:
		return 0, &limitError{got: echo.Short(strconv.FormatFloat(x, 'g', -1, 64))}
	case bool:
		return 0, &limitError{got: strconv.FormatBool(x)}
	case time.Time:
		return 0, &limitError{got: "a date/time"}
	case []any, []map[string]any:
		return 0, &limitError{got: "an array"}
	case map[string]any:
		return 0, &limitError{got: "a table"}
	default:
		return 0, &limitError{got: fmt.Sprintf("a value of type %T", v)}
	}
}

// addLimits adds two finite limits, saturating.
func addLimits(a, b Limit) Limit {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
