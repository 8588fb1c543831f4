package bucketcfg

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/echo"
	"github.com/kvthrottle/kvthrottle/throttle"
)

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
func limitIn(key string, v any, def throttle.Limit, probs *problems) (throttle.Limit, bool) {
	if v == nil {
		return def, false
	}
	var l throttle.Limit
	if err := l.UnmarshalTOML(v); err != nil {
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
	switch p.PlainAuth = PlainAuthPolicy(strOr(raw.PlainAuth, string(PlainTLSOrLoopback))); p.PlainAuth {
	case PlainTLSOrLoopback, PlainTLSOnly, PlainAnywhere:
	default:
		probs.addf("proxy.plain_auth", `unknown value %s (known: "tls-or-loopback", "tls-only", "anywhere")`, echo.Quote(string(p.PlainAuth)))
		p.PlainAuth = PlainTLSOrLoopback
	}
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
		probs.addf(key, `invalid duration %s (write for example "10s", "500ms" or "0s" for never)`, echo.Quote(*p))
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
				probs.addf(key, "duplicate server %s", echo.Quote(s))
			}
			seen[s] = true
		}
	}
	u.Timeout = defaultUpstreamTimeout
	if raw.Timeout != nil {
		d, err := time.ParseDuration(*raw.Timeout)
		switch {
		case err != nil:
			probs.addf("upstream.timeout", `invalid duration %s (write for example "2s" or "500ms")`, echo.Quote(*raw.Timeout))
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
	u.ConnsPerBucket = raw.ConnsPerBucket == nil || *raw.ConnsPerBucket
	u.EjectAfterFailures = intIn("upstream.eject_after_failures", raw.EjectAfterFailures, 0, 0, 1000, probs)
	u.EjectRetry = defaultEjectRetry
	if raw.EjectRetry != nil {
		d, err := time.ParseDuration(*raw.EjectRetry)
		switch {
		case err != nil:
			probs.addf("upstream.eject_retry", `invalid duration %s (write for example "30s")`, echo.Quote(*raw.EjectRetry))
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
	t.Capacity, _ = limitIn("throttle.capacity", raw.Capacity, throttle.Limit(defaultCapacity), probs)
	var okR, okH bool
	t.Defaults.Reserved, okR = limitIn("throttle.default_throttle_reserved_units", raw.DefaultReserved, throttle.Limit(0), probs)
	t.Defaults.HardLimit, okH = limitIn("throttle.default_throttle_hard_limit", raw.DefaultHardLimit, throttle.Unlimited, probs)
	if (okR || raw.DefaultReserved == nil) && (okH || raw.DefaultHardLimit == nil) && t.Defaults.Validate() != nil {
		probs.addf("throttle.default_throttle_reserved_units", "%s exceeds default_throttle_hard_limit %s", t.Defaults.Reserved, t.Defaults.HardLimit)
	}
	if t.Defaults.Validate() != nil { // keep the Config invariant even on error paths
		t.Defaults = BucketThrottle{Reserved: throttle.Limit(0), HardLimit: throttle.Unlimited}
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
			probs.addf("throttle.max_hold", `invalid duration %s (write for example "500ms"; "0s" holds as long as needed)`, echo.Quote(*raw.MaxHold))
		case d < 0 || d > MaxMaxHold:
			probs.addf("throttle.max_hold", "must be from 0s to %s, got %s", MaxMaxHold, d)
		default:
			t.MaxHold = d
		}
	}
	t.MaxItemBytes = intIn("throttle.max_item_bytes", raw.MaxItemBytes, defaultMaxItemBytes, 1, MaxFrameBytesLimit, probs)
	t.FreePool = freePoolModes[0]
	if raw.FreePool != nil {
		m, err := parseFreePool(*raw.FreePool)
		if err != nil {
			probs.addf("throttle.free_pool", "%s", err)
		} else {
			t.FreePool = m
		}
	}
}

// parseFreePool returns the mode spelt s, one of freePoolModes.
func parseFreePool(s string) (throttle.FreePoolMode, error) {
	for _, m := range freePoolModes {
		if s == m.String() {
			return m, nil
		}
	}
	return 0, fmt.Errorf("unknown value %s (known: %s)", echo.Quote(s), quotedModes())
}

// quotedModes lists the accepted free pool modes, quoted, for errors.
func quotedModes() string {
	q := make([]string, len(freePoolModes))
	for i, m := range freePoolModes {
		q[i] = strconv.Quote(m.String())
	}
	return strings.Join(q, " or ")
}

// weightIn returns the bucket weight of a TOML value (DefaultWeight when v
// is nil), reporting a problem naming key when it is not an integer from 1
// to MaxBucketWeight.
func weightIn(key string, v any, probs *problems) (int, bool) {
	if v == nil {
		return throttle.DefaultWeight, false
	}
	if n, ok := v.(int64); ok && n >= 1 && n <= MaxBucketWeight {
		return int(n), true
	}
	var got string
	switch x := v.(type) {
	case int64:
		got = strconv.FormatInt(x, 10)
	case float64:
		got = strconv.FormatFloat(x, 'g', -1, 64)
	case string:
		got = echo.Quote(x)
	case bool:
		got = strconv.FormatBool(x)
	default:
		got = fmt.Sprintf("a %T", v)
	}
	probs.addf(key, "must be an integer from 1 to %d, got %s", MaxBucketWeight, got)
	return throttle.DefaultWeight, false
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
		b.file.Reserved, okR = limitIn(label+": reserved", rb.Reserved, 0, probs)
		b.file.HardLimit, okH = limitIn(label+": hard_limit", rb.HardLimit, 0, probs)
		b.ReservedSet, b.HardLimitSet = okR, okH
		b.fileWeight, b.WeightSet = weightIn(label+": weight", rb.Weight, probs)
		b.Weight = b.fileWeight
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
			return fmt.Errorf("bucket name %s has a character outside A-Z a-z 0-9 . _ %% -", echo.Quote(name))
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
		return fmt.Errorf("must be host:port, got %s", echo.Quote(addr))
	}
	p, err := strconv.Atoi(port)
	if err != nil || port[0] < '0' || port[0] > '9' || p < 0 || p > 65535 {
		return fmt.Errorf("port must be a number between 0 and 65535 in %s", echo.Quote(addr))
	}
	if p == 0 && !allowPortZero {
		return fmt.Errorf("port 0 is not allowed in %s", echo.Quote(addr))
	}
	if host == "" {
		if !allowEmptyHost {
			return fmt.Errorf("host is missing in %s", echo.Quote(addr))
		}
		return nil
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if !isDNSName(host) {
		return fmt.Errorf("host is neither an IP address nor a DNS name in %s", echo.Quote(addr))
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

// Fleet defaults and bounds.
const (
	defaultFleetName   = "default"
	defaultGrantPeriod = time.Second
	MinGrantPeriod     = 100 * time.Millisecond
	MaxGrantPeriod     = time.Minute
)

func buildFleet(f *FleetConfig, raw *tomlFleet, probs *problems) {
	f.RedisURL = strOr(raw.RedisURL, "")
	if f.RedisURL != "" && !strings.HasPrefix(f.RedisURL, "redis://") && !strings.HasPrefix(f.RedisURL, "rediss://") {
		// The URL is not quoted: it may hold a password.
		scheme, _, _ := strings.Cut(f.RedisURL, ":")
		if len(scheme) > 10 {
			scheme = scheme[:10] + "..."
		}
		probs.addf("fleet.redis_url", `must start with "redis://" or "rediss://" (lower case), got a URL starting %s`, echo.Quote(scheme))
	}
	f.Name = strOr(raw.Name, defaultFleetName)
	if err := CheckBucketName(f.Name); err != nil || len(f.Name) > 100 {
		probs.addf("fleet.name", "must be 1 to 100 bytes of A-Z a-z 0-9 . _ %% -, got %s", echo.Quote(f.Name))
	}
	f.Instance = strOr(raw.Instance, "")
	for i := 0; i < len(f.Instance); i++ {
		if c := f.Instance[i]; c <= ' ' || c == '|' || c >= 0x7f || len(f.Instance) > 200 {
			probs.addf("fleet.instance", "must be at most 200 bytes of printable ASCII without spaces or '|', got %s", echo.Quote(f.Instance))
			break
		}
	}
	f.GrantPeriod = defaultGrantPeriod
	if raw.GrantPeriod != nil {
		d, err := time.ParseDuration(*raw.GrantPeriod)
		switch {
		case err != nil:
			probs.addf("fleet.grant_period", `invalid duration %s (write for example "1s" or "500ms")`, echo.Quote(*raw.GrantPeriod))
		case d < MinGrantPeriod || d > MaxGrantPeriod:
			probs.addf("fleet.grant_period", "must be from %s to %s, got %s", MinGrantPeriod, MaxGrantPeriod, d)
		default:
			f.GrantPeriod = d
		}
	}
	f.OnStoreLoss = strOr(raw.OnStoreLoss, "share")
	if f.OnStoreLoss != "share" && f.OnStoreLoss != "open" {
		probs.addf("fleet.on_store_loss", `must be "share" or "open", got %s`, echo.Quote(f.OnStoreLoss))
	}
}

func buildListeners(cfg *Config, raws []tomlListener, probs *problems) {
	seen := map[string]bool{cfg.Proxy.Listen: true}
	for i, raw := range raws {
		key := fmt.Sprintf("listener[%d]", i)
		l := Listener{Listen: strOr(raw.Listen, ""), Bucket: strOr(raw.Bucket, "")}
		if l.Listen == "" {
			probs.addf(key+".listen", "is required")
		} else if err := checkHostPort(l.Listen, true, false); err != nil {
			probs.addf(key+".listen", "%s", err)
		} else if seen[l.Listen] {
			probs.addf(key+".listen", "%s is already proxy.listen or another listener's", echo.Quote(l.Listen))
		} else if samePortAmbiguous(l.Listen, cfg.Proxy.Listen) {
			// Connections are told apart by the address they reached:
			// only IP addresses can share a port.
			probs.addf(key+".listen", "%s has proxy.listen's port; give one of them another port, or both an IP address", echo.Quote(l.Listen))
		}
		seen[l.Listen] = true
		if l.Bucket == "" {
			probs.addf(key+".bucket", "is required")
		} else if cfg.Bucket(l.Bucket) == nil {
			probs.addf(key+".bucket", "%s is not a [[bucket]]", echo.Quote(l.Bucket))
		}
		cfg.Listeners = append(cfg.Listeners, l)
	}
}

// samePortAmbiguous reports whether two host:port addresses share a port
// while one of them names no IP address (empty host or a DNS name), so
// that a connection's local address cannot tell them apart.
func samePortAmbiguous(a, b string) bool {
	ha, pa, errA := net.SplitHostPort(a)
	hb, pb, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || pa != pb {
		return false
	}
	_, ipA := netip.ParseAddr(ha)
	_, ipB := netip.ParseAddr(hb)
	return ipA != nil || ipB != nil
}
