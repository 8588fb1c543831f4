package bucketcfg

import (
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// Bounds of the numeric settings. They are deliberately generous: they only
// catch typos and values that would make the proxy misbehave.
const (
	// MinFrameBytes is the smallest accepted proxy.max_frame_bytes: one
	// memcached binary header.
	MinFrameBytes = 24
	// MaxFrameBytesLimit is the largest accepted proxy.max_frame_bytes and
	// proxy.max_held_input_bytes (1 GiB, memcached's own largest item size).
	MaxFrameBytesLimit = 1 << 30
	// MaxConnectionsLimit is the largest accepted proxy.max_connections.
	MaxConnectionsLimit = 1 << 20
	// MaxInflightLimit is the largest accepted upstream.max_inflight.
	MaxInflightLimit = 1 << 20
	// MaxUnitSize is the largest accepted read_unit_size / write_unit_size.
	MaxUnitSize = 1 << 30
	// MaxBurstMS is the largest accepted throttle.burst_ms (one minute).
	MaxBurstMS = 60_000
	// MaxUpstreamTimeout is the largest accepted upstream.timeout.
	MaxUpstreamTimeout = 10 * time.Minute
	// MaxBucketNameLen is the longest accepted bucket name, in bytes.
	MaxBucketNameLen = 100
	// MaxUserNameLen is the longest accepted user name, in bytes.
	MaxUserNameLen = 128
	// MinConnTimeout is the shortest accepted proxy.auth_timeout and
	// proxy.idle_timeout other than 0 (which means "never").
	MinConnTimeout = 10 * time.Millisecond
	// MaxConnTimeout is the longest accepted proxy.auth_timeout and
	// proxy.idle_timeout (30 days).
	MaxConnTimeout = 30 * 24 * time.Hour
	// MinUnsentBytes is the smallest accepted proxy.max_unsent_bytes (1 MiB).
	MinUnsentBytes = 1 << 20
	// MaxUnsentBytesLimit is the largest accepted proxy.max_unsent_bytes (1 TiB).
	MaxUnsentBytesLimit = 1 << 40
	// MaxBucketWeight is the largest accepted [[bucket]] weight and 0x2a
	// "weight" (the smallest is 1).
	MaxBucketWeight = throttle.MaxWeight
)

// freePoolModes are the throttle.free_pool values this build accepts, the
// first being the default.
var freePoolModes = []throttle.FreePoolMode{throttle.FreePoolFCFS, throttle.FreePoolFair}

// FreePoolModes returns the throttle.free_pool modes this build accepts, the
// default first (a fresh slice).
func FreePoolModes() []throttle.FreePoolMode {
	return append([]throttle.FreePoolMode(nil), freePoolModes...)
}

// Default values of every optional key; they are the example values of
// DESIGN.md section 6 (plus the documented defaults of the added keys).
const (
	defaultListen            = "127.0.0.1:11311"
	defaultDefaultBucket     = "default"
	defaultMaxConnections    = 10000
	defaultMaxFrameBytes     = 22020096  // 21 MiB
	defaultMaxHeldInputBytes = 256 << 10 // 256 KiB
	defaultAuthTimeout       = 10 * time.Second
	defaultIdleTimeout       = 0         // never
	defaultMaxUnsentBytes    = 256 << 20 // 256 MiB
	defaultUpstreamServer    = "127.0.0.1:11211"
	defaultUpstreamTimeout   = 2 * time.Second
	defaultMaxInflight       = 4096
	defaultCapacity          = 25000
	defaultUnitSize          = 4096
	defaultStateFile         = "kvthrottle-state.json"
	defaultBurstMS           = 100
	defaultMetricsListen     = "127.0.0.1:9150"
	defaultLogLevel          = "info"
	defaultLogFormat         = "json"
)

// Config is a validated kvthrottle configuration file (DESIGN.md section 6).
//
// Every missing key takes the example value of DESIGN.md section 6; the
// defaults are given on each field. A file without any [[bucket]] table gets
// the single bucket "default" of the example (reserved and hard limit from
// the node defaults, flush disabled); a file with `bucket = []` has no bucket.
// There is no default user.
//
// Throttle values in a Config returned by [Load] or [Parse] come from the
// file alone; [Effective] returns the Config in force once the runtime state
// file is applied. A Config must not be modified after it is returned: share
// it read-only and build a new one (Load, Effective) to change anything.
type Config struct {
	Proxy    ProxyConfig
	Upstream UpstreamConfig
	Throttle ThrottleConfig
	Metrics  MetricsConfig
	Log      LogConfig
	Fleet    FleetConfig
	TLS      TLSConfig // [tls] (tls.go)
	// Listeners are the [[listener]] tables in file order: further client
	// addresses, each binding its connections to one bucket.
	Listeners []Listener
	// Buckets in file order; names are unique.
	Buckets []Bucket
	// Users in file order; names are unique.
	Users []User

	path        string
	fileNode    fileNode // throttle values as written in the file
	bucketIndex map[string]int
	userIndex   map[string]int
	auth        *authState
}

// fileNode keeps the node throttle values of the file so that [Effective]
// can always start again from them.
type fileNode struct {
	capacity throttle.Limit
	defaults BucketThrottle
}

// ProxyConfig is the [proxy] table.
type ProxyConfig struct {
	// Listen is the client address, host:port (key listen, default
	// "127.0.0.1:11311"). An empty host means every interface; port 0 picks
	// a free port.
	Listen string
	// DefaultBucket is the bucket of connections that never authenticate
	// (key default_bucket, default "default"); "" means authentication is
	// required. When not empty it names a bucket of Buckets.
	DefaultBucket string
	// MaxConnections bounds the number of client connections (key
	// max_connections, default 10000, 1..MaxConnectionsLimit).
	MaxConnections int
	// MaxFrameBytes bounds the size of one frame, header included (key
	// max_frame_bytes, default 22020096 = 21 MiB,
	// MinFrameBytes..MaxFrameBytesLimit).
	MaxFrameBytes int
	// MaxHeldInputBytes bounds the input buffered for one held (throttled)
	// or otherwise paused session (key max_held_input_bytes, default 256
	// KiB, MinFrameBytes..MaxFrameBytesLimit): past it the proxy stops
	// reading the client until the session runs again (back-pressure),
	// it does not close it, so the rest of what the client sends waits in
	// the kernel's socket buffers, not in the proxy's memory. It may be
	// smaller than MaxFrameBytes: a larger frame is read whole once the
	// session runs.
	MaxHeldInputBytes int
	// AuthTimeout is how long a connection that must authenticate
	// (DefaultBucket "") may stay open without authenticating; it is then
	// closed (key auth_timeout, a Go duration string, default "10s"; "0s"
	// means never, otherwise MinConnTimeout..MaxConnTimeout). Connections
	// on the default bucket do not need to authenticate and are not timed.
	AuthTimeout time.Duration
	// IdleTimeout closes a connection that has neither sent anything nor
	// been answered for this long, and has no command in flight, no input
	// waiting and no response unsent (key idle_timeout, a Go duration string, default "0s" =
	// never, otherwise MinConnTimeout..MaxConnTimeout).
	IdleTimeout time.Duration
	// MaxUnsentBytes bounds the response bytes the proxy holds for all
	// clients together that the clients have not read yet (key
	// max_unsent_bytes, default 268435456 = 256 MiB,
	// MinUnsentBytes..MaxUnsentBytesLimit). Past it, the connections
	// holding the most are closed (see the proxy package).
	MaxUnsentBytes int64
	// PlainAuth says on which connections SASL PLAIN, and memcached's text
	// authentication (which also sends the password itself), is allowed
	// (key plain_auth, default "tls-or-loopback"); elsewhere it is refused
	// (SCRAM is allowed everywhere). Read at each authentication: a
	// reload applies to the next.
	PlainAuth PlainAuthPolicy
}

// PlainAuthPolicy is a proxy.plain_auth value.
type PlainAuthPolicy string

// The proxy.plain_auth values.
const (
	// PlainTLSOrLoopback allows PLAIN over TLS and from the loopback
	// addresses 127.0.0.1 and ::1 (the default).
	PlainTLSOrLoopback PlainAuthPolicy = "tls-or-loopback"
	// PlainTLSOnly allows PLAIN over TLS only.
	PlainTLSOnly PlainAuthPolicy = "tls-only"
	// PlainAnywhere allows PLAIN on every connection (passwords cross the
	// network in clear on the plaintext listeners).
	PlainAnywhere PlainAuthPolicy = "anywhere"
)

// UpstreamConfig is the [upstream] table.
type UpstreamConfig struct {
	// Servers are the memcached servers, host:port each, at least one,
	// no duplicates, port 1..65535 (key servers, default
	// ["127.0.0.1:11211"]).
	Servers []string
	// Timeout is the upstream request timeout (key timeout, a Go duration
	// string such as "2s" or "500ms", default "2s", > 0 and at most
	// MaxUpstreamTimeout).
	Timeout time.Duration
	// MaxInflight bounds in-flight requests per upstream connection (key
	// max_inflight, default 4096, 1..MaxInflightLimit).
	MaxInflight int
	// Weights are the servers' ketama weights, one per server, 1..
	// MaxServerWeight (key weights, default: all 1). Nil means equal.
	Weights []int
	// EjectAfterFailures ejects a server after this many failed health
	// probes or connection losses in a row; its keys go to the other
	// servers until it answers again after EjectRetry (key
	// eject_after_failures, default 0 = never eject).
	EjectAfterFailures int
	// EjectRetry is how long an ejected server stays out before it is
	// probed again (key eject_retry, a duration, default "30s", 100ms..1h).
	EjectRetry time.Duration
	// ConnsPerBucket gives each bucket its own upstream connections on
	// each event loop (one per server), so a tenant's large responses
	// never stand ahead of another tenant's on a connection; false shares
	// one connection per server per loop among all buckets (key
	// conns_per_bucket, default true). Read at start; a reload does not
	// change it.
	ConnsPerBucket bool
	// TLS is the [upstream.tls] table (upstreamtls.go).
	TLS UpstreamTLSConfig
}

// ThrottleConfig is the [throttle] table.
type ThrottleConfig struct {
	// Capacity is the node capacity (key capacity, default 25000).
	Capacity throttle.Limit
	// Defaults are the limits of buckets that do not set their own (keys
	// default_throttle_reserved_units, default 0, and
	// default_throttle_hard_limit, default "unlimited"); Reserved <= HardLimit.
	Defaults BucketThrottle
	// ReadUnitSize is the bytes per read unit (key read_unit_size, default
	// 4096, 1..MaxUnitSize).
	ReadUnitSize int
	// WriteUnitSize is the bytes per write unit (key write_unit_size, default
	// 4096, 1..MaxUnitSize).
	WriteUnitSize int
	// StateFile is where runtime throttle changes are persisted (key
	// state_file, default "kvthrottle-state.json", not empty). [Load]
	// resolves a relative path against the directory of the configuration
	// file; [Parse] leaves it as written (relative to the working directory).
	StateFile string
	// Burst is how much unused rate a bucket or the free pool may bank while
	// idle, expressed as time at that rate (key burst_ms, an integer number
	// of milliseconds, default 100, 0..MaxBurstMS). 0 means no banking.
	Burst time.Duration
	// MaxHold is the longest a command may be held by the throttle (key
	// max_hold, a duration, default "0s", at most MaxMaxHold): a command
	// whose wait would exceed it is answered Etmpfail at once. 0 holds as
	// long as needed.
	MaxHold time.Duration
	// FreePool is how the free pool is shared among the buckets that want
	// more than their reservation (key free_pool, "fcfs" or "fair", default
	// "fcfs"; DESIGN.md section 13); one of FreePoolModes. A reload may
	// change it; it applies at once.
	FreePool throttle.FreePoolMode
	// MaxItemBytes is the largest value the memcached servers store
	// (memcached -I; key max_item_bytes, default 1048576,
	// 1..MaxFrameBytesLimit): the largest class of a bucket's read
	// ceiling (throttle.ReadCost), where it starts when the servers hold
	// items and no class is saved.
	MaxItemBytes int
}

// MetricsConfig is the [metrics] table.
type MetricsConfig struct {
	// Listen is the address of the Prometheus endpoint /metrics, host:port
	// (key listen, default "127.0.0.1:9150"). "" disables the endpoint.
	Listen string
}

// Listener is one [[listener]] table: a client address whose connections
// belong to a bucket without authenticating (for networks where where a
// client connects from says who it is). They may still authenticate with
// SASL, and then land in their user's bucket as anywhere else. Read at
// start; a reload must keep the listeners as they are.
type Listener struct {
	// Listen is the address, host:port with a port other than 0 (key
	// listen); unique, and not proxy.listen. An empty host means every
	// interface.
	Listen string
	// Bucket names the [[bucket]] its connections use (key bucket).
	Bucket string
}

// FleetConfig is the [fleet] table (DESIGN.md section 10): limits that hold
// for a fleet of instances sharing a Redis store. Read at start; a reload
// does not change it.
type FleetConfig struct {
	// RedisURL is the store, "redis://host:port/db" or "rediss://..." for
	// TLS (key redis_url, default "": a single instance, no store).
	RedisURL string
	// Name names the fleet in the store, so that several fleets may share
	// one Redis (key name, default "default"; the characters of a bucket
	// name, at most 100 bytes).
	Name string
	// Instance names this instance in the fleet (key instance, default ""
	// meaning the host name and proxy.listen, joined by '/'); unique in the
	// fleet, printable ASCII without spaces or '|'.
	Instance string
	// GrantPeriod is how often the instance reports to the store and how
	// long a grant lasts (key grant_period, default "1s", 100ms..1m).
	GrantPeriod time.Duration
	// OnStoreLoss is "share" (once the store is lost for 3 periods, each
	// fleet limit divided by the instances alive at the last contact) or
	// "open" (the fleet limits, as a lone instance) (key on_store_loss,
	// default "share").
	OnStoreLoss string
}

// LogConfig is the [log] table.
type LogConfig struct {
	// Level is a zerolog level name: trace, debug, info, warn, error,
	// fatal, panic or disabled (key level, default "info").
	Level string
	// Format is "json" or "console" (key format, default "json").
	Format string
}

// Bucket is one [[bucket]] table: a tenant.
type Bucket struct {
	// Name is unique, 1..MaxBucketNameLen bytes of [A-Za-z0-9._%-].
	Name string
	// Throttle holds the limits in force: for a Config from Load or Parse,
	// the file's reserved / hard_limit, each missing one taken from the
	// [throttle] defaults; for a Config from Effective, the state file's
	// entry for this bucket when there is one, else the same resolution
	// with the effective defaults. Always valid (Reserved <= HardLimit).
	Throttle BucketThrottle
	// FlushEnabled allows FLUSH on this bucket (key flush_enabled, default
	// false).
	FlushEnabled bool
	// ReservedSet and HardLimitSet report whether the file set reserved and
	// hard_limit explicitly for this bucket; unset ones follow the node
	// defaults.
	ReservedSet, HardLimitSet bool
	// Weight is the weight of the bucket's share of the free pool in fair
	// mode (no effect in fcfs mode), an integer from 1 to MaxBucketWeight:
	// for a Config from Load or Parse the file's (key weight, default 1);
	// for a Config from Effective the state file's when it has one for
	// this bucket (set with 0x2a "weight"), else the file's.
	Weight int
	// WeightSet reports whether the file set weight for this bucket.
	WeightSet bool

	file       BucketThrottle // the file's values (meaningful where *Set)
	fileWeight int            // the file's weight (1 when not set)
}

// Path returns the file the Config was loaded from ("" after [Parse]).
func (c *Config) Path() string { return c.path }

// BucketNames returns the names of the configured buckets, in file order.
func (c *Config) BucketNames() []string {
	names := make([]string, len(c.Buckets))
	for i, b := range c.Buckets {
		names[i] = b.Name
	}
	return names
}

// Bucket returns the bucket called name, or nil when there is none. The
// result points into c and must not be modified.
func (c *Config) Bucket(name string) *Bucket {
	if i, ok := c.bucketIndex[name]; ok {
		return &c.Buckets[i]
	}
	return nil
}

// User returns the user called name, or nil when there is none. The result
// points into c and must not be modified. Use [Config.Authenticate] to check
// a password.
func (c *Config) User(name string) *User {
	if i, ok := c.userIndex[name]; ok {
		return &c.Users[i]
	}
	return nil
}

// clone returns a copy of c whose slices and indexes are not shared with c
// (users are immutable and shared through the auth state).
func (c *Config) clone() *Config {
	n := *c
	n.Upstream.Servers = append([]string(nil), c.Upstream.Servers...)
	n.Buckets = append([]Bucket(nil), c.Buckets...)
	n.Users = append([]User(nil), c.Users...)
	return &n
}
