package fleet

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed sync.lua
var syncLua string

//go:embed seed.lua
var seedLua string

//go:embed update.lua
var updateLua string

var (
	syncScript   = redis.NewScript(syncLua)
	seedScript   = redis.NewScript(seedLua)
	updateScript = redis.NewScript(updateLua)
)

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
func OpenStore(rawURL, name string) (*Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("fleet: redis_url: %w", err)
	}
	q := u.Query()
	// The caller bounds every call with a context deadline; go-redis's own
	// retries would only make a late reply later.
	const retries, dial, pool = -1, 2 * time.Second, 4
	switch {
	case q.Has("master_name"):
		opts, err := redis.ParseFailoverURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("fleet: redis_url (Sentinel): %w", err)
		}
		opts.MaxRetries, opts.DialTimeout, opts.PoolSize, opts.ContextTimeoutEnabled = retries, dial, pool, true
		return newStore(redis.NewFailoverClient(opts), name), nil
	case q.Has("addr"):
		opts, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, fmt.Errorf("fleet: redis_url (Cluster): %w", err)
		}
		opts.MaxRetries, opts.DialTimeout, opts.PoolSize, opts.ContextTimeoutEnabled = retries, dial, pool, true
		return newStore(redis.NewClusterClient(opts), name), nil
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("fleet: redis_url: %w", err)
	}
	opts.MaxRetries, opts.DialTimeout, opts.PoolSize, opts.ContextTimeoutEnabled = retries, dial, pool, true
	return newStore(redis.NewClient(opts), name), nil
}

func newStore(rdb redis.UniversalClient, name string) *Store {
	tag := "{kvthrottle:" + name + "}"
	return &Store{rdb: rdb, keys: []string{tag + ":config", tag + ":members", tag + ":entries", tag + ":usage"}}
}

// Close closes the connections to the store.
func (s *Store) Close() error { return s.rdb.Close() }

// Load returns the fleet's state document and its version; ok is false
// when the store holds none yet.
func (s *Store) Load(ctx context.Context) (doc []byte, version int64, ok bool, err error) {
	vals, err := s.rdb.HMGet(ctx, s.keys[0], "state", "version").Result()
	if err != nil {
		return nil, 0, false, fmt.Errorf("fleet: load state: %w", err)
	}
	st, _ := vals[0].(string)
	vs, _ := vals[1].(string)
	if vs == "" {
		return nil, 0, false, nil
	}
	v, err := strconv.ParseInt(vs, 10, 64)
	if err != nil {
		return nil, 0, false, fmt.Errorf("fleet: load state: bad version %q", vs)
	}
	return []byte(st), v, true, nil
}

// Seed makes doc the fleet's state document if the store holds none, and
// returns the version in force and whether doc was stored.
func (s *Store) Seed(ctx context.Context, doc []byte) (version int64, seeded bool, err error) {
	r, err := seedScript.Run(ctx, s.rdb, s.keys[:1], string(doc)).Slice()
	if err != nil {
		return 0, false, fmt.Errorf("fleet: seed state: %w", err)
	}
	if len(r) != 2 {
		return 0, false, fmt.Errorf("fleet: seed state: reply of %d elements", len(r))
	}
	v, _ := r[0].(int64)
	n, _ := r[1].(int64)
	return v, n == 1, nil
}

// Update replaces the fleet's state document with doc if its version is
// still version, and returns the new version; ErrConflict when it moved on.
func (s *Store) Update(ctx context.Context, version int64, doc []byte) (int64, error) {
	v, err := updateScript.Run(ctx, s.rdb, s.keys[:1], strconv.FormatInt(version, 10), string(doc)).Int64()
	if err != nil {
		return 0, fmt.Errorf("fleet: update state: %w", err)
	}
	if v < 0 {
		return 0, ErrConflict
	}
	return v, nil
}

// syncRequest is one instance's report for one period. Limits and caps use
// -1 for unlimited.
type syncRequest struct {
	instance, epoch string
	seq             int64
	lease           time.Duration
	knownVersion    int64
	freePool        int64
	fpCap           int64
	fpWeight        float64
	buckets         []bucketDemand
}

// bucketDemand is what an instance says about one bucket in a report.
type bucketDemand struct {
	name           string
	reserved, hard int64   // the fleet's limits, as this instance has them
	cum            uint64  // units used here since the epoch began
	cap            int64   // units/s wanted; -1: as much as it can get
	weight         float64 // how strongly (held callers), > 0
}

// syncReply is the store's answer to a syncRequest.
type syncReply struct {
	status    string // "ok", "stale", "seed"
	now       time.Duration
	instances int
	version   int64
	state     []byte // the fleet's state document when version != knownVersion
	freePool  int64
	buckets   []bucketGrant
}

// bucketGrant is the caller's share of one bucket's limits.
type bucketGrant struct {
	name           string
	reserved, hard int64 // units/s; -1 unlimited
	fleetUnits     int64 // units used by the whole fleet, ever
}

func (s *Store) sync(ctx context.Context, req *syncRequest) (*syncReply, error) {
	args := make([]any, 0, 9+6*len(req.buckets))
	args = append(args, req.instance, req.epoch, req.seq, req.lease.Milliseconds(), req.knownVersion,
		req.freePool, req.fpCap, strconv.FormatFloat(req.fpWeight, 'f', 3, 64), len(req.buckets))
	for _, b := range req.buckets {
		args = append(args, b.name, b.reserved, b.hard, b.cum, b.cap, strconv.FormatFloat(b.weight, 'f', 3, 64))
	}
	raw, err := syncScript.Run(ctx, s.rdb, s.keys, args...).Slice()
	if err != nil {
		return nil, fmt.Errorf("fleet: sync: %w", err)
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
	if len(raw) < 6 || (len(raw)-6)%4 != 0 {
		return bad("length")
	}
	n, ok1 := raw[2].(int64)
	v, ok2 := raw[3].(int64)
	st, ok3 := raw[4].(string)
	fp, ok4 := raw[5].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return bad("header")
	}
	r.instances, r.version, r.freePool = int(n), v, fp
	if st != "" {
		r.state = []byte(st)
	}
	r.buckets = make([]bucketGrant, 0, (len(raw)-6)/4)
	for i := 6; i < len(raw); i += 4 {
		name, ok1 := raw[i].(string)
		res, ok2 := raw[i+1].(int64)
		hard, ok3 := raw[i+2].(int64)
		total, ok4 := raw[i+3].(int64)
		if !ok1 || !ok2 || !ok3 || !ok4 {
			return bad("bucket")
		}
		r.buckets = append(r.buckets, bucketGrant{name: name, reserved: res, hard: hard, fleetUnits: total})
	}
	return r, nil
}
