package bucketcfg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"
)

// MaxUnits is the largest finite [Limit], in units per second.
//
// One billion units per second (4 TB/s at the default unit size) is far above
// what any memcached node serves, and keeps rate × nanoseconds within int64
// (1e9 × 1e9 < 2^63), so the throttle engine may do that arithmetic without
// overflow checks.
const MaxUnits int64 = 1_000_000_000

// unlimitedText is the only string accepted for an unlimited Limit.
const unlimitedText = "unlimited"

// Limit is a rate in units per second, or unlimited.
//
// The zero value is a finite limit of 0 units per second (nothing allowed
// beyond what other rules grant), not unlimited; use [Unlimited] for that.
// A Limit always holds either "unlimited" or a value in [0, MaxUnits]; the
// constructors and decoders of this package never produce anything else.
// Limits are comparable with ==.
//
// In TOML and JSON a Limit is written as a non-negative integer or as the
// exact string "unlimited". Any other string, a negative number, a
// non-integer number (1.5, 1e3, 1.0), a boolean, null, an array or a table is
// rejected with an error explaining what is expected and what was found.
type Limit struct {
	units     int64
	unlimited bool
}

// Unlimited returns the unlimited Limit.
func Unlimited() Limit { return Limit{unlimited: true} }

// NewLimit returns the finite Limit of n units per second, or an error when n
// is negative or above [MaxUnits].
func NewLimit(n int64) (Limit, error) {
	if n < 0 {
		return Limit{}, &limitError{got: strconv.FormatInt(n, 10)}
	}
	if n > MaxUnits {
		return Limit{}, &limitError{got: strconv.FormatInt(n, 10), tooLarge: true}
	}
	return Limit{units: n}, nil
}

// UnitsPerSecond returns the finite Limit of n units per second. It panics when
// n is negative or above [MaxUnits]; it is meant for constants and tests. Use
// [NewLimit] for values that come from outside the program.
func UnitsPerSecond(n int64) Limit {
	l, err := NewLimit(n)
	if err != nil {
		panic("bucketcfg.UnitsPerSecond: " + err.Error())
	}
	return l
}

// ParseLimit parses the textual form of a Limit: a decimal non-negative
// integer or "unlimited" (for example a command-line argument).
func ParseLimit(s string) (Limit, error) {
	if s == unlimitedText {
		return Unlimited(), nil
	}
	if s == "" || s[0] < '0' || s[0] > '9' {
		return Limit{}, &limitError{got: quoteShort(s)}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			return Limit{}, &limitError{got: shorten(s), tooLarge: true}
		}
		return Limit{}, &limitError{got: quoteShort(s)}
	}
	return NewLimit(n)
}

// IsUnlimited reports whether l is unlimited.
func (l Limit) IsUnlimited() bool { return l.unlimited }

// Units returns the rate in units per second. For an unlimited Limit it
// returns math.MaxInt64, so that min/compare logic treats it as infinity;
// never add it to anything without checking IsUnlimited first.
func (l Limit) Units() int64 {
	if l.unlimited {
		return math.MaxInt64
	}
	return l.units
}

// Finite returns the rate and true for a finite Limit, or 0 and false for an
// unlimited one.
func (l Limit) Finite() (int64, bool) {
	if l.unlimited {
		return 0, false
	}
	return l.units, true
}

// LessOrEqual reports whether l <= o, unlimited being larger than every
// finite Limit and equal to itself.
func (l Limit) LessOrEqual(o Limit) bool {
	if o.unlimited {
		return true
	}
	if l.unlimited {
		return false
	}
	return l.units <= o.units
}

// String returns "unlimited" or the decimal number of units per second.
func (l Limit) String() string {
	if l.unlimited {
		return unlimitedText
	}
	return strconv.FormatInt(l.units, 10)
}

// MarshalJSON encodes l as a JSON number, or as the string "unlimited".
func (l Limit) MarshalJSON() ([]byte, error) {
	if l.unlimited {
		return []byte(`"` + unlimitedText + `"`), nil
	}
	return strconv.AppendInt(nil, l.units, 10), nil
}

// UnmarshalJSON decodes a JSON non-negative integer or the string
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

// maxEcho bounds how much of a rejected value is echoed in an error.
const maxEcho = 32

// cutShort returns the longest prefix of s of at most maxEcho bytes that
// ends on a rune boundary, and whether s was cut.
func cutShort(s string) (string, bool) { return cutShortN(s, maxEcho) }

// cutShortN is cutShort with a limit of n bytes.
func cutShortN(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut], true
}

// shorten cuts s to at most maxEcho bytes, marking a cut with "...".
func shorten(s string) string {
	if p, cut := cutShort(s); cut {
		return p + "..."
	}
	return s
}

// quoteShort quotes s in Go syntax (so control bytes are escaped) after
// shortening it.
func quoteShort(s string) string {
	if p, cut := cutShort(s); cut {
		return strconv.Quote(p) + "..."
	}
	return strconv.Quote(s)
}

// limitFromJSON decodes one JSON value (as delivered to UnmarshalJSON or held
// in a json.RawMessage) into a Limit.
func limitFromJSON(data []byte) (Limit, error) {
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return Limit{}, &limitError{got: "nothing"}
	}
	switch c := data[0]; {
	case c == '"':
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return Limit{}, &limitError{got: "an invalid string"}
		}
		if s == unlimitedText {
			return Unlimited(), nil
		}
		return Limit{}, &limitError{got: quoteShort(s)}
	case c == '-' || (c >= '0' && c <= '9'):
		if c == '-' || bytes.ContainsAny(data, ".eE") {
			return Limit{}, &limitError{got: shorten(string(data))}
		}
		n, err := strconv.ParseInt(string(data), 10, 64)
		if err != nil {
			var ne *strconv.NumError
			if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
				return Limit{}, &limitError{got: shorten(string(data)), tooLarge: true}
			}
			return Limit{}, &limitError{got: shorten(string(data))}
		}
		return NewLimit(n)
	case c == 't' || c == 'f' || c == 'n':
		return Limit{}, &limitError{got: shorten(string(data))}
	case c == '[':
		return Limit{}, &limitError{got: "an array"}
	case c == '{':
		return Limit{}, &limitError{got: "an object"}
	default:
		return Limit{}, &limitError{got: "invalid JSON"}
	}
}

// limitFromTOML converts a value decoded by BurntSushi/toml into a Limit.
func limitFromTOML(v any) (Limit, error) {
	switch x := v.(type) {
	case int64:
		return NewLimit(x)
	case string:
		if x == unlimitedText {
			return Unlimited(), nil
		}
		return Limit{}, &limitError{got: quoteShort(x)}
	case float64:
		return Limit{}, &limitError{got: shorten(strconv.FormatFloat(x, 'g', -1, 64))}
	case bool:
		return Limit{}, &limitError{got: strconv.FormatBool(x)}
	case time.Time:
		return Limit{}, &limitError{got: "a date/time"}
	case []any, []map[string]any:
		return Limit{}, &limitError{got: "an array"}
	case map[string]any:
		return Limit{}, &limitError{got: "a table"}
	default:
		return Limit{}, &limitError{got: fmt.Sprintf("a value of type %T", v)}
	}
}
