package bucketcfg

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/throttle"
)

func TestParseDefaults(t *testing.T) {
	for _, doc := range []string{"", "# nothing\n", "[proxy]\n[upstream]\n[throttle]\n[metrics]\n[log]\n"} {
		cfg := mustParse(t, doc)
		want := ProxyConfig{Listen: "127.0.0.1:11311", DefaultBucket: "default", MaxConnections: 10000,
			MaxFrameBytes: 22020096, MaxHeldInputBytes: 256 << 10,
			AuthTimeout: 10 * time.Second, IdleTimeout: 0, MaxUnsentBytes: 256 << 20, PlainAuth: PlainTLSOrLoopback}
		if cfg.Proxy != want {
			t.Errorf("Proxy = %+v, want %+v", cfg.Proxy, want)
		}
		if !reflect.DeepEqual(cfg.Upstream, UpstreamConfig{Servers: []string{"127.0.0.1:11211"}, Timeout: 2 * time.Second, MaxInflight: 4096, EjectRetry: 30 * time.Second, ConnsPerBucket: true}) {
			t.Errorf("Upstream = %+v", cfg.Upstream)
		}
		wantT := ThrottleConfig{Capacity: lim(25000), Defaults: BucketThrottle{lim(0), throttle.Unlimited},
			ReadUnitSize: 4096, WriteUnitSize: 4096, StateFile: "kvthrottle-state.json", Burst: 100 * time.Millisecond, MaxItemBytes: 1 << 20}
		if cfg.Throttle != wantT {
			t.Errorf("Throttle = %+v, want %+v", cfg.Throttle, wantT)
		}
		if cfg.Metrics.Listen != "127.0.0.1:9150" || cfg.Log != (LogConfig{Level: "info", Format: "json"}) {
			t.Errorf("Metrics = %+v, Log = %+v", cfg.Metrics, cfg.Log)
		}
		if len(cfg.Buckets) != 1 || cfg.Buckets[0].Name != "default" || cfg.Buckets[0].FlushEnabled ||
			cfg.Buckets[0].Throttle != (BucketThrottle{lim(0), throttle.Unlimited}) || cfg.Buckets[0].ReservedSet || cfg.Buckets[0].HardLimitSet {
			t.Errorf("Buckets = %+v, want the implied default bucket", cfg.Buckets)
		}
		if cfg.Bucket("default") == nil {
			t.Error(`Bucket("default") = nil`)
		}
		if len(cfg.Users) != 0 || cfg.Path() != "" {
			t.Errorf("Users = %v, Path = %q", cfg.Users, cfg.Path())
		}
	}
}

func TestParseBucketDefaultsAndExplicitness(t *testing.T) {
	cfg := mustParse(t, `
[throttle]
default_throttle_reserved_units = 10
default_throttle_hard_limit = 100
[[bucket]]
name = "default"
[[bucket]]
name = "r"
reserved = 50
[[bucket]]
name = "h"
hard_limit = 20
[[bucket]]
name = "both"
reserved = "unlimited"
hard_limit = "unlimited"
flush_enabled = true
`)
	cases := []struct {
		name         string
		want         BucketThrottle
		resSet, hSet bool
		flush        bool
	}{
		{"default", BucketThrottle{lim(10), lim(100)}, false, false, false},
		{"r", BucketThrottle{lim(50), lim(100)}, true, false, false},
		{"h", BucketThrottle{lim(10), lim(20)}, false, true, false},
		{"both", BucketThrottle{throttle.Unlimited, throttle.Unlimited}, true, true, true},
	}
	for i, c := range cases {
		b := cfg.Bucket(c.name)
		if b == nil || b != &cfg.Buckets[i] {
			t.Fatalf("Bucket(%q) = %p, want &Buckets[%d]", c.name, b, i)
		}
		if b.Throttle != c.want || b.ReservedSet != c.resSet || b.HardLimitSet != c.hSet || b.FlushEnabled != c.flush {
			t.Errorf("bucket %q = %+v, want %v set=%v/%v flush=%v", c.name, *b, c.want, c.resSet, c.hSet, c.flush)
		}
	}
	if cfg.Bucket("nope") != nil {
		t.Error(`Bucket("nope") != nil`)
	}
}

func TestParseEmptyBucketList(t *testing.T) {
	cfg := mustParse(t, "bucket = []\n[proxy]\ndefault_bucket = \"\"\n")
	if len(cfg.Buckets) != 0 || cfg.Proxy.DefaultBucket != "" {
		t.Fatalf("Buckets = %v, DefaultBucket = %q", cfg.Buckets, cfg.Proxy.DefaultBucket)
	}
	_, err := Parse([]byte("bucket = []\n"))
	if err == nil || !strings.Contains(err.Error(), "proxy.default_bucket: not set") {
		t.Fatalf("bucket = [] without default_bucket: error %v", err)
	}
}

func TestParseAcceptedValues(t *testing.T) {
	h := fastHash(t)
	cfg := mustParse(t, `
[proxy]
listen = ":0"
default_bucket = ""
max_connections = 1
max_frame_bytes = 24
max_held_input_bytes = 1073741824
auth_timeout = "0s"
idle_timeout = "720h"
max_unsent_bytes = 1048576
[upstream]
servers = ["[::1]:11211", "mc-1.example.org:1", "10.0.0.1:65535"]
timeout = "1m30s"
max_inflight = 1
conns_per_bucket = false
[throttle]
capacity = "unlimited"
default_throttle_reserved_units = "unlimited"
default_throttle_hard_limit = "unlimited"
read_unit_size = 1
write_unit_size = 1073741824
state_file = "/var/lib/kvthrottle/state.json"
burst_ms = 0
max_hold = "750ms"
max_item_bytes = 5242880
[metrics]
listen = ""
[log]
level = "trace"
format = "console"
[[bucket]]
name = "A-z.0_9%x"
[[user]]
name = "ünïcode"
password_hash = "`+h+`"
buckets = ["A-z.0_9%x", "*"]
privileges = ["unthrottled"]
`)
	if cfg.Upstream.Timeout != 90*time.Second || cfg.Upstream.ConnsPerBucket || cfg.Throttle.Burst != 0 || cfg.Metrics.Listen != "" ||
		cfg.Throttle.MaxHold != 750*time.Millisecond || cfg.Throttle.MaxItemBytes != 5<<20 ||
		!cfg.Throttle.Capacity.IsUnlimited() || cfg.Buckets[0].Throttle.Reserved != throttle.Unlimited ||
		cfg.Proxy.AuthTimeout != 0 || cfg.Proxy.IdleTimeout != 720*time.Hour || cfg.Proxy.MaxUnsentBytes != 1<<20 {
		t.Fatalf("unexpected %+v", cfg)
	}
	for _, lvl := range []string{"trace", "debug", "info", "warn", "error", "fatal", "panic", "disabled"} {
		mustParse(t, "[log]\nlevel = \""+lvl+"\"\n")
	}
	mustParse(t, "[[bucket]]\nname = \""+strings.Repeat("b", MaxBucketNameLen)+"\"\n[proxy]\ndefault_bucket=\"\"\n")
}

// TestParseRejects has one case per validation rule; each error must name
// the key.
func TestParseRejects(t *testing.T) {
	h := fastHash(t)
	user := func(extra string) string {
		return "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"u\"\npassword_hash = \"" + h + "\"\n" + extra
	}
	cases := []struct {
		name, doc, want string
	}{
		{"syntax", "[proxy\n", "toml:"},
		{"unknown table", "[proxyy]\nlisten = \"a:1\"\n", "proxyy: unknown key"},
		{"unknown key", "[proxy]\nlistne = \"a:1\"\n", "proxy.listne: unknown key"},
		{"unknown top key", "capacity = 5\n", "capacity: unknown key"},
		{"unknown bucket key", "[[bucket]]\nname = \"default\"\nreservd = 5\n", "bucket.reservd: unknown key"},
		{"unknown user key", user("password = \"x\"\n"), "user.password: unknown key"},
		{"key case", "[proxy]\nListen = \"127.0.0.1:1\"\n", "proxy.Listen: unknown key"},
		{"table case", "[Proxy]\nlisten = \"127.0.0.1:1\"\n", "Proxy: unknown key"},
		{"sub-table of bucket", "[[bucket]]\nname = \"default\"\n[bucket.x]\ny = 1\n", "bucket.x: unknown key"},
		{"inline table limit", "[throttle]\ncapacity = {a = 1}\n", "throttle.capacity.a: unknown key"},

		{"listen not host:port", "[proxy]\nlisten = \"11311\"\n", "proxy.listen: must be host:port"},
		{"listen empty", "[proxy]\nlisten = \"\"\n", "proxy.listen: must be host:port"},
		{"listen bad port", "[proxy]\nlisten = \"127.0.0.1:99999\"\n", "proxy.listen: port must be a number"},
		{"listen named port", "[proxy]\nlisten = \"127.0.0.1:memcache\"\n", "proxy.listen: port must be a number"},
		{"listen bad host", "[proxy]\nlisten = \"bad host!:1\"\n", "proxy.listen: host is neither"},
		{"listen wrong type", "[proxy]\nlisten = 11311\n", `"proxy.listen"`},
		{"default bucket undefined", "[proxy]\ndefault_bucket = \"nope\"\n", `proxy.default_bucket: "nope" is not a [[bucket]]`},
		{"default bucket implied but missing", "[[bucket]]\nname = \"other\"\n", "proxy.default_bucket: not set"},
		{"max_connections zero", "[proxy]\nmax_connections = 0\n", "proxy.max_connections: must be between 1 and"},
		{"max_connections huge", "[proxy]\nmax_connections = 100000000\n", "proxy.max_connections: must be between"},
		{"max_connections string", "[proxy]\nmax_connections = \"10\"\n", `"proxy.max_connections"`},
		{"max_frame_bytes small", "[proxy]\nmax_frame_bytes = 23\n", "proxy.max_frame_bytes: must be between 24 and 1073741824, got 23"},
		{"max_frame_bytes large", "[proxy]\nmax_frame_bytes = 1073741825\n", "proxy.max_frame_bytes: must be between"},
		{"max_held_input_bytes", "[proxy]\nmax_held_input_bytes = -1\n", "proxy.max_held_input_bytes: must be between"},
		{"auth_timeout bad", "[proxy]\nauth_timeout = \"ten seconds\"\n", `proxy.auth_timeout: invalid duration "ten seconds"`},
		{"auth_timeout integer", "[proxy]\nauth_timeout = 10\n", `"proxy.auth_timeout"`},
		{"auth_timeout negative", "[proxy]\nauth_timeout = \"-1s\"\n", "proxy.auth_timeout: must be 0s (never) or from 10ms to 720h0m0s, got -1s"},
		{"auth_timeout tiny", "[proxy]\nauth_timeout = \"1ms\"\n", "proxy.auth_timeout: must be 0s (never) or from 10ms"},
		{"idle_timeout huge", "[proxy]\nidle_timeout = \"721h\"\n", "proxy.idle_timeout: must be 0s (never) or from 10ms to 720h0m0s, got 721h0m0s"},
		{"idle_timeout bad", "[proxy]\nidle_timeout = \"never\"\n", `proxy.idle_timeout: invalid duration "never"`},
		{"max_unsent_bytes small", "[proxy]\nmax_unsent_bytes = 1048575\n", "proxy.max_unsent_bytes: must be between 1048576 and 1099511627776, got 1048575"},
		{"max_unsent_bytes string", "[proxy]\nmax_unsent_bytes = \"1G\"\n", `"proxy.max_unsent_bytes"`},

		{"servers empty", "[upstream]\nservers = []\n", "upstream.servers: must list at least one"},
		{"server no port", "[upstream]\nservers = [\"localhost\"]\n", "upstream.servers[0]: must be host:port"},
		{"server no host", "[upstream]\nservers = [\"127.0.0.1:1\", \":11211\"]\n", "upstream.servers[1]: host is missing"},
		{"server port 0", "[upstream]\nservers = [\"127.0.0.1:0\"]\n", "upstream.servers[0]: port 0 is not allowed"},
		{"server duplicate", "[upstream]\nservers = [\"a:1\", \"a:1\"]\n", "upstream.servers[1]: duplicate server"},
		{"servers not array", "[upstream]\nservers = \"a:1\"\n", `"upstream.servers"`},
		{"timeout bad", "[upstream]\ntimeout = \"2 seconds\"\n", `upstream.timeout: invalid duration "2 seconds"`},
		{"timeout integer", "[upstream]\ntimeout = 2\n", `"upstream.timeout"`},
		{"timeout zero", "[upstream]\ntimeout = \"0s\"\n", "upstream.timeout: must be greater than 0"},
		{"timeout negative", "[upstream]\ntimeout = \"-1s\"\n", "upstream.timeout: must be greater than 0"},
		{"timeout huge", "[upstream]\ntimeout = \"1h\"\n", "upstream.timeout: must be greater than 0 and at most 10m0s"},
		{"max_inflight", "[upstream]\nmax_inflight = 0\n", "upstream.max_inflight: must be between 1"},

		{"capacity string", "[throttle]\ncapacity = \"lots\"\n", `throttle.capacity: must be a non-negative integer or "unlimited", got "lots"`},
		{"capacity negative", "[throttle]\ncapacity = -1\n", `throttle.capacity: must be a non-negative integer or "unlimited", got -1`},
		{"capacity float", "[throttle]\ncapacity = 1.5\n", `throttle.capacity: must be a non-negative integer or "unlimited", got 1.5`},
		{"capacity bool", "[throttle]\ncapacity = true\n", `throttle.capacity: must be a non-negative integer or "unlimited", got true`},
		{"capacity too large", "[throttle]\ncapacity = 1000000001\n", `throttle.capacity: must be at most 1000000000`},
		{"default reserved bad", "[throttle]\ndefault_throttle_reserved_units = \"none\"\n", `throttle.default_throttle_reserved_units: must be`},
		{"default hard bad", "[throttle]\ndefault_throttle_hard_limit = -3\n", `throttle.default_throttle_hard_limit: must be`},
		{"defaults reversed", "[throttle]\ndefault_throttle_reserved_units = 10\ndefault_throttle_hard_limit = 5\n",
			"throttle.default_throttle_reserved_units: 10 exceeds default_throttle_hard_limit 5"},
		{"default reserved over implied hard", "[throttle]\ndefault_throttle_hard_limit = 0\ndefault_throttle_reserved_units = \"unlimited\"\n",
			"throttle.default_throttle_reserved_units: unlimited exceeds"},
		{"read unit zero", "[throttle]\nread_unit_size = 0\n", "throttle.read_unit_size: must be between 1"},
		{"write unit negative", "[throttle]\nwrite_unit_size = -4096\n", "throttle.write_unit_size: must be between 1"},
		{"state file empty", "[throttle]\nstate_file = \"\"\n", "throttle.state_file: must not be empty"},
		{"burst negative", "[throttle]\nburst_ms = -1\n", "throttle.burst_ms: must be between 0 and 60000"},
		{"burst huge", "[throttle]\nburst_ms = 60001\n", "throttle.burst_ms: must be between 0 and 60000"},
		{"max hold bad", "[throttle]\nmax_hold = \"soon\"\n", `throttle.max_hold: invalid duration "soon"`},
		{"max hold negative", "[throttle]\nmax_hold = \"-1s\"\n", "throttle.max_hold: must be from 0s to 1h0m0s, got -1s"},
		{"max item zero", "[throttle]\nmax_item_bytes = 0\n", "throttle.max_item_bytes: must be between 1"},

		{"metrics listen bad", "[metrics]\nlisten = \"9150\"\n", "metrics.listen: must be host:port"},
		{"log level", "[log]\nlevel = \"verbose\"\n", `log.level: must be one of trace, debug, info, warn, error, fatal, panic, disabled; got "verbose"`},
		{"log level case", "[log]\nlevel = \"INFO\"\n", `log.level: must be one of`},
		{"log format", "[log]\nformat = \"text\"\n", `log.format: must be "json" or "console", got "text"`},

		{"bucket name missing", "[[bucket]]\nreserved = 1\n", "bucket[0].name: missing"},
		{"bucket name empty", "[[bucket]]\nname = \"\"\n", "bucket[0].name: bucket name must not be empty"},
		{"bucket name space", "[[bucket]]\nname = \"a b\"\n", `bucket[0].name: bucket name "a b" has a character outside`},
		{"bucket name slash", "[[bucket]]\nname = \"default\"\n[[bucket]]\nname = \"a/b\"\n", `bucket[1].name: bucket name "a/b"`},
		{"bucket name unicode", "[[bucket]]\nname = \"bücket\"\n", `bucket[0].name: bucket name "bücket"`},
		{"bucket name long", "[[bucket]]\nname = \"" + strings.Repeat("x", MaxBucketNameLen+1) + "\"\n", "bucket[0].name: bucket name is 101 bytes long, at most 100"},
		{"bucket duplicate", "[[bucket]]\nname = \"default\"\n[[bucket]]\nname = \"default\"\n", `bucket "default": defined more than once`},
		{"bucket reserved bad", "[[bucket]]\nname = \"default\"\nreserved = \"lots\"\n", `bucket "default": reserved: must be a non-negative integer or "unlimited", got "lots"`},
		{"bucket hard bad", "[[bucket]]\nname = \"default\"\nhard_limit = 2.5\n", `bucket "default": hard_limit: must be a non-negative integer or "unlimited", got 2.5`},
		{"bucket reserved > hard", "[[bucket]]\nname = \"default\"\nreserved = 500\nhard_limit = 100\n", `bucket "default": reserved 500 exceeds hard_limit 100`},
		{"bucket reserved > default hard", "[throttle]\ndefault_throttle_hard_limit = 100\n[[bucket]]\nname = \"default\"\nreserved = 500\n",
			`bucket "default": reserved 500 exceeds hard_limit 100 (hard_limit not set`},
		{"bucket default reserved > hard", "[throttle]\ndefault_throttle_reserved_units = 100\n[[bucket]]\nname = \"default\"\nhard_limit = 50\n",
			`bucket "default": reserved 100 exceeds hard_limit 50 (reserved not set`},
		{"bucket flush type", "[[bucket]]\nname = \"default\"\nflush_enabled = \"yes\"\n", `"bucket.flush_enabled"`},
		{"bucket not array of tables", "[bucket]\nname = \"default\"\n", `"bucket"`},

		{"user name missing", "[[bucket]]\nname = \"default\"\n[[user]]\npassword_hash = \"" + h + "\"\n", "user[0].name: missing"},
		{"user name empty", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"\"\npassword_hash = \"" + h + "\"\n", "user[0].name: must not be empty"},
		{"user name space", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"a b\"\npassword_hash = \"" + h + "\"\n", "user[0].name: \"a b\" contains a space"},
		{"user name control", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"a\\u0000b\"\npassword_hash = \"" + h + "\"\n", "user[0].name:"},
		{"user duplicate", user("[[user]]\nname = \"u\"\npassword_hash = \"" + h + "\"\n"), `user "u": defined more than once`},
		{"user hash missing", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"u\"\n", `user "u": password_hash: missing`},
		{"user hash plaintext", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"u\"\npassword_hash = \"hunter2\"\n", `user "u": password_hash: not a bcrypt hash`},
		{"user hash cost too high", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"u\"\npassword_hash = \"" + strings.Replace(h, "$04$", "$15$", 1) + "\"\n",
			`user "u": password_hash: bcrypt cost 15 is above 14`},
		{"user hash cost too low", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"u\"\npassword_hash = \"" + strings.Replace(h, "$04$", "$03$", 1) + "\"\n",
			`user "u": password_hash: not a bcrypt hash`},
		{"user hash bad alphabet", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"u\"\npassword_hash = \"" + h[:59] + "!\"\n",
			`user "u": password_hash: not a bcrypt hash`},
		{"user hash argon2", "[[bucket]]\nname = \"default\"\n[[user]]\nname = \"u\"\npassword_hash = \"$argon2id$v=19$m=65536,t=3,p=4$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA\"\n",
			`user "u": password_hash: not a bcrypt hash`},
		{"user unknown bucket", user("buckets = [\"default\", \"nope\"]\n"), `user "u": buckets: "nope" is not a [[bucket]]`},
		{"user buckets type", user("buckets = \"*\"\n"), `"user.buckets"`},
		{"user unknown privilege", user("privileges = [\"root\"]\n"), `user "u": privileges: unknown privilege "root"`},
		{"user privilege case", user("privileges = [\"Admin\"]\n"), `user "u": privileges: unknown privilege "Admin"`},
		{"user privilege twice", user("privileges = [\"admin\", \"admin\"]\n"), `user "u": privileges: "admin" listed twice`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Parse([]byte(c.doc))
			if err == nil {
				t.Fatalf("Parse accepted:\n%s\n-> %+v", c.doc, cfg)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse(%q) error:\n%v\nwant it to contain %q", c.doc, err, c.want)
			}
			if strings.Contains(err.Error(), "$2a$") {
				t.Fatalf("error leaks a password hash: %v", err)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || len(ce.Problems) == 0 {
				t.Fatalf("error %T is not a *ConfigError with problems", err)
			}
		})
	}
}

func TestParseReportsAllProblems(t *testing.T) {
	_, err := Parse([]byte("[proxy]\nmax_connections = 0\n[log]\nlevel = \"x\"\nformat = \"y\"\n"))
	var ce *ConfigError
	if !errors.As(err, &ce) || len(ce.Problems) != 3 {
		t.Fatalf("error = %v, want 3 problems", err)
	}
	if !strings.HasPrefix(err.Error(), "config: 3 problems:\n\tproxy.max_connections") {
		t.Fatalf("error text = %q", err)
	}
}

func TestLoadValidFixture(t *testing.T) {
	testmc.SkipUnderRace(t) // bcrypt at cost 10, on one goroutine
	path := filepath.Join("..", "testdata", "config", "valid.toml")
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Path() != path {
		t.Errorf("Path() = %q", cfg.Path())
	}
	if want := filepath.Join(filepath.Dir(path), "kvthrottle-state.json"); cfg.Throttle.StateFile != want {
		t.Errorf("StateFile = %q, want %q (relative to the config file)", cfg.Throttle.StateFile, want)
	}
	if len(cfg.Buckets) != 3 || len(cfg.Users) != 2 || len(cfg.Upstream.Servers) != 2 {
		t.Fatalf("buckets=%d users=%d servers=%d", len(cfg.Buckets), len(cfg.Users), len(cfg.Upstream.Servers))
	}
	if b := cfg.Bucket("alice"); b == nil || b.Throttle != (BucketThrottle{lim(1000), lim(5000)}) || !b.FlushEnabled {
		t.Errorf("bucket alice = %+v", b)
	}
	if b := cfg.Bucket("batch.jobs_v2"); b == nil || b.Throttle != (BucketThrottle{lim(0), lim(2000)}) || b.ReservedSet || !b.HardLimitSet {
		t.Errorf("bucket batch.jobs_v2 = %+v", b)
	}
	admin, alice := cfg.User("admin"), cfg.User("alice")
	if admin == nil || !admin.IsAdmin() || !admin.IsUnthrottled() || !admin.CanAccess("anything") {
		t.Errorf("admin = %#v", admin)
	}
	if alice == nil || alice.IsAdmin() || alice.IsUnthrottled() || !alice.CanAccess("alice") || !alice.CanAccess("default") || alice.CanAccess("batch.jobs_v2") {
		t.Errorf("alice = %#v", alice)
	}
	// One real verification at the fixture's cost (10).
	if u, err := cfg.Authenticate("alice", "alice-secret"); err != nil || u != alice {
		t.Errorf("Authenticate(alice) = %v, %v", u, err)
	}
}

func TestLoadMinimalFixture(t *testing.T) {
	cfg, err := Load(filepath.Join("..", "testdata", "config", "minimal.toml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Proxy.DefaultBucket != "default" || cfg.Bucket("default") == nil {
		t.Fatalf("minimal config = %+v", cfg)
	}
}

func TestLoadInvalidFixtures(t *testing.T) {
	cases := map[string]string{
		"invalid-unknown-key.toml":         "proxy.listne: unknown key",
		"invalid-capacity.toml":            `throttle.capacity: must be a non-negative integer or "unlimited", got "lots"`,
		"invalid-reserved-over-hard.toml":  `bucket "default": reserved 500 exceeds hard_limit 100`,
		"invalid-default-bucket.toml":      `proxy.default_bucket: "nope" is not a [[bucket]]`,
		"invalid-password-hash.toml":       `user "admin": password_hash: not a bcrypt hash`,
		"invalid-timeout.toml":             `upstream.timeout: invalid duration "2 seconds"`,
		"invalid-syntax.toml":              "toml:",
		"does-not-exist-for-the-test.toml": "no such file",
	}
	for file, want := range cases {
		path := filepath.Join("..", "testdata", "config", file)
		_, err := Load(path)
		if err == nil {
			t.Errorf("Load(%s) succeeded", file)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "config "+path+": ") || !strings.Contains(msg, want) {
			t.Errorf("Load(%s) error = %q; want prefix %q and %q", file, msg, "config "+path+": ", want)
		}
		if strings.Contains(msg, "plaintext-password") {
			t.Errorf("Load(%s) error leaks the password_hash value: %q", file, msg)
		}
	}
	_, err := Load(filepath.Join("..", "testdata", "config", "does-not-exist-for-the-test.toml"))
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file error %v does not wrap fs.ErrNotExist", err)
	}
}

func TestLoadAbsoluteStateFile(t *testing.T) {
	dir := t.TempDir()
	abs := filepath.Join(dir, "elsewhere", "state.json")
	path := filepath.Join(dir, "c.toml")
	if err := os.WriteFile(path, []byte("[throttle]\nstate_file = \""+filepath.ToSlash(abs)+"\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Throttle.StateFile != filepath.ToSlash(abs) {
		t.Fatalf("StateFile = %q, want %q", cfg.Throttle.StateFile, abs)
	}
}

func TestCheckBucketName(t *testing.T) {
	for _, ok := range []string{"a", "default", "A.b_c-d%e", strings.Repeat("9", 100)} {
		if err := CheckBucketName(ok); err != nil {
			t.Errorf("CheckBucketName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", " ", "a b", "a/b", "a:b", "a\x00", "é", strings.Repeat("9", 101), "*"} {
		if err := CheckBucketName(bad); err == nil {
			t.Errorf("CheckBucketName(%q) accepted", bad)
		}
	}
}

func TestParseFleet(t *testing.T) {
	cfg := mustParse(t, "")
	if cfg.Fleet != (FleetConfig{Name: "default", GrantPeriod: time.Second, OnStoreLoss: "share"}) {
		t.Errorf("default Fleet = %+v", cfg.Fleet)
	}
	cfg = mustParse(t, "[fleet]\nredis_url = \"redis://127.0.0.1:6379/0\"\nname = \"eu-1\"\ninstance = \"host-a/11311\"\ngrant_period = \"500ms\"\non_store_loss = \"open\"\n")
	if cfg.Fleet != (FleetConfig{RedisURL: "redis://127.0.0.1:6379/0", Name: "eu-1", Instance: "host-a/11311", GrantPeriod: 500 * time.Millisecond, OnStoreLoss: "open"}) {
		t.Errorf("Fleet = %+v", cfg.Fleet)
	}
	for doc, want := range map[string]string{
		"[fleet]\nredis_url = \"http://x\"\n":      "fleet.redis_url",
		"[fleet]\nname = \"a b\"\n":                "fleet.name",
		"[fleet]\ninstance = \"a|b\"\n":            "fleet.instance",
		"[fleet]\ngrant_period = \"10ms\"\n":       "fleet.grant_period",
		"[fleet]\ngrant_period = \"soon\"\n":       "fleet.grant_period",
		"[fleet]\non_store_loss = \"fail\"\n":      "fleet.on_store_loss",
		"[fleet]\nredis = \"redis://127.0.0.1\"\n": "fleet.redis: unknown key",
	} {
		_, err := Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one naming %s", doc, err, want)
		}
	}
}

func TestParseListeners(t *testing.T) {
	cfg := mustParse(t, "[[bucket]]\nname = \"default\"\n[[bucket]]\nname = \"a\"\n[[listener]]\nlisten = \"127.0.0.1:11312\"\nbucket = \"a\"\n[[listener]]\nlisten = \":11313\"\nbucket = \"default\"\n")
	want := []Listener{{Listen: "127.0.0.1:11312", Bucket: "a"}, {Listen: ":11313", Bucket: "default"}}
	if !reflect.DeepEqual(cfg.Listeners, want) {
		t.Errorf("Listeners = %+v, want %+v", cfg.Listeners, want)
	}
	for doc, want := range map[string]string{
		"[[listener]]\nbucket = \"default\"\n":                                                                         "listener[0].listen: is required",
		"[[listener]]\nlisten = \"127.0.0.1:11312\"\n":                                                                 "listener[0].bucket: is required",
		"[[listener]]\nlisten = \"127.0.0.1:0\"\nbucket = \"default\"\n":                                               "port 0",
		"[[listener]]\nlisten = \"127.0.0.1:11312\"\nbucket = \"nope\"\n":                                              "is not a [[bucket]]",
		"[[listener]]\nlisten = \"127.0.0.1:11311\"\nbucket = \"default\"\n":                                           "already proxy.listen",
		"[[listener]]\nlisten = \":11311\"\nbucket = \"default\"\n":                                                    "proxy.listen's port",
		"[[listener]]\nlisten = \"127.0.0.1:11312\"\nbucket = \"default\"\nport = 1\n":                                 "listener.port: unknown key",
		"[[listener]]\nlisten = \"a:1\"\nbucket = \"default\"\n[[listener]]\nlisten = \"a:1\"\nbucket = \"default\"\n": "listener[1].listen",
	} {
		_, err := Parse([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one with %q", doc, err, want)
		}
	}
}
