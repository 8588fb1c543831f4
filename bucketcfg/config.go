package bucketcfg

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
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
)

// Default values of every optional key; they are the example values of
// DESIGN.md section 6 (plus the documented defaults of the added keys).
const (
	defaultListen            = "127.0.0.1:11311"
	defaultDefaultBucket     = "default"
	defaultMaxConnections    = 10000
	defaultMaxFrameBytes     = 22020096 // 21 MiB
	defaultMaxHeldInputBytes = 4 << 20  // 4 MiB
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
	capacity Limit
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
	// session (key max_held_input_bytes, default 4 MiB,
	// MinFrameBytes..MaxFrameBytesLimit). It may be smaller than
	// MaxFrameBytes: the proxy decides how a larger frame is handled.
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
}

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
}

// ThrottleConfig is the [throttle] table.
type ThrottleConfig struct {
	// Capacity is the node capacity (key capacity, default 25000).
	Capacity Limit
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
	// MaxItemBytes is the largest value the memcached servers store
	// (memcached -I; key max_item_bytes, default 1048576,
	// 1..MaxFrameBytesLimit): a read of unknown size is budgeted as this
	// large until the bucket's reads are known.
	MaxItemBytes int
}

// MetricsConfig is the [metrics] table.
type MetricsConfig struct {
	// Listen is the address of the Prometheus endpoint /metrics, host:port
	// (key listen, default "127.0.0.1:9150"). "" disables the endpoint.
	Listen string
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

	file BucketThrottle // the file's values (meaningful where *Set)
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

// ConfigError reports every problem found in a configuration file. Each
// problem names its key, for example
// `throttle.capacity: must be a non-negative integer or "unlimited", got "lots"`
// or `bucket "b1": reserved 10 exceeds hard_limit 5`.
type ConfigError struct {
	// Path is the file name, "" when the data came from [Parse].
	Path string
	// Problems holds one error per problem, in file order where possible.
	Problems []error
}

// Error lists the problems, one per line after the first.
func (e *ConfigError) Error() string {
	var b strings.Builder
	b.WriteString("config")
	if e.Path != "" {
		b.WriteString(" " + e.Path)
	}
	switch len(e.Problems) {
	case 0:
		b.WriteString(": invalid")
	case 1:
		b.WriteString(": " + e.Problems[0].Error())
	default:
		fmt.Fprintf(&b, ": %d problems:", len(e.Problems))
		for _, p := range e.Problems {
			b.WriteString("\n\t" + p.Error())
		}
	}
	return b.String()
}

// Unwrap returns the problems, for errors.Is and errors.As.
func (e *ConfigError) Unwrap() []error { return e.Problems }

// Load reads and validates the TOML configuration file at path (see [Parse]
// for the rules). A relative throttle.state_file is resolved against the
// directory of path. Every error is a *ConfigError naming path; a missing
// or unreadable file keeps its *fs.PathError in Problems.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &ConfigError{Path: path, Problems: []error{err}}
	}
	cfg, err := parse(data)
	if err != nil {
		if ce, ok := err.(*ConfigError); ok {
			ce.Path = path
		}
		return nil, err
	}
	cfg.path = path
	if !filepath.IsAbs(cfg.Throttle.StateFile) {
		cfg.Throttle.StateFile = filepath.Join(filepath.Dir(path), cfg.Throttle.StateFile)
	}
	return cfg, nil
}

// Parse validates a TOML configuration held in memory.
//
// Rules: the document is valid TOML; every key is one of DESIGN.md section 6
// or an added key documented on the Config fields, spelled exactly (an
// unknown or differently-cased key is rejected, naming it); values have the
// documented types and ranges. All problems found are reported together in
// one *ConfigError. The password_hash values are checked to be hashes
// [Config.Authenticate] can verify but never appear in errors.
func Parse(data []byte) (*Config, error) { return parse(data) }

// The TOML shape of the file. Pointers and `any` distinguish a missing key
// from a zero value; Limit-valued keys are `any` so that their errors are
// reported by this package with the key name, like every other value error.
type tomlFile struct {
	Proxy    tomlProxy    `toml:"proxy"`
	Upstream tomlUpstream `toml:"upstream"`
	Throttle tomlThrottle `toml:"throttle"`
	Metrics  tomlMetrics  `toml:"metrics"`
	Log      tomlLog      `toml:"log"`
	Bucket   []tomlBucket `toml:"bucket"`
	User     []tomlUser   `toml:"user"`
}

type tomlProxy struct {
	Listen            *string `toml:"listen"`
	DefaultBucket     *string `toml:"default_bucket"`
	MaxConnections    *int64  `toml:"max_connections"`
	MaxFrameBytes     *int64  `toml:"max_frame_bytes"`
	MaxHeldInputBytes *int64  `toml:"max_held_input_bytes"`
	AuthTimeout       *string `toml:"auth_timeout"`
	IdleTimeout       *string `toml:"idle_timeout"`
	MaxUnsentBytes    *int64  `toml:"max_unsent_bytes"`
}

type tomlUpstream struct {
	Servers            *[]string `toml:"servers"`
	Weights            *[]int64  `toml:"weights"`
	Timeout            *string   `toml:"timeout"`
	MaxInflight        *int64    `toml:"max_inflight"`
	EjectAfterFailures *int64    `toml:"eject_after_failures"`
	EjectRetry         *string   `toml:"eject_retry"`
}

type tomlThrottle struct {
	Capacity         any     `toml:"capacity"`
	DefaultReserved  any     `toml:"default_throttle_reserved_units"`
	DefaultHardLimit any     `toml:"default_throttle_hard_limit"`
	ReadUnitSize     *int64  `toml:"read_unit_size"`
	WriteUnitSize    *int64  `toml:"write_unit_size"`
	StateFile        *string `toml:"state_file"`
	BurstMS          *int64  `toml:"burst_ms"`
	MaxHold          *string `toml:"max_hold"`
	MaxItemBytes     *int64  `toml:"max_item_bytes"`
}

type tomlMetrics struct {
	Listen *string `toml:"listen"`
}

type tomlLog struct {
	Level  *string `toml:"level"`
	Format *string `toml:"format"`
}

type tomlBucket struct {
	Name         *string `toml:"name"`
	Reserved     any     `toml:"reserved"`
	HardLimit    any     `toml:"hard_limit"`
	FlushEnabled *bool   `toml:"flush_enabled"`
}

type tomlUser struct {
	Name         *string   `toml:"name"`
	PasswordHash *string   `toml:"password_hash"`
	Buckets      *[]string `toml:"buckets"`
	Privileges   *[]string `toml:"privileges"`
}

// knownKeys lists every accepted key path (array-of-tables elements share
// their table's path). Keys are compared exactly: BurntSushi/toml matches
// struct fields case-insensitively, so MetaData.Undecoded alone would let
// "Listen" through.
var knownKeys = func() map[string]bool {
	m := map[string]bool{}
	for _, k := range []string{
		"proxy", "proxy.listen", "proxy.default_bucket", "proxy.max_connections",
		"proxy.max_frame_bytes", "proxy.max_held_input_bytes",
		"proxy.auth_timeout", "proxy.idle_timeout", "proxy.max_unsent_bytes",
		"upstream", "upstream.servers", "upstream.timeout", "upstream.max_inflight",
		"upstream.weights", "upstream.eject_after_failures", "upstream.eject_retry",
		"throttle", "throttle.capacity", "throttle.default_throttle_reserved_units",
		"throttle.default_throttle_hard_limit", "throttle.read_unit_size",
		"throttle.write_unit_size", "throttle.state_file", "throttle.burst_ms", "throttle.max_hold", "throttle.max_item_bytes",
		"metrics", "metrics.listen",
		"log", "log.level", "log.format",
		"bucket", "bucket.name", "bucket.reserved", "bucket.hard_limit", "bucket.flush_enabled",
		"user", "user.name", "user.password_hash", "user.buckets", "user.privileges",
	} {
		m[k] = true
	}
	return m
}()

// problems collects validation errors.
type problems []error

func (p *problems) addf(key, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
}

func parse(data []byte) (*Config, error) {
	var raw tomlFile
	md, err := toml.NewDecoder(bytes.NewReader(data)).Decode(&raw)
	if err != nil {
		return nil, &ConfigError{Problems: []error{err}}
	}
	var probs problems

	// Unknown keys first: a misspelt key usually explains the other errors.
	// Undecoded finds keys matching no field; the exact comparison with
	// knownKeys also catches keys that toml matched case-insensitively.
	undecoded := map[string]bool{}
	for _, k := range md.Undecoded() {
		undecoded[k.String()] = true
	}
	reported := map[string]bool{}
	for _, k := range md.Keys() { // file order
		s := k.String()
		if (undecoded[s] || !knownKeys[s]) && !reported[s] {
			reported[s] = true
			probs.addf(s, "unknown key")
		}
	}
	if len(probs) > 0 {
		return nil, &ConfigError{Problems: probs}
	}

	cfg := &Config{}
	buildProxy(&cfg.Proxy, &raw.Proxy, &probs)
	buildUpstream(&cfg.Upstream, &raw.Upstream, &probs)
	buildThrottle(&cfg.Throttle, &raw.Throttle, &probs)
	cfg.fileNode = fileNode{capacity: cfg.Throttle.Capacity, defaults: cfg.Throttle.Defaults}

	cfg.Metrics.Listen = strOr(raw.Metrics.Listen, defaultMetricsListen)
	if cfg.Metrics.Listen != "" {
		checkListen("metrics.listen", cfg.Metrics.Listen, &probs)
	}
	cfg.Log.Level = strOr(raw.Log.Level, defaultLogLevel)
	switch cfg.Log.Level {
	case "trace", "debug", "info", "warn", "error", "fatal", "panic", "disabled":
	default:
		probs.addf("log.level", "must be one of trace, debug, info, warn, error, fatal, panic, disabled; got %s", quoteShort(cfg.Log.Level))
	}
	cfg.Log.Format = strOr(raw.Log.Format, defaultLogFormat)
	if cfg.Log.Format != "json" && cfg.Log.Format != "console" {
		probs.addf("log.format", `must be "json" or "console", got %s`, quoteShort(cfg.Log.Format))
	}

	if md.IsDefined("bucket") {
		buildBuckets(cfg, raw.Bucket, &probs)
	} else {
		cfg.Buckets = []Bucket{{Name: defaultDefaultBucket, Throttle: cfg.Throttle.Defaults}}
	}
	cfg.bucketIndex = make(map[string]int, len(cfg.Buckets))
	for i, b := range cfg.Buckets {
		if _, dup := cfg.bucketIndex[b.Name]; !dup && b.Name != "" {
			cfg.bucketIndex[b.Name] = i
		}
	}

	if raw.Proxy.DefaultBucket == nil {
		cfg.Proxy.DefaultBucket = defaultDefaultBucket
		if cfg.Bucket(defaultDefaultBucket) == nil {
			probs.addf("proxy.default_bucket", `not set, and its default %q is not a [[bucket]]; define that bucket, name another one, or set default_bucket = "" to require authentication`, defaultDefaultBucket)
		}
	} else {
		cfg.Proxy.DefaultBucket = *raw.Proxy.DefaultBucket
		if cfg.Proxy.DefaultBucket != "" && cfg.Bucket(cfg.Proxy.DefaultBucket) == nil {
			probs.addf("proxy.default_bucket", "%s is not a [[bucket]]", quoteShort(cfg.Proxy.DefaultBucket))
		}
	}

	buildUsers(cfg, raw.User, &probs)

	if len(probs) > 0 {
		return nil, &ConfigError{Problems: probs}
	}
	cfg.auth = newAuthState(cfg.Users)
	return cfg, nil
}

func strOr(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

// intIn returns *p (or def when p is nil), reporting a problem when it is
// outside [lo, hi].
func intIn(key string, p *int64, def, lo, hi int64, probs *problems) int {
	v := def
	if p != nil {
		v = *p
	}
	if v < lo || v > hi {
		probs.addf(key, "must be between %d and %d, got %d", lo, hi, v)
		return int(def)
	}
	return int(v)
}

// limitIn returns the Limit of a TOML value (def when v is nil), reporting a
// problem naming key when it is invalid.
func limitIn(key string, v any, def Limit, probs *problems) (Limit, bool) {
	if v == nil {
		return def, false
	}
	l, err := limitFromTOML(v)
	if err != nil {
		probs.addf(key, "%s", err)
		return def, false
	}
	return l, true
}

func buildProxy(p *ProxyConfig, raw *tomlProxy, probs *problems) {
	p.Listen = strOr(raw.Listen, defaultListen)
	checkListen("proxy.listen", p.Listen, probs)
	p.MaxConnections = intIn("proxy.max_connections", raw.MaxConnections, defaultMaxConnections, 1, MaxConnectionsLimit, probs)
	p.MaxFrameBytes = intIn("proxy.max_frame_bytes", raw.MaxFrameBytes, defaultMaxFrameBytes, MinFrameBytes, MaxFrameBytesLimit, probs)
	p.MaxHeldInputBytes = intIn("proxy.max_held_input_bytes", raw.MaxHeldInputBytes, defaultMaxHeldInputBytes, MinFrameBytes, MaxFrameBytesLimit, probs)
	p.AuthTimeout = connTimeout("proxy.auth_timeout", raw.AuthTimeout, defaultAuthTimeout, probs)
	p.IdleTimeout = connTimeout("proxy.idle_timeout", raw.IdleTimeout, defaultIdleTimeout, probs)
	p.MaxUnsentBytes = int64(intIn("proxy.max_unsent_bytes", raw.MaxUnsentBytes, defaultMaxUnsentBytes, MinUnsentBytes, MaxUnsentBytesLimit, probs))
	// DefaultBucket is resolved once the buckets are known.
}

// connTimeout returns the duration *p (def when p is nil), which must be 0
// (never) or within MinConnTimeout..MaxConnTimeout, reporting a problem
// naming key otherwise.
func connTimeout(key string, p *string, def time.Duration, probs *problems) time.Duration {
	if p == nil {
		return def
	}
	d, err := time.ParseDuration(*p)
	switch {
	case err != nil:
		probs.addf(key, `invalid duration %s (write for example "10s", "500ms" or "0s" for never)`, quoteShort(*p))
	case d != 0 && (d < MinConnTimeout || d > MaxConnTimeout):
		probs.addf(key, "must be 0s (never) or from %s to %s, got %s", MinConnTimeout, MaxConnTimeout, d)
	default:
		return d
	}
	return def
}

func buildUpstream(u *UpstreamConfig, raw *tomlUpstream, probs *problems) {
	if raw.Servers == nil {
		u.Servers = []string{defaultUpstreamServer}
	} else {
		u.Servers = append([]string(nil), (*raw.Servers)...)
		if len(u.Servers) == 0 {
			probs.addf("upstream.servers", "must list at least one memcached server (host:port)")
		}
		seen := make(map[string]bool, len(u.Servers))
		for i, s := range u.Servers {
			key := fmt.Sprintf("upstream.servers[%d]", i)
			if err := checkHostPort(s, false, false); err != nil {
				probs.addf(key, "%s", err)
			} else if seen[s] {
				probs.addf(key, "duplicate server %s", quoteShort(s))
			}
			seen[s] = true
		}
	}
	u.Timeout = defaultUpstreamTimeout
	if raw.Timeout != nil {
		d, err := time.ParseDuration(*raw.Timeout)
		switch {
		case err != nil:
			probs.addf("upstream.timeout", `invalid duration %s (write for example "2s" or "500ms")`, quoteShort(*raw.Timeout))
		case d <= 0 || d > MaxUpstreamTimeout:
			probs.addf("upstream.timeout", "must be greater than 0 and at most %s, got %s", MaxUpstreamTimeout, d)
		default:
			u.Timeout = d
		}
	}
	u.MaxInflight = intIn("upstream.max_inflight", raw.MaxInflight, defaultMaxInflight, 1, MaxInflightLimit, probs)
	if raw.Weights != nil {
		if len(*raw.Weights) != len(u.Servers) {
			probs.addf("upstream.weights", "must give one weight per server (%d servers, %d weights)", len(u.Servers), len(*raw.Weights))
		}
		for i, w := range *raw.Weights {
			if w < 1 || w > MaxServerWeight {
				probs.addf(fmt.Sprintf("upstream.weights[%d]", i), "must be an integer from 1 to %d, got %d", MaxServerWeight, w)
			}
			u.Weights = append(u.Weights, int(w))
		}
	}
	u.EjectAfterFailures = intIn("upstream.eject_after_failures", raw.EjectAfterFailures, 0, 0, 1000, probs)
	u.EjectRetry = defaultEjectRetry
	if raw.EjectRetry != nil {
		d, err := time.ParseDuration(*raw.EjectRetry)
		switch {
		case err != nil:
			probs.addf("upstream.eject_retry", `invalid duration %s (write for example "30s")`, quoteShort(*raw.EjectRetry))
		case d < 100*time.Millisecond || d > time.Hour:
			probs.addf("upstream.eject_retry", "must be from 100ms to 1h, got %s", d)
		default:
			u.EjectRetry = d
		}
	}
}

const (
	// MaxServerWeight is the largest upstream.weights entry.
	MaxServerWeight   = 1000
	defaultEjectRetry = 30 * time.Second
)

func buildThrottle(t *ThrottleConfig, raw *tomlThrottle, probs *problems) {
	t.Capacity, _ = limitIn("throttle.capacity", raw.Capacity, UnitsPerSecond(defaultCapacity), probs)
	var okR, okH bool
	t.Defaults.Reserved, okR = limitIn("throttle.default_throttle_reserved_units", raw.DefaultReserved, UnitsPerSecond(0), probs)
	t.Defaults.HardLimit, okH = limitIn("throttle.default_throttle_hard_limit", raw.DefaultHardLimit, Unlimited(), probs)
	if (okR || raw.DefaultReserved == nil) && (okH || raw.DefaultHardLimit == nil) && t.Defaults.Validate() != nil {
		probs.addf("throttle.default_throttle_reserved_units", "%s exceeds default_throttle_hard_limit %s", t.Defaults.Reserved, t.Defaults.HardLimit)
	}
	if t.Defaults.Validate() != nil { // keep the Config invariant even on error paths
		t.Defaults = BucketThrottle{Reserved: UnitsPerSecond(0), HardLimit: Unlimited()}
	}
	t.ReadUnitSize = intIn("throttle.read_unit_size", raw.ReadUnitSize, defaultUnitSize, 1, MaxUnitSize, probs)
	t.WriteUnitSize = intIn("throttle.write_unit_size", raw.WriteUnitSize, defaultUnitSize, 1, MaxUnitSize, probs)
	t.StateFile = strOr(raw.StateFile, defaultStateFile)
	if strings.TrimSpace(t.StateFile) == "" {
		probs.addf("throttle.state_file", "must not be empty")
	} else if strings.ContainsRune(t.StateFile, 0) {
		probs.addf("throttle.state_file", "must not contain a NUL byte")
	}
	t.Burst = time.Duration(intIn("throttle.burst_ms", raw.BurstMS, defaultBurstMS, 0, MaxBurstMS, probs)) * time.Millisecond
	if raw.MaxHold != nil {
		d, err := time.ParseDuration(*raw.MaxHold)
		switch {
		case err != nil:
			probs.addf("throttle.max_hold", `invalid duration %s (write for example "500ms"; "0s" holds as long as needed)`, quoteShort(*raw.MaxHold))
		case d < 0 || d > MaxMaxHold:
			probs.addf("throttle.max_hold", "must be from 0s to %s, got %s", MaxMaxHold, d)
		default:
			t.MaxHold = d
		}
	}
	t.MaxItemBytes = intIn("throttle.max_item_bytes", raw.MaxItemBytes, defaultMaxItemBytes, 1, MaxFrameBytesLimit, probs)
}

const (
	// MaxMaxHold is the largest accepted throttle.max_hold.
	MaxMaxHold          = time.Hour
	defaultMaxItemBytes = 1 << 20 // memcached's default -I
)

func buildBuckets(cfg *Config, raws []tomlBucket, probs *problems) {
	cfg.Buckets = make([]Bucket, 0, len(raws))
	seen := make(map[string]bool, len(raws))
	for i, rb := range raws {
		b := Bucket{}
		label := fmt.Sprintf("bucket[%d]", i)
		if rb.Name == nil {
			probs.addf(label+".name", "missing")
		} else if err := CheckBucketName(*rb.Name); err != nil {
			probs.addf(label+".name", "%s", err)
		} else {
			b.Name = *rb.Name
			label = fmt.Sprintf("bucket %q", b.Name)
			if seen[b.Name] {
				probs.addf(label, "defined more than once")
			}
			seen[b.Name] = true
		}
		var okR, okH bool
		b.file.Reserved, okR = limitIn(label+": reserved", rb.Reserved, Limit{}, probs)
		b.file.HardLimit, okH = limitIn(label+": hard_limit", rb.HardLimit, Limit{}, probs)
		b.ReservedSet, b.HardLimitSet = okR, okH
		if rb.FlushEnabled != nil {
			b.FlushEnabled = *rb.FlushEnabled
		}
		badLimit := (rb.Reserved != nil && !okR) || (rb.HardLimit != nil && !okH)
		if !badLimit {
			if err := b.resolve(cfg.Throttle.Defaults); err != nil {
				probs.addf(label, "%s", err)
			}
		}
		cfg.Buckets = append(cfg.Buckets, b)
	}
}

// resolve sets b.Throttle from the file's explicit values and the given node
// defaults for the others.
func (b *Bucket) resolve(defaults BucketThrottle) error {
	t := defaults
	if b.ReservedSet {
		t.Reserved = b.file.Reserved
	}
	if b.HardLimitSet {
		t.HardLimit = b.file.HardLimit
	}
	if t.Validate() != nil {
		switch {
		case b.ReservedSet && b.HardLimitSet:
			return t.Validate()
		case b.ReservedSet:
			return fmt.Errorf("reserved %s exceeds hard_limit %s (hard_limit not set: the default_throttle_hard_limit applies)", t.Reserved, t.HardLimit)
		default:
			return fmt.Errorf("reserved %s exceeds hard_limit %s (reserved not set: the default_throttle_reserved_units applies)", t.Reserved, t.HardLimit)
		}
	}
	b.Throttle = t
	return nil
}

// CheckBucketName returns an error when name is not a valid bucket name:
// 1..MaxBucketNameLen bytes, each one of A-Z a-z 0-9 . _ % -.
func CheckBucketName(name string) error {
	if name == "" {
		return errors.New("bucket name must not be empty")
	}
	if len(name) > MaxBucketNameLen {
		return fmt.Errorf("bucket name is %d bytes long, at most %d allowed", len(name), MaxBucketNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '%' || c == '-') {
			return fmt.Errorf("bucket name %s has a character outside A-Z a-z 0-9 . _ %% -", quoteShort(name))
		}
	}
	return nil
}

func checkListen(key, addr string, probs *problems) {
	if err := checkHostPort(addr, true, true); err != nil {
		probs.addf(key, "%s", err)
	}
}

// checkHostPort validates a host:port address without resolving it. The port
// must be numeric; the host, when present, an IP address or a DNS name.
func checkHostPort(addr string, allowEmptyHost, allowPortZero bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("must be host:port, got %s", quoteShort(addr))
	}
	p, err := strconv.Atoi(port)
	if err != nil || port[0] < '0' || port[0] > '9' || p < 0 || p > 65535 {
		return fmt.Errorf("port must be a number between 0 and 65535 in %s", quoteShort(addr))
	}
	if p == 0 && !allowPortZero {
		return fmt.Errorf("port 0 is not allowed in %s", quoteShort(addr))
	}
	if host == "" {
		if !allowEmptyHost {
			return fmt.Errorf("host is missing in %s", quoteShort(addr))
		}
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if !isDNSName(host) {
		return fmt.Errorf("host is neither an IP address nor a DNS name in %s", quoteShort(addr))
	}
	return nil
}

// isDNSName reports whether s looks like a host name: labels of letters,
// digits, '-' and '_', 1..63 bytes each, 253 bytes in all.
func isDNSName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
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
