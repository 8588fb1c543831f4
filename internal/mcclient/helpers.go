package mcclient

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// Err returns nil when r is a success, and otherwise a *StatusError
// carrying r's opcode, status and body (the server's reason).
func (r *Response) Err() error {
	if r.Status() == mc.StatusSuccess {
		return nil
	}
	return &StatusError{Op: r.Opcode, Status: r.Status(), Reason: string(r.Value)}
}

// ErrNoPlainMech is returned (wrapped) by AuthPlain when the server does not
// list the PLAIN SASL mechanism.
var ErrNoPlainMech = errors.New("the server does not offer SASL PLAIN")

// SASLMechs sends SASL list mechanisms (0x20) and returns the mechanism
// names of the space-separated answer. A failure status is a *StatusError.
func (c *Client) SASLMechs() ([]string, error) {
	resp, err := c.Do(Request{Opcode: mc.OpSASLListMechs})
	if err != nil {
		return nil, err
	}
	if err := resp.Err(); err != nil {
		return nil, err
	}
	return strings.Fields(string(resp.Value)), nil
}

// AuthPlain authenticates the connection with SASL PLAIN: it lists the
// mechanisms (0x20), checks that PLAIN is among them (else an error wrapping
// ErrNoPlainMech), then sends SASL auth (0x21) with key "PLAIN" and value
// "\x00user\x00password". Bad credentials give a *StatusError with status
// 0x20 AuthError. The password appears in no error.
func (c *Client) AuthPlain(user, password string) error {
	mechs, err := c.SASLMechs()
	if err != nil {
		return err
	}
	found := false
	for _, m := range mechs {
		if m == "PLAIN" {
			found = true
			break
		}
	}
	if !found {
		return fmt.Errorf("%w (it offers %q)", ErrNoPlainMech, strings.Join(mechs, " "))
	}
	return c.AuthPlainNoList(user, password)
}

// AuthPlainNoList is AuthPlain without listing the mechanisms first, for a
// caller that has (SASLMechs): it sends SASL auth (0x21) with key "PLAIN"
// and value "\x00user\x00password". A refusal is a *StatusError (0x20
// AuthError, with the server's reason). The password appears in no error.
func (c *Client) AuthPlainNoList(user, password string) error {
	v := make([]byte, 0, 2+len(user)+len(password))
	v = append(v, 0)
	v = append(v, user...)
	v = append(v, 0)
	v = append(v, password...)
	resp, err := c.Do(Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: v})
	if err != nil {
		return err
	}
	return resp.Err()
}

// Stats sends STAT (0x10) with key group ("" is the general group) and
// returns the key/value pairs in the order received, reading responses up to
// the terminating one with an empty key. A failure status is a *StatusError.
func (c *Client) Stats(group string) ([][2]string, error) {
	op := c.Send(Request{Opcode: mc.OpStat, Key: []byte(group)})
	if err := c.Flush(); err != nil {
		return nil, err
	}
	var kv [][2]string
	for {
		resp, err := c.Read()
		if err != nil {
			return nil, err
		}
		if resp.Opaque != op {
			return nil, fmt.Errorf("STAT: response opaque %d, want %d", resp.Opaque, op)
		}
		if err := resp.Err(); err != nil {
			return nil, err
		}
		if len(resp.Key) == 0 {
			return kv, nil
		}
		kv = append(kv, [2]string{string(resp.Key), string(resp.Value)})
	}
}

// SetBucketThrottle sends SetBucketThrottleProperties (0x2a) with key bucket
// and the JSON body, and returns the response body on success. A failure
// status is a *StatusError whose Reason is the server's explanation.
func (c *Client) SetBucketThrottle(bucket string, body []byte) ([]byte, error) {
	return c.admin(Request{Opcode: mc.OpSetBucketThrottleProperties, Key: []byte(bucket), Value: body})
}

// SetNodeThrottle sends SetNodeThrottleProperties (0x2c) with no key and the
// JSON body, and returns the response body on success. A failure status is a
// *StatusError whose Reason is the server's explanation.
func (c *Client) SetNodeThrottle(body []byte) ([]byte, error) {
	return c.admin(Request{Opcode: mc.OpSetNodeThrottleProperties, Value: body})
}

func (c *Client) admin(r Request) ([]byte, error) {
	resp, err := c.Do(r)
	if err != nil {
		return nil, err
	}
	if err := resp.Err(); err != nil {
		return nil, err
	}
	return resp.Value, nil
}

// NodeStats is the node part of the STAT group "throttle". In fleet mode
// these are the fleet's limits.
type NodeStats struct {
	Capacity throttle.Limit // node:capacity
	FreePool throttle.Limit // node:free_pool
	// FreePoolMode is node:free_pool_mode, how the free pool is shared:
	// "fcfs" or "fair" ("" when absent: proxies that predate it omit it).
	FreePoolMode string
}

// FleetStats is the fleet part of the STAT group "throttle", present only
// when the proxy runs in fleet mode (DESIGN.md section 10).
type FleetStats struct {
	Instance  string // fleet:instance: this instance's name
	StoreUp   bool   // fleet:store_up: the last exchange with the store succeeded
	Fallback  bool   // fleet:fallback: the store is lost long enough that on_store_loss applies
	Instances int    // fleet:instances: instances alive at the last contact
	// This instance's shares of the node limits, in units/s.
	LocalCapacity throttle.Limit // node:local_capacity
	LocalFreePool throttle.Limit // node:local_free_pool
}

// BucketStats is one bucket of the STAT group "throttle" (the keys
// bucket:NAME:FIELD).
type BucketStats struct {
	Name            string
	Reserved        throttle.Limit // reserved
	HardLimit       throttle.Limit // hard_limit
	Weight          uint64         // weight: of the bucket's share of the free pool in fair mode (0 when absent)
	HasWeight       bool           // whether weight was present (proxies that predate weights omit it)
	UnitsPerSec     uint64         // units_per_sec: units charged over the last second
	UnitsTotal      uint64         // units_total
	ReadUnitsTotal  uint64         // read_units_total
	WriteUnitsTotal uint64         // write_units_total
	CommandsTotal   uint64         // commands_total
	ThrottledTotal  uint64         // throttled_total: commands held
	RejectedTotal   uint64         // rejected_total: non-blocking rejections
	HeldSessions    uint64         // held_sessions: connections held right now
	Connections     uint64         // connections

	// Fleet mode only (zero otherwise). Reserved and HardLimit above are
	// then the fleet's limits; UnitsPerSec stays this instance's usage.
	LocalReserved    throttle.Limit // local_reserved: this instance's share of Reserved
	LocalHardLimit   throttle.Limit // local_hard_limit: this instance's share of HardLimit
	FleetUnitsPerSec uint64         // fleet_units_per_sec: the fleet's usage over the last grant period
	HasFleetUnits    bool           // whether fleet_units_per_sec was present (it is not until known)
}

// ThrottleStats is the parsed STAT group "throttle".
type ThrottleStats struct {
	Node NodeStats
	// Fleet is nil outside fleet mode (no fleet:* key).
	Fleet *FleetStats
	// Buckets in the order of their first key in the response.
	Buckets []BucketStats
}

// Bucket returns the stats of the named bucket.
func (t *ThrottleStats) Bucket(name string) (BucketStats, bool) {
	for _, b := range t.Buckets {
		if b.Name == name {
			return b, true
		}
	}
	return BucketStats{}, false
}

// bucketFields lists the fields a bucket reports, with where each one is
// stored. Every bucket must report the fields that are neither fleet nor
// optional; in fleet mode also the fleet ones that are not optional;
// outside it no fleet one.
var bucketFields = []struct {
	name     string
	limit    func(*BucketStats) *throttle.Limit
	count    func(*BucketStats) *uint64
	fleet    bool
	optional bool
}{
	{name: "reserved", limit: func(b *BucketStats) *throttle.Limit { return &b.Reserved }},
	{name: "hard_limit", limit: func(b *BucketStats) *throttle.Limit { return &b.HardLimit }},
	{name: "weight", count: func(b *BucketStats) *uint64 { return &b.Weight }, optional: true},
	{name: "units_per_sec", count: func(b *BucketStats) *uint64 { return &b.UnitsPerSec }},
	{name: "units_total", count: func(b *BucketStats) *uint64 { return &b.UnitsTotal }},
	{name: "read_units_total", count: func(b *BucketStats) *uint64 { return &b.ReadUnitsTotal }},
	{name: "write_units_total", count: func(b *BucketStats) *uint64 { return &b.WriteUnitsTotal }},
	{name: "commands_total", count: func(b *BucketStats) *uint64 { return &b.CommandsTotal }},
	{name: "throttled_total", count: func(b *BucketStats) *uint64 { return &b.ThrottledTotal }},
	{name: "rejected_total", count: func(b *BucketStats) *uint64 { return &b.RejectedTotal }},
	{name: "held_sessions", count: func(b *BucketStats) *uint64 { return &b.HeldSessions }},
	{name: "connections", count: func(b *BucketStats) *uint64 { return &b.Connections }},
	{name: "local_reserved", limit: func(b *BucketStats) *throttle.Limit { return &b.LocalReserved }, fleet: true},
	{name: "local_hard_limit", limit: func(b *BucketStats) *throttle.Limit { return &b.LocalHardLimit }, fleet: true},
	{name: "fleet_units_per_sec", count: func(b *BucketStats) *uint64 { return &b.FleetUnitsPerSec }, fleet: true, optional: true},
}

// fleetNodeKeys lists the node-level keys of fleet mode: all present or
// none.
var fleetNodeKeys = []string{
	"fleet:instance", "fleet:store_up", "fleet:fallback", "fleet:instances",
	"node:local_capacity", "node:local_free_pool",
}

// ParseThrottleStats parses the key/value pairs of the STAT group
// "throttle" (as returned by Stats("throttle")):
//
//	node:capacity              N | "unlimited"
//	node:free_pool             N | "unlimited"
//	node:free_pool_mode        "fcfs" | "fair" | another word (optional)
//	bucket:B:reserved          N | "unlimited"
//	bucket:B:hard_limit        N | "unlimited"
//	bucket:B:weight            N   (optional: 1..10000, absent from older proxies)
//	bucket:B:units_per_sec     N   (units over the last second)
//	bucket:B:units_total       N
//	bucket:B:read_units_total  N
//	bucket:B:write_units_total N
//	bucket:B:commands_total    N
//	bucket:B:throttled_total   N
//	bucket:B:rejected_total    N
//	bucket:B:held_sessions     N
//	bucket:B:connections       N
//
// and in fleet mode (DESIGN.md section 10) also, into ThrottleStats.Fleet
// and the Local and Fleet fields of each bucket:
//
//	fleet:instance                 NAME (not empty)
//	fleet:store_up                 "true" | "false"
//	fleet:fallback                 "true" | "false"
//	fleet:instances                N
//	node:local_capacity            N | "unlimited"
//	node:local_free_pool           N | "unlimited"
//	bucket:B:local_reserved        N | "unlimited"
//	bucket:B:local_hard_limit      N | "unlimited"
//	bucket:B:fleet_units_per_sec   N   (optional: absent until known)
//
// N is ASCII decimal. It is strict, so that the proxy's tests can use it to
// check the contract: both node keys and every field of every bucket must be
// present exactly once, limits must parse with [throttle.ParseLimit], and
// bucket names must pass [bucketcfg.CheckBucketName]. The six fleet node
// keys come all together or not at all; with them every bucket must also
// carry local_reserved and local_hard_limit, without them no bucket may
// carry a fleet field. Keys with other prefixes (other fleet:* keys
// included) and unknown fields of a bucket are ignored (the contract may
// grow).
func ParseThrottleStats(kv [][2]string) (ThrottleStats, error) {
	var ts ThrottleStats
	var haveCap, haveFree bool
	var fl FleetStats
	fleetSeen := map[string]bool{}
	index := map[string]int{}     // bucket name -> position in ts.Buckets
	seen := map[string]struct{}{} // full keys, to refuse duplicates
	fieldIdx := map[string]int{}  // field name -> position in bucketFields
	for i, f := range bucketFields {
		fieldIdx[f.name] = i
	}
	counts := [][]int{} // per bucket, per field: occurrences
	for _, p := range kv {
		key, val := p[0], p[1]
		if _, dup := seen[key]; dup {
			return ThrottleStats{}, fmt.Errorf("throttle stats: duplicate key %q", key)
		}
		seen[key] = struct{}{}
		switch {
		case key == "node:capacity" || key == "node:free_pool":
			l, err := throttle.ParseLimit(val)
			if err != nil {
				return ThrottleStats{}, fmt.Errorf("throttle stats: %s: %v", key, err)
			}
			if key == "node:capacity" {
				ts.Node.Capacity, haveCap = l, true
			} else {
				ts.Node.FreePool, haveFree = l, true
			}
		case key == "node:free_pool_mode":
			if val == "" {
				return ThrottleStats{}, fmt.Errorf("throttle stats: %s is empty", key)
			}
			ts.Node.FreePoolMode = val
		case key == "node:local_capacity" || key == "node:local_free_pool":
			l, err := throttle.ParseLimit(val)
			if err != nil {
				return ThrottleStats{}, fmt.Errorf("throttle stats: %s: %v", key, err)
			}
			if key == "node:local_capacity" {
				fl.LocalCapacity = l
			} else {
				fl.LocalFreePool = l
			}
			fleetSeen[key] = true
		case key == "fleet:instance":
			if val == "" {
				return ThrottleStats{}, fmt.Errorf("throttle stats: %s is empty", key)
			}
			fl.Instance = val
			fleetSeen[key] = true
		case key == "fleet:store_up" || key == "fleet:fallback":
			var b bool
			switch val {
			case "true":
				b = true
			case "false":
			default:
				return ThrottleStats{}, fmt.Errorf("throttle stats: %s: want true or false, got %q", key, val)
			}
			if key == "fleet:store_up" {
				fl.StoreUp = b
			} else {
				fl.Fallback = b
			}
			fleetSeen[key] = true
		case key == "fleet:instances":
			n, err := parseCount(val)
			if err != nil || n > math.MaxInt32 {
				return ThrottleStats{}, fmt.Errorf("throttle stats: %s: want a decimal number, got %q", key, val)
			}
			fl.Instances = int(n)
			fleetSeen[key] = true
		case strings.HasPrefix(key, "bucket:"):
			rest := key[len("bucket:"):]
			colon := strings.LastIndexByte(rest, ':')
			if colon < 0 {
				return ThrottleStats{}, fmt.Errorf("throttle stats: key %q: want bucket:NAME:FIELD", key)
			}
			name, field := rest[:colon], rest[colon+1:]
			if err := bucketcfg.CheckBucketName(name); err != nil {
				return ThrottleStats{}, fmt.Errorf("throttle stats: key %q: %w", key, err)
			}
			fi, known := fieldIdx[field]
			if !known {
				continue
			}
			bi, ok := index[name]
			if !ok {
				bi = len(ts.Buckets)
				index[name] = bi
				ts.Buckets = append(ts.Buckets, BucketStats{Name: name})
				counts = append(counts, make([]int, len(bucketFields)))
			}
			b := &ts.Buckets[bi]
			f := bucketFields[fi]
			if f.limit != nil {
				l, err := throttle.ParseLimit(val)
				if err != nil {
					return ThrottleStats{}, fmt.Errorf("throttle stats: %s: %v", key, err)
				}
				*f.limit(b) = l
			} else {
				n, err := parseCount(val)
				if err != nil {
					return ThrottleStats{}, fmt.Errorf("throttle stats: %s: want a decimal number, got %q", key, val)
				}
				*f.count(b) = n
				switch field {
				case "fleet_units_per_sec":
					b.HasFleetUnits = true
				case "weight":
					if n == 0 {
						return ThrottleStats{}, fmt.Errorf("throttle stats: %s: a weight is at least 1, got 0", key)
					}
					b.HasWeight = true
				}
			}
			counts[bi][fi]++
		}
	}
	if !haveCap {
		return ThrottleStats{}, errors.New("throttle stats: missing node:capacity")
	}
	if !haveFree {
		return ThrottleStats{}, errors.New("throttle stats: missing node:free_pool")
	}
	fleetMode := len(fleetSeen) > 0
	if fleetMode {
		var missing []string
		for _, k := range fleetNodeKeys {
			if !fleetSeen[k] {
				missing = append(missing, k)
			}
		}
		if len(missing) > 0 {
			return ThrottleStats{}, fmt.Errorf("throttle stats: fleet mode but missing %s", strings.Join(missing, ", "))
		}
		ts.Fleet = &fl
	}
	for bi, b := range ts.Buckets {
		var missing []string
		for fi, f := range bucketFields {
			switch {
			case f.fleet && !fleetMode && counts[bi][fi] > 0:
				return ThrottleStats{}, fmt.Errorf("throttle stats: bucket %q has the fleet field %s without the fleet:* node keys", b.Name, f.name)
			case counts[bi][fi] == 0 && !f.optional && (!f.fleet || fleetMode):
				missing = append(missing, f.name)
			}
		}
		if len(missing) > 0 {
			return ThrottleStats{}, fmt.Errorf("throttle stats: bucket %q lacks %s", b.Name, strings.Join(missing, ", "))
		}
	}
	return ts, nil
}

// parseCount parses plain ASCII decimal digits (no sign, no spaces).
func parseCount(s string) (uint64, error) {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseUint(s, 10, 64)
}
