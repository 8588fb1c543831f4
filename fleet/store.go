package fleet

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvthrottle/kvthrottle/throttle"
)

//go:embed sync.lua
var syncLua string

//go:embed seed.lua
var seedLua string

//go:embed update.lua
var updateLua string

//go:embed leave.lua
var leaveLua string

//go:embed resolve.lua
var resolveLua string

var (
	syncScript    = redis.NewScript(syncLua)
	seedScript    = redis.NewScript(seedLua)
	updateScript  = redis.NewScript(updateLua)
	leaveScript   = redis.NewScript(leaveLua)
	resolveScript = redis.NewScript(resolveLua)
)

// ErrOutcomeUnknown is returned by Store.Update when the write was sent,
// its reply was lost, and the store could not be asked (for resolveFor)
// whether it happened: the change may or may not be in force.
var ErrOutcomeUnknown = errors.New("fleet: the store could not be reached to tell whether the change was made")

// resolveFor bounds how long Store.Update asks the store whether a write
// whose reply was lost happened.
const resolveFor = 2 * time.Second

// ErrConflict is returned by Store.Update when the fleet's state document
// changed between the read and the write; the caller reads it again.
var ErrConflict = errors.New("fleet: state changed concurrently")

// Store is the shared store of a fleet: a Redis database holding, under
// keys that share one hash tag, the fleet's state document, its members,
// their demands and shares, and the fleet's usage. Every method is one
// round trip (a Lua script or a single command) and is safe for concurrent
// use.
type Store struct {
	rdb  redis.UniversalClient
	keys []string // config, members, entries, usage
	// clock, when set (SetClock), is the store's time instead of Redis's
	// TIME.
	clock throttle.Clock
}

// SetClock makes c's reading (in ms) the store's time in the scripts that
// read one (sync and seed) instead of the Redis server's own clock (TIME):
// the caller passes it as an argument. For tests only, whose instances
// all read one fake clock: in a real fleet each instance's clock has an
// origin of its own, and the server's clock is the one time every
// instance's calls share. Call it before the first call of the store.
func (s *Store) SetClock(c throttle.Clock) { s.clock = c }

// nowArg is the time argument of the scripts: "" for the server's own
// clock, else the store clock's reading in ms.
func (s *Store) nowArg() string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(s.clock.Now().Milliseconds(), 10)
}

// OpenStore connects to the store at rawURL for the fleet called name. It
// does not contact the server. The URL takes go-redis's forms:
//
//   - "redis://[user:password@]host:port/db" (or rediss:// for TLS): one
//     server;
//   - the same with "?master_name=NAME&addr=host:port&addr=...": Redis
//     Sentinel, the host and the addr parameters being the sentinels;
//   - the same with "?addr=host:port&addr=..." and no master_name: Redis
//     Cluster, the host and the addr parameters being seed nodes (every key
//     of a fleet shares one hash tag, so one node serves a fleet's calls).
//
// With rediss:// the store's certificate is verified, against the system's
// roots or the CAs in the file the parameter tls_ca_file names;
// tls_cert_file and tls_key_file name a client certificate and its key
// (for Redis's tls-auth-clients). These three take absolute paths.
func OpenStore(rawURL, name string) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// Not even the parser's reason: it quotes the part of the URL it
		// stumbled on, which may be the password.
		return nil, errors.New("fleet: redis_url is not a valid URL (a password with '%', '@', '/', ':' or '#' must be percent-encoded)")
	}
	// go-redis's errors may quote the URL's parts; never a password.
	scrub := func(err error) error {
		msg := err.Error()
		secrets := u.Query()["password"]
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p)
		}
		for _, p := range secrets {
			if p != "" {
				msg = strings.ReplaceAll(msg, p, "xxxxx")
			}
		}
		return errors.New(msg)
	}
	u, tlsFiles, err := splitTLSParams(u)
	if err != nil {
		return nil, err
	}
	rawURL = u.String()
	q := u.Query()
	// The caller bounds every call with a context deadline; go-redis's own
	// retries would only make a late reply later.
	const retries, pool = -1, 4
	switch {
	case q.Has("master_name"):
		opts, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("fleet: redis_url (Sentinel): %w", scrub(err))
		}
		if err := tlsFiles.apply(opts.TLSConfig); err != nil {
			return nil, err
		}
		opts.MaxRetries, opts.DialTimeout, opts.PoolSize, opts.ContextTimeoutEnabled = retries, dialTimeout(q, opts.DialTimeout), pool, true
		opts.Dialer = softDial(redis.NewDialer(&redis.Options{DialTimeout: opts.DialTimeout, TLSConfig: opts.TLSConfig}))
		fc := redis.NewFailoverClient(opts)
		fc.AddHook(readOnlyHook{tries: pool + 1})
		return newStore(fc, name), nil
	case q.Has("addr"):
		opts, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("fleet: redis_url (Cluster): %w", scrub(err))
		}
		if err := tlsFiles.apply(opts.TLSConfig); err != nil {
			return nil, err
		}
		opts.MaxRetries, opts.DialTimeout, opts.PoolSize, opts.ContextTimeoutEnabled = retries, dialTimeout(q, opts.DialTimeout), pool, true
		opts.Dialer = softDial(redis.NewDialer(&redis.Options{DialTimeout: opts.DialTimeout, TLSConfig: opts.TLSConfig}))
		cc := redis.NewClusterClient(opts)
		cc.AddHook(&slotMapHook{cc: cc})
		return newStore(cc, name), nil
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("fleet: redis_url: %w", scrub(err))
	}
	if err := tlsFiles.apply(opts.TLSConfig); err != nil {
		return nil, err
	}
	opts.MaxRetries, opts.DialTimeout, opts.PoolSize, opts.ContextTimeoutEnabled = retries, dialTimeout(q, opts.DialTimeout), pool, true
	opts.Dialer = softDial(redis.NewDialer(opts))
	rc := redis.NewClient(opts)
	rc.AddHook(readOnlyHook{tries: pool + 1})
	return newStore(rc, name), nil
}

// defaultDialTimeout bounds a connection to the store when redis_url
// names no dial_timeout.
const defaultDialTimeout = 2 * time.Second

// dialTimeout is the dial_timeout redis_url's query q names (parsed, as
// go-redis parsed it), or defaultDialTimeout.
func dialTimeout(q url.Values, parsed time.Duration) time.Duration {
	if q.Has("dial_timeout") && parsed > 0 {
		return parsed
	}
	return defaultDialTimeout
}

func newStore(rdb redis.UniversalClient, name string) *Store {
	tag := "{kvthrottle:" + name + "}"
	return &Store{rdb: rdb, keys: []string{tag + ":config", tag + ":members", tag + ":entries", tag + ":usage"}}
}

// Close closes the connections to the store.
func (s *Store) Close() error { return s.rdb.Close() }

// Load returns the fleet's state document and its token ("id:version",
// which changes with every change of the document and with every new life
// of the store); ok is false when the store holds none yet.
func (s *Store) Load(ctx context.Context) (doc []byte, token string, ok bool, err error) {
	vals, err := s.rdb.HMGet(ctx, s.keys[0], "state", "version", "id").Result()
	if err != nil {
		return nil, "", false, fmt.Errorf("fleet: load state: %w", explainTLS(err))
	}
	st, _ := vals[0].(string)
	vs, _ := vals[1].(string)
	id, _ := vals[2].(string)
	if _, err := strconv.ParseInt(vs, 10, 64); err != nil {
		return nil, "", false, nil // none, or not ours: seeding replaces it
	}
	return []byte(st), id + ":" + vs, true, nil
}

// Seed makes doc the fleet's state document if the store holds none, and
// returns the token in force and whether doc was stored. Each seeding
// names a new life of the store with a random id.
func (s *Store) Seed(ctx context.Context, doc []byte) (token string, seeded bool, err error) {
	id, err := newChangeID()
	if err != nil {
		return "", false, fmt.Errorf("fleet: seed state: %w", err)
	}
	tok, err := s.seed(ctx, doc, id)
	return tok, err == nil && tokenID(tok) == id, err
}

// SeedResolved is Seed for an admin change: a call that failed after it
// may have reached the store is sent again (the same document under the
// same id: a store it seeded already is left as it is, and a copy
// arriving late finds the store seeded) until the store answers or
// resolveFor has passed; then ErrOutcomeUnknown.
func (s *Store) SeedResolved(ctx context.Context, doc []byte) (token string, seeded bool, err error) {
	id, err := newChangeID()
	if err != nil {
		return "", false, fmt.Errorf("fleet: seed state: %w", err)
	}
	tok, err := s.seed(ctx, doc, id)
	if err != nil && mayHaveRun(err) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveFor)
		defer cancel()
		for err != nil && rctx.Err() == nil {
			select {
			case <-rctx.Done():
			case <-time.After(resolveFor / 40):
				tok, err = s.seed(rctx, doc, id)
			}
		}
		if err != nil {
			return "", false, fmt.Errorf("%w: seed state: %v", ErrOutcomeUnknown, err)
		}
	}
	return tok, err == nil && tokenID(tok) == id, err
}

// seed runs seed.lua with doc under id and returns the token in force.
func (s *Store) seed(ctx context.Context, doc []byte, id string) (string, error) {
	r, err := seedScript.Run(ctx, s.rdb, s.keys[:1], string(doc), id, s.nowArg()).Slice()
	if err != nil {
		return "", fmt.Errorf("fleet: seed state: %w", err)
	}
	if len(r) != 2 {
		return "", fmt.Errorf("fleet: seed state: reply of %d elements", len(r))
	}
	tok, _ := r[0].(string)
	return tok, nil
}

// tokenID returns the id part of a token ("id:version").
func tokenID(tok string) string {
	id, _, _ := strings.Cut(tok, ":")
	return id
}

// newChangeID returns a random id (16 hex digits) for a seeding or an
// update.
func newChangeID() (string, error) {
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(raw[:]), nil
}

// mayHaveRun reports whether a failed call may have reached the store and
// run: not when its connection could not be made, nor when the store
// answered an error.
func mayHaveRun(err error) bool {
	var reply redis.Error
	return !notSent(err) && !errors.As(err, &reply)
}

// Update replaces the fleet's state document with doc if its token is
// still token, and returns the new token; ErrConflict when it moved on.
// Its answer is the truth: nil (doc is in force under the token
// returned); ErrConflict or another error (doc was not written, and never
// will be); or ErrOutcomeUnknown. A call whose reply is lost after it may
// have reached the store (a timeout, a connection reset) is resolved
// before Update returns: it asks the store whether the write happened
// (each write records its change id), which also moves the token on if it
// did not, so that the write, were it still on its way, finds the
// document moved on. ErrOutcomeUnknown when the store cannot be asked
// within resolveFor.
func (s *Store) Update(ctx context.Context, token string, doc []byte) (string, error) {
	id, err := newChangeID()
	if err != nil {
		return "", fmt.Errorf("fleet: update state: %w", err)
	}
	tok, err := updateScript.Run(ctx, s.rdb, s.keys[:1], token, string(doc), id).Text()
	if err != nil {
		if !mayHaveRun(err) {
			return "", fmt.Errorf("fleet: update state: %w", err)
		}
		return s.resolve(ctx, token, id, err)
	}
	if tok == "" {
		return "", ErrConflict
	}
	return tok, nil
}

// resolve asks the store, until it answers or resolveFor has passed,
// whether the update with change id id against token happened (see
// Update); cause is the error of the update's call.
func (s *Store) resolve(ctx context.Context, token, id string, cause error) (string, error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveFor)
	defer cancel()
	for {
		r, err := resolveScript.Run(rctx, s.rdb, s.keys[:1], token, id).Slice()
		if err == nil && len(r) == 2 {
			if done, _ := r[0].(int64); done == 1 {
				tok, _ := r[1].(string)
				return tok, nil
			}
			return "", fmt.Errorf("fleet: update state: %w (the store says it was not made)", cause)
		}
		select {
		case <-rctx.Done():
			return "", fmt.Errorf("%w: update state: %v", ErrOutcomeUnknown, cause)
		case <-time.After(resolveFor / 40):
		}
	}
}

// leave forgets instance (of this epoch) in the store.
func (s *Store) leave(ctx context.Context, instance, epoch string) error {
	if err := leaveScript.Run(ctx, s.rdb, s.keys, instance, epoch).Err(); err != nil {
		return fmt.Errorf("fleet: leave: %w", err)
	}
	return nil
}

// syncRequest is one instance's report for one period. Limits and caps use
// -1 for unlimited.
type syncRequest struct {
	instance, epoch string
	seq             int64
	lease           time.Duration
	knownToken      string
	hint            int // live instances the caller last knew of
	freePool        int64
	fpCap           int64
	fpWeight        float64
	fair            bool // the caller shares its free pool by weight
	buckets         []bucketDemand
}

// bucketDemand is what an instance says about one bucket in a report.
type bucketDemand struct {
	name           string
	reserved, hard int64   // the fleet's limits, as this instance has them
	cum            uint64  // units used here since the epoch began
	cap            int64   // units/s wanted; -1: as much as it can get
	weight         float64 // how strongly (held callers), > 0
	poolCap        int64   // units/s wanted of the free pool; -1: as much as it can get
	bucketWeight   float64 // the bucket's weight (free_pool = "fair"), > 0
}

// syncReply is the store's answer to a syncRequest.
type syncReply struct {
	status    string // "ok", "stale", "seed", "conflict"
	now       time.Duration
	instances int
	token     string
	state     []byte // the fleet's state document when token != knownToken
	freePool  int64
	buckets   []bucketGrant
}

// bucketGrant is the caller's share of one bucket's limits.
type bucketGrant struct {
	name           string
	reserved, hard int64 // units/s; -1 unlimited
	fleetUnits     int64 // units used by the whole fleet, ever
	pool           int64 // its share of the free pool in fair mode; -1 otherwise
	// cut says the store cut its hard share by more than a fifth of what it
	// computed for it, because other live instances held the rest.
	cut bool
}

func (s *Store) sync(ctx context.Context, req *syncRequest) (*syncReply, error) {
	fair := "0"
	if req.fair {
		fair = "1"
	}
	args := make([]any, 0, 12+8*len(req.buckets))
	args = append(args, req.instance, req.epoch, req.seq, req.lease.Milliseconds(), req.knownToken, req.hint,
		req.freePool, req.fpCap, strconv.FormatFloat(req.fpWeight, 'f', 3, 64), len(req.buckets), fair, s.nowArg())
	for _, b := range req.buckets {
		args = append(args, b.name, b.reserved, b.hard, b.cum, b.cap, strconv.FormatFloat(b.weight, 'f', 3, 64),
			b.poolCap, strconv.FormatFloat(max(b.bucketWeight, 1), 'f', 3, 64))
	}
	raw, err := syncScript.Run(ctx, s.rdb, s.keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("fleet: sync: %w", explainTLS(err))
	}
	return parseSyncReply(raw)
}

func parseSyncReply(raw []any) (*syncReply, error) {
	bad := func(what string) (*syncReply, error) {
		return nil, fmt.Errorf("fleet: sync: malformed reply (%s)", what)
	}
	if len(raw) < 2 {
		return bad("too short")
	}
	r := &syncReply{}
	r.status, _ = raw[0].(string)
	ms, ok := raw[1].(int64)
	if !ok {
		return bad("time")
	}
	r.now = time.Duration(ms) * time.Millisecond
	if r.status != "ok" {
		return r, nil
	}
	if len(raw) < 6 || (len(raw)-6)%6 != 0 {
		return bad("length")
	}
	n, ok1 := raw[2].(int64)
	v, ok2 := raw[3].(string)
	st, ok3 := raw[4].(string)
	fp, ok4 := raw[5].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return bad("header")
	}
	r.instances, r.token, r.freePool = int(n), v, fp
	if st != "" {
		r.state = []byte(st)
	}
	r.buckets = make([]bucketGrant, 0, (len(raw)-6)/6)
	for i := 6; i < len(raw); i += 6 {
		name, ok1 := raw[i].(string)
		res, ok2 := raw[i+1].(int64)
		hard, ok3 := raw[i+2].(int64)
		total, ok4 := raw[i+3].(int64)
		pool, ok5 := raw[i+4].(int64)
		cut, ok6 := raw[i+5].(int64)
		if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || !ok6 {
			return bad("bucket")
		}
		r.buckets = append(r.buckets, bucketGrant{name: name, reserved: res, hard: hard, fleetUnits: total, pool: pool, cut: cut == 1})
	}
	return r, nil
}
