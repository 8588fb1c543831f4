package bucketcfg

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/kvthrottle/kvthrottle/internal/echo"
	"github.com/kvthrottle/kvthrottle/throttle"
)

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
	cfg.TLS.resolvePaths(filepath.Dir(path))
	cfg.Upstream.TLS.resolvePaths(filepath.Dir(path))
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
	Proxy    tomlProxy      `toml:"proxy"`
	Upstream tomlUpstream   `toml:"upstream"`
	Throttle tomlThrottle   `toml:"throttle"`
	Metrics  tomlMetrics    `toml:"metrics"`
	Log      tomlLog        `toml:"log"`
	Fleet    tomlFleet      `toml:"fleet"`
	TLS      tomlTLS        `toml:"tls"`
	Listener []tomlListener `toml:"listener"`
	Bucket   []tomlBucket   `toml:"bucket"`
	User     []tomlUser     `toml:"user"`
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
	PlainAuth         *string `toml:"plain_auth"`
}

type tomlUpstream struct {
	Servers            *[]string       `toml:"servers"`
	Weights            *[]int64        `toml:"weights"`
	Timeout            *string         `toml:"timeout"`
	MaxInflight        *int64          `toml:"max_inflight"`
	EjectAfterFailures *int64          `toml:"eject_after_failures"`
	EjectRetry         *string         `toml:"eject_retry"`
	ConnsPerBucket     *bool           `toml:"conns_per_bucket"`
	TLS                tomlUpstreamTLS `toml:"tls"`
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
	FreePool         *string `toml:"free_pool"`
}

type tomlMetrics struct {
	Listen *string `toml:"listen"`
}

type tomlListener struct {
	Listen *string `toml:"listen"`
	Bucket *string `toml:"bucket"`
}

type tomlFleet struct {
	RedisURL    *string `toml:"redis_url"`
	Name        *string `toml:"name"`
	Instance    *string `toml:"instance"`
	GrantPeriod *string `toml:"grant_period"`
	OnStoreLoss *string `toml:"on_store_loss"`
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
	Weight       any     `toml:"weight"`
}

type tomlUser struct {
	Name         *string   `toml:"name"`
	PasswordHash *string   `toml:"password_hash"`
	ScramSHA256  *string   `toml:"scram_sha256"`
	ScramSHA512  *string   `toml:"scram_sha512"`
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
		"proxy.auth_timeout", "proxy.idle_timeout", "proxy.max_unsent_bytes", "proxy.plain_auth",
		"upstream", "upstream.servers", "upstream.timeout", "upstream.max_inflight",
		"upstream.weights", "upstream.eject_after_failures", "upstream.eject_retry", "upstream.conns_per_bucket",
		"throttle", "throttle.capacity", "throttle.default_throttle_reserved_units",
		"throttle.default_throttle_hard_limit", "throttle.read_unit_size",
		"throttle.write_unit_size", "throttle.state_file", "throttle.burst_ms", "throttle.max_hold", "throttle.max_item_bytes",
		"throttle.free_pool",
		"metrics", "metrics.listen",
		"log", "log.level", "log.format",
		"listener", "listener.listen", "listener.bucket",
		"fleet", "fleet.redis_url", "fleet.name", "fleet.instance", "fleet.grant_period", "fleet.on_store_loss",
		"bucket", "bucket.name", "bucket.reserved", "bucket.hard_limit", "bucket.flush_enabled", "bucket.weight",
		"user", "user.name", "user.password_hash", "user.scram_sha256", "user.scram_sha512", "user.buckets", "user.privileges",
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
	buildUpstreamTLS(&cfg.Upstream.TLS, &raw.Upstream.TLS, &probs)
	buildFleet(&cfg.Fleet, &raw.Fleet, &probs)
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
		probs.addf("log.level", "must be one of trace, debug, info, warn, error, fatal, panic, disabled; got %s", echo.Quote(cfg.Log.Level))
	}
	cfg.Log.Format = strOr(raw.Log.Format, defaultLogFormat)
	if cfg.Log.Format != "json" && cfg.Log.Format != "console" {
		probs.addf("log.format", `must be "json" or "console", got %s`, echo.Quote(cfg.Log.Format))
	}

	if md.IsDefined("bucket") {
		buildBuckets(cfg, raw.Bucket, &probs)
	} else {
		cfg.Buckets = []Bucket{{Name: defaultDefaultBucket, Throttle: cfg.Throttle.Defaults, Weight: throttle.DefaultWeight, fileWeight: throttle.DefaultWeight}}
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
			probs.addf("proxy.default_bucket", "%s is not a [[bucket]]", echo.Quote(cfg.Proxy.DefaultBucket))
		}
	}

	buildUsers(cfg, raw.User, &probs)
	buildListeners(cfg, raw.Listener, &probs)
	buildTLS(cfg, &raw.TLS, &probs)

	if len(probs) > 0 {
		return nil, &ConfigError{Problems: probs}
	}
	cfg.auth = newAuthState(cfg.Users)
	return cfg, nil
}
