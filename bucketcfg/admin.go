package bucketcfg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/kvthrottle/kvthrottle/internal/echo"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// MaxAdminBodyBytes is the largest JSON body accepted by [ParseBucketThrottle]
// and [ParseNodeThrottle] (DESIGN.md section 5 fixes it for 0x2a; 0x2c uses
// the same bound).
const MaxAdminBodyBytes = 1024

// JSON field names of the admin bodies (DESIGN.md section 5).
const (
	fieldReserved         = "reserved"
	fieldHardLimit        = "hard_limit"
	fieldWeight           = "weight"
	fieldCapacity         = "capacity"
	fieldDefaultReserved  = "default_throttle_reserved_units"
	fieldDefaultHardLimit = "default_throttle_hard_limit"
)

// BucketThrottle is the pair of throttle properties of one bucket: the
// guaranteed reservation and the hard limit, in units per second. It is the
// body of admin opcode 0x2a, an entry of the state file, and the pair of node
// defaults given to buckets without explicit limits.
//
// Its JSON form is {"reserved": N|"unlimited", "hard_limit": N|"unlimited"}.
// A valid BucketThrottle has Reserved <= HardLimit (see Validate). The zero
// value is {0, 0}: valid, but a bucket with it can run nothing.
type BucketThrottle struct {
	Reserved  throttle.Limit `json:"reserved"`
	HardLimit throttle.Limit `json:"hard_limit"`
}

// Validate returns an error when Reserved exceeds HardLimit.
func (b BucketThrottle) Validate() error {
	if !b.Reserved.LessOrEqual(b.HardLimit) {
		return fmt.Errorf("reserved %s exceeds hard_limit %s", b.Reserved, b.HardLimit)
	}
	return nil
}

// String returns a short human-readable form such as
// "reserved=100 hard_limit=unlimited".
func (b BucketThrottle) String() string {
	return "reserved=" + b.Reserved.String() + " hard_limit=" + b.HardLimit.String()
}

// ParseBucketThrottle parses the value of admin opcode 0x2a
// (SetBucketThrottleProperties):
//
//	{"reserved": N|"unlimited", "hard_limit": N|"unlimited"}
//
// Rules: the body is at most [MaxAdminBodyBytes] bytes and is exactly one
// JSON object (nothing but white space after it); field names are matched
// exactly (case-sensitively), an unknown or repeated field is an error; a
// missing field means "unlimited" (so {} is unlimited/unlimited, and
// {"hard_limit": 100} is rejected because its reservation is unlimited); the
// values follow the [throttle.Limit] rules; Reserved must not exceed HardLimit.
//
// The returned error's text is a short reason meant for the body of the
// memcached 0x04 Einval response, for example
// `reserved: must be a non-negative integer or "unlimited", got -1`.
// The returned value is valid (Validate returns nil) whenever err is nil.
func ParseBucketThrottle(body []byte) (BucketThrottle, error) {
	fields, err := scanObject(body, fieldReserved, fieldHardLimit)
	if err != nil {
		return BucketThrottle{}, err
	}
	return bucketThrottleFields(fields)
}

// BucketProperties is the body of admin opcode 0x2a as the proxy reads it
// (see [ParseBucketProperties]): the limits, and the weight when given.
type BucketProperties struct {
	// Throttle is the bucket's new reservation and hard limit (a missing
	// field is "unlimited", as for [ParseBucketThrottle]); always valid.
	Throttle BucketThrottle
	// Weight is the bucket's new weight, 1..MaxBucketWeight, or 0 when the
	// body has no "weight": the bucket then keeps the weight it has.
	Weight int
}

// ParseBucketProperties parses the value of admin opcode 0x2a
// (SetBucketThrottleProperties) with the weight of DESIGN.md section 13:
//
//	{"reserved": N|"unlimited", "hard_limit": N|"unlimited", "weight": W}
//
// reserved and hard_limit follow the rules of [ParseBucketThrottle] (a
// missing one is "unlimited"). weight is optional, an integer from 1 to
// [MaxBucketWeight] written without fraction or exponent; when it is
// missing, Weight is 0 and the bucket keeps its weight (unlike the limits:
// clients that predate weights must not reset them). Errors are short
// reasons for the 0x04 Einval body, for example
// `weight: must be an integer from 1 to 10000, got 0`.
func ParseBucketProperties(body []byte) (BucketProperties, error) {
	fields, err := scanObject(body, fieldReserved, fieldHardLimit, fieldWeight)
	if err != nil {
		return BucketProperties{}, err
	}
	var bp BucketProperties
	if raw, ok := fields[fieldWeight]; ok {
		if bp.Weight, err = weightField(raw); err != nil {
			return BucketProperties{}, err
		}
	}
	if bp.Throttle, err = bucketThrottleFields(fields); err != nil {
		return BucketProperties{}, err
	}
	return bp, nil
}

// weightField decodes the JSON "weight" value: an integer literal from 1 to
// MaxBucketWeight.
func weightField(raw json.RawMessage) (int, error) {
	text := string(bytes.TrimSpace(raw))
	if n, err := strconv.Atoi(text); err == nil && n >= 1 && n <= MaxBucketWeight {
		return n, nil
	}
	if len(text) > 40 {
		text, _ = echo.Cut(text, 40)
		text += "..."
	}
	return 0, fmt.Errorf("%s: must be an integer from 1 to %d, got %s", fieldWeight, MaxBucketWeight, text)
}

// bucketThrottleFields builds the limits of a 0x2a body from its fields.
func bucketThrottleFields(fields map[string]json.RawMessage) (BucketThrottle, error) {
	var err error
	bt := BucketThrottle{Reserved: throttle.Unlimited, HardLimit: throttle.Unlimited}
	if raw, ok := fields[fieldReserved]; ok {
		if bt.Reserved, err = limitField(fieldReserved, raw); err != nil {
			return BucketThrottle{}, err
		}
	}
	if raw, ok := fields[fieldHardLimit]; ok {
		if bt.HardLimit, err = limitField(fieldHardLimit, raw); err != nil {
			return BucketThrottle{}, err
		}
	}
	if err := bt.Validate(); err != nil {
		if _, given := fields[fieldReserved]; !given {
			return BucketThrottle{}, fmt.Errorf(`reserved is missing, which means "unlimited", and that exceeds hard_limit %s`, bt.HardLimit)
		}
		return BucketThrottle{}, err
	}
	return bt, nil
}

// NodeThrottle is the body of admin opcode 0x2c (SetNodeThrottleProperties):
// a partial update of the node's throttle properties.
//
// A nil field means "unchanged". Defaults groups default_throttle_reserved_units
// and default_throttle_hard_limit, which are always given together; when it is
// not nil it is valid (Reserved <= HardLimit).
//
// Its JSON form (see MarshalJSON and [ParseNodeThrottle]) is
//
//	{"capacity": N|"unlimited",
//	 "default_throttle_reserved_units": N|"unlimited",
//	 "default_throttle_hard_limit": N|"unlimited"}
//
// with every field optional.
type NodeThrottle struct {
	Capacity *throttle.Limit
	Defaults *BucketThrottle
}

// IsEmpty reports whether nt changes nothing (the body was {}).
func (nt NodeThrottle) IsEmpty() bool { return nt.Capacity == nil && nt.Defaults == nil }

// MarshalJSON encodes nt in the wire form read by [ParseNodeThrottle],
// omitting unchanged fields. It is what `kvthrottle ctl set-node` may send.
// It fails, naming the field, for a limit ParseNodeThrottle would reject
// (see [throttle.Limit.MarshalJSON]); values from this package's parsers
// never do.
func (nt NodeThrottle) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	sep := ""
	put := func(name string, l throttle.Limit) error {
		v, err := l.MarshalJSON()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		b.WriteString(sep + strconv.Quote(name) + ":")
		b.Write(v)
		sep = ","
		return nil
	}
	if nt.Capacity != nil {
		if err := put(fieldCapacity, *nt.Capacity); err != nil {
			return nil, err
		}
	}
	if nt.Defaults != nil {
		if err := put(fieldDefaultReserved, nt.Defaults.Reserved); err != nil {
			return nil, err
		}
		if err := put(fieldDefaultHardLimit, nt.Defaults.HardLimit); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// ParseNodeThrottle parses the value of admin opcode 0x2c
// (SetNodeThrottleProperties). Every field is optional and a missing field
// leaves that property unchanged (nil in the result); {} is a valid no-op.
// default_throttle_reserved_units and default_throttle_hard_limit must be
// both present or both absent, and the reserved default must not exceed the
// hard-limit default. The other rules (size, exactly one object, exact field
// names, no unknown or repeated field, [throttle.Limit] values) and the style of the
// error text are those of [ParseBucketThrottle].
func ParseNodeThrottle(body []byte) (NodeThrottle, error) {
	fields, err := scanObject(body, fieldCapacity, fieldDefaultReserved, fieldDefaultHardLimit)
	if err != nil {
		return NodeThrottle{}, err
	}
	var nt NodeThrottle
	if raw, ok := fields[fieldCapacity]; ok {
		c, err := limitField(fieldCapacity, raw)
		if err != nil {
			return NodeThrottle{}, err
		}
		nt.Capacity = &c
	}
	rawRes, hasRes := fields[fieldDefaultReserved]
	rawHard, hasHard := fields[fieldDefaultHardLimit]
	if hasRes != hasHard {
		return NodeThrottle{}, errors.New(fieldDefaultReserved + " and " + fieldDefaultHardLimit + " must be given together")
	}
	if hasRes {
		var d BucketThrottle
		if d.Reserved, err = limitField(fieldDefaultReserved, rawRes); err != nil {
			return NodeThrottle{}, err
		}
		if d.HardLimit, err = limitField(fieldDefaultHardLimit, rawHard); err != nil {
			return NodeThrottle{}, err
		}
		if d.Validate() != nil {
			return NodeThrottle{}, fmt.Errorf("%s %s exceeds %s %s", fieldDefaultReserved, d.Reserved, fieldDefaultHardLimit, d.HardLimit)
		}
		nt.Defaults = &d
	}
	return nt, nil
}

// limitField decodes one Limit-valued field, prefixing errors with its name.
func limitField(name string, raw json.RawMessage) (throttle.Limit, error) {
	var l throttle.Limit
	if err := l.UnmarshalJSON(raw); err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return l, nil
}

// scanObject checks that body is a single JSON object of at most
// MaxAdminBodyBytes whose keys are all in known (compared exactly) and
// distinct, and returns the raw value of each key present.
//
// encoding/json's DisallowUnknownFields is not enough here: it matches field
// names case-insensitively, silently keeps the last of repeated fields and
// turns null into "absent" for pointer fields. Walking the tokens gives exact
// names, duplicate detection and precise, short error texts.
func scanObject(body []byte, known ...string) (map[string]json.RawMessage, error) {
	if len(body) > MaxAdminBodyBytes {
		return nil, fmt.Errorf("body too large: %d bytes, at most %d allowed", len(body), MaxAdminBodyBytes)
	}
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, errors.New("empty body: a JSON object is required")
	}
	if trimmed[0] != '{' {
		return nil, errors.New("body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, jsonErr(err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("body must be a JSON object")
	}
	fields := make(map[string]json.RawMessage, len(known))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, jsonErr(err)
		}
		key, ok := tok.(string)
		if !ok { // cannot happen: the decoder only yields strings here
			return nil, errors.New("invalid JSON: object key is not a string")
		}
		isKnown := false
		for _, k := range known {
			if key == k {
				isKnown = true
				break
			}
		}
		if !isKnown {
			return nil, fmt.Errorf("unknown field %s", echo.Quote(key))
		}
		if _, dup := fields[key]; dup {
			return nil, fmt.Errorf("duplicate field %q", key)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, jsonErr(err)
		}
		fields[key] = raw
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, jsonErr(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("invalid JSON: unexpected data after the object")
	}
	return fields, nil
}

// jsonErr turns an encoding/json error into a short reason (at most about
// 100 bytes, whatever the input).
func jsonErr(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("invalid JSON: unexpected end of input")
	}
	msg := err.Error()
	if len(msg) > 80 {
		msg, _ = echo.Cut(msg, 80)
		msg += "..."
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("invalid JSON at offset %d: %s", se.Offset, msg)
	}
	return fmt.Errorf("invalid JSON: %s", msg)
}
