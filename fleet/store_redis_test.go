package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// These tests run the store's Lua scripts in a real redis-server (the
// simulations use miniredis, which runs Lua with gopher-lua and its own
// command implementations): they check the properties the protocol rests
// on where it will run, and that both give the same answers.

func realStore(t *testing.T, name string) (*Store, *redis.Client) {
	t.Helper()
	r := testmc.StartRedis(t)
	st, err := OpenStore(r.URL(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { rdb.Close() })
	return st, rdb
}

// ctx5 is a test's context for its store calls: a liveness bound of a
// minute (its name is older than the bound).
func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// TestRedisSeedAndLoad: Seed stores the first document and a version; a
// second Seed leaves it alone and reports the version in force; Load
// returns what was seeded, and nothing before.
func TestRedisSeedAndLoad(t *testing.T) {
	st, _ := realStore(t, "seed")
	ctx := ctx5(t)
	if _, _, ok, err := st.Load(ctx); err != nil || ok {
		t.Fatalf("Load on an empty store: ok=%v err=%v, want nothing", ok, err)
	}
	v1, seeded, err := st.Seed(ctx, []byte(`{"a":1}`))
	if err != nil || !seeded || tokenVersion(t, v1) <= 0 {
		t.Fatalf("first Seed: token %q seeded %v err %v", v1, seeded, err)
	}
	v2, seeded, err := st.Seed(ctx, []byte(`{"b":2}`))
	if err != nil || seeded || v2 != v1 {
		t.Fatalf("second Seed: token %q seeded %v err %v, want %q false nil", v2, seeded, err, v1)
	}
	doc, v, ok, err := st.Load(ctx)
	if err != nil || !ok || v != v1 || string(doc) != `{"a":1}` {
		t.Fatalf("Load: %q token %q ok %v err %v, want the first document at %q", doc, v, ok, err, v1)
	}
	// Another life of the store (emptied, seeded again) has another id:
	// an instance that remembers the old token learns of the new document
	// even if the version numbers collide.
	if err := st.rdb.Del(ctx, st.keys[0]).Err(); err != nil {
		t.Fatal(err)
	}
	v3, seeded, err := st.Seed(ctx, []byte(`{"c":3}`))
	if err != nil || !seeded || v3 == v1 || strings.Split(v3, ":")[0] == strings.Split(v1, ":")[0] {
		t.Fatalf("seeding again: token %q (was %q) seeded %v err %v, want a new id", v3, v1, seeded, err)
	}
}

// TestRedisUpdateCompareAndSet: Update at the version in force stores the
// document under the next version; at an older version it is refused with
// ErrConflict and changes nothing.
func TestRedisUpdateCompareAndSet(t *testing.T) {
	st, _ := realStore(t, "cas")
	ctx := ctx5(t)
	v0, _, err := st.Seed(ctx, []byte(`{"n":0}`))
	if err != nil {
		t.Fatal(err)
	}
	v1, err := st.Update(ctx, v0, []byte(`{"n":1}`))
	if err != nil || tokenVersion(t, v1) != tokenVersion(t, v0)+1 {
		t.Fatalf("Update at the current version: %q, %v; want the version after %q", v1, err, v0)
	}
	if _, err := st.Update(ctx, v0, []byte(`{"n":2}`)); !errors.Is(err, ErrConflict) {
		t.Fatalf("Update at a stale version: %v, want ErrConflict", err)
	}
	doc, v, _, err := st.Load(ctx)
	if err != nil || v != v1 || string(doc) != `{"n":1}` {
		t.Fatalf("Load: %q at %q (%v), want {\"n\":1} at %q", doc, v, err, v1)
	}
}

// req builds one instance's report of one bucket "b" under hard limit
// 3000 (no reservation, no free pool), saturated (cap -1) unless cap is
// given.
func req(inst, epoch string, seq int64, known string, cum uint64, cap int64) *syncRequest {
	return &syncRequest{
		instance: inst, epoch: epoch, seq: seq, lease: time.Minute, knownToken: known, hint: 1,
		freePool: -1, fpCap: 0, fpWeight: 1,
		buckets: []bucketDemand{{name: "b", reserved: 0, hard: 3000, cum: cum, cap: cap, weight: 1}},
	}
}

// tokenVersion is the version part of a state token "id:version".
func tokenVersion(t *testing.T, tok string) int64 {
	t.Helper()
	_, v, ok := strings.Cut(tok, ":")
	n, err := strconv.ParseInt(v, 10, 64)
	if !ok || err != nil {
		t.Fatalf("token %q is not id:version", tok)
	}
	return n
}

func mustSync(t *testing.T, st *Store, r *syncRequest) *syncReply {
	t.Helper()
	rep, err := st.sync(ctx5(t), r)
	if err != nil {
		t.Fatalf("sync %s seq %d: %v", r.instance, r.seq, err)
	}
	return rep
}

func hardShare(t *testing.T, rep *syncReply) int64 {
	t.Helper()
	if rep.status != "ok" || len(rep.buckets) != 1 || rep.buckets[0].name != "b" {
		t.Fatalf("reply %+v: want status ok and bucket b", rep)
	}
	return rep.buckets[0].hard
}

// TestRedisSync checks the sync script's guarantees in a real Redis: an
// unseeded store answers "seed"; the hard-limit shares of two instances
// never add up to more than the limit; a report whose sequence number is
// not newer is "stale" and counts no usage; usage travels as running
// totals (only what is new counts) and a new epoch counts from zero; the
// state document comes back only when the caller's version is not the
// store's.
func TestRedisSync(t *testing.T) {
	st, rdb := realStore(t, "sync")
	ctx := ctx5(t)
	usage := func() int64 {
		t.Helper()
		n, err := rdb.HGet(ctx, "{kvthrottle:sync}:usage", "b").Int64()
		if err != nil {
			t.Fatalf("read the fleet's usage: %v", err)
		}
		return n
	}

	if rep := mustSync(t, st, req("a", "e1", 1, "", 0, -1)); rep.status != "seed" {
		t.Fatalf("sync on an empty store: status %q, want seed", rep.status)
	}
	ver, _, err := st.Seed(ctx, []byte(`{"state":1}`))
	if err != nil {
		t.Fatal(err)
	}

	// The shares each instance holds now; their sum is checked after
	// every call.
	held := map[string]int64{}
	call := func(r *syncRequest) *syncReply {
		t.Helper()
		rep := mustSync(t, st, r)
		held[r.instance] = hardShare(t, rep)
		if sum := held["a"] + held["b"]; sum > 3000 {
			t.Fatalf("after %s seq %d the shares are %v: %d > 3000", r.instance, r.seq, held, sum)
		}
		return rep
	}

	rep := call(req("a", "e1", 1, "", 100, -1))
	if string(rep.state) != `{"state":1}` || rep.token != ver {
		t.Fatalf("first sync: state %q token %q, want the seeded document at %q", rep.state, rep.token, ver)
	}
	if held["a"] != 3000 {
		t.Fatalf("a lone saturated instance got %d, want all 3000", held["a"])
	}
	rep = call(req("b", "e1", 1, ver, 50, -1))
	if rep.state != nil {
		t.Fatalf("sync at the store's version returned the state %q", rep.state)
	}
	if rep.instances != 2 {
		t.Fatalf("live instances %d, want 2", rep.instances)
	}
	// Both saturated with equal weight: the shares converge to 1500 each
	// as each calls in turn, never adding up to more than 3000.
	for seq := int64(2); seq <= 4; seq++ {
		call(req("a", "e1", seq, ver, uint64(100*seq), -1))
		call(req("b", "e1", seq, ver, uint64(50*seq), -1))
	}
	if held["a"] != 1500 || held["b"] != 1500 {
		t.Fatalf("after three rounds the shares are %v, want 1500 each", held)
	}
	if got := usage(); got != 400+200 {
		t.Fatalf("the fleet's usage is %d, want 600 (a's running total 400 plus b's 200)", got)
	}

	// A retry (same seq) and an older report: "stale", nothing counted.
	for _, seq := range []int64{4, 3} {
		r := mustSync(t, st, req("a", "e1", seq, ver, 900, -1))
		if r.status != "stale" {
			t.Fatalf("a report with seq %d after seq 4: status %q, want stale", seq, r.status)
		}
	}
	if got := usage(); got != 600 {
		t.Fatalf("stale reports changed the fleet's usage to %d, want 600", got)
	}

	// A restart: new epoch, seq from 1, running total from zero. Its 450
	// units count in full (not as 50 more than the old epoch's 400).
	rep = call(req("a", "e2", 1, ver, 450, -1))
	if rep.buckets[0].fleetUnits != 1050 || usage() != 1050 {
		t.Fatalf("after a's restart the fleet's usage is %d (reply %d), want 1050", usage(), rep.buckets[0].fleetUnits)
	}
	call(req("a", "e2", 2, ver, 465, -1))
	if got := usage(); got != 1065 {
		t.Fatalf("the fleet's usage is %d, want 1065 (only the new 15 counted)", got)
	}

	// A changed state document reaches the callers whose version differs.
	v2, err := st.Update(ctx, ver, []byte(`{"state":2}`))
	if err != nil {
		t.Fatal(err)
	}
	rep = call(req("b", "e1", 5, ver, 250, -1))
	if rep.token != v2 || string(rep.state) != `{"state":2}` {
		t.Fatalf("after an update: state %q token %q, want {\"state\":2} at %q", rep.state, rep.token, v2)
	}
	if rep = call(req("b", "e1", 6, v2, 250, -1)); rep.state != nil {
		t.Fatalf("sync at the new version returned the state %q", rep.state)
	}

	// A demand below its even share keeps what it asks and leaves the rest
	// (after the other calls) to the saturated instance.
	call(req("b", "e1", 7, v2, 260, 500))
	call(req("a", "e2", 3, v2, 480, -1))
	call(req("b", "e1", 8, v2, 270, 500))
	if held["a"]+held["b"] != 3000 || held["a"] < 2000 {
		t.Fatalf("with b wanting 500, the shares are %v; want a to hold the rest", held)
	}
}

// TestRedisFleetUpdateConcurrent: four instances (four Fleets, each its
// own connection pool) change the fleet's state document at once, each
// adding its own fields, starting from an empty store. Compare-and-set
// (and seeding once) keeps every change.
func TestRedisFleetUpdateConcurrent(t *testing.T) {
	r := testmc.StartRedis(t)
	const writers, each = 4, 8
	var fleets []*Fleet
	for i := 0; i < writers; i++ {
		st, err := OpenStore(r.URL(), "upd")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		f, err := New(Config{Store: st, Instance: fmt.Sprintf("i%d", i), Period: time.Second}, Hooks{
			Usage:   func(dst []Usage) (Node, []Usage) { return Node{}, dst },
			State:   func([]byte, string) error { return nil },
			Seed:    func() []byte { return []byte(`{}`) },
			Granted: func(*Grants) {},
			Synced:  func(time.Duration, error) {},
		})
		if err != nil {
			t.Fatal(err)
		}
		fleets = append(fleets, f)
	}
	ctx := ctx5(t)
	var wg sync.WaitGroup
	errs := make(chan error, writers*each)
	for i, f := range fleets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; k < each; k++ {
				key := fmt.Sprintf("w%d-%d", i, k)
				for {
					_, err := f.Update(ctx, func(doc []byte) ([]byte, error) {
						m := map[string]int{}
						if doc != nil {
							if err := json.Unmarshal(doc, &m); err != nil {
								return nil, err
							}
						}
						m[key] = k
						// Widen the window between the read and the write.
						time.Sleep(time.Millisecond)
						return json.Marshal(m)
					})
					if errors.Is(err, ErrConflict) {
						continue // lost eight races in a row: try again
					}
					if err != nil {
						errs <- err
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Update: %v", err)
	}
	st, _ := OpenStore(r.URL(), "upd")
	defer st.Close()
	doc, _, ok, err := st.Load(ctx)
	if err != nil || !ok {
		t.Fatalf("Load: ok %v err %v", ok, err)
	}
	m := map[string]int{}
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	var lost []string
	for i := 0; i < writers; i++ {
		for k := 0; k < each; k++ {
			if key := fmt.Sprintf("w%d-%d", i, k); m[key] != k {
				lost = append(lost, key)
			} else {
				delete(m, key)
			}
		}
	}
	if len(lost) > 0 || len(m) > 0 {
		t.Fatalf("changes lost: %v; unexpected fields: %v", lost, m)
	}
}

// scenarioStep is the time-independent part of one sync reply.
type scenarioStep struct {
	Status    string
	Instances int
	FreePool  int64
	Buckets   []bucketGrant
	State     string
}

// runScenario drives a fixed sequence of reports from three instances
// (two buckets, a reservation, a free pool, mixed demands, a retry and a
// restart) and records the replies without their times and versions.
func runScenario(t *testing.T, st *Store) []scenarioStep {
	t.Helper()
	ctx := ctx5(t)
	if _, _, err := st.Seed(ctx, []byte(`{"s":1}`)); err != nil {
		t.Fatal(err)
	}
	type inst struct {
		name, epoch string
		seq         int64
		known       string
		cum         [2]uint64
	}
	ins := []*inst{{name: "x", epoch: "1"}, {name: "y", epoch: "1"}, {name: "z", epoch: "1"}}
	var out []scenarioStep
	for round := 0; round < 6; round++ {
		for i, in := range ins {
			if round == 4 && i == 1 { // y restarts
				in.epoch, in.seq, in.cum = "2", 0, [2]uint64{}
			}
			in.seq++
			in.cum[0] += uint64(700*(i+1) + 13*round)
			in.cum[1] += uint64(300 + 91*i*round)
			capA := int64(-1)
			if i == 2 {
				capA = int64(200 + 150*round)
			}
			w := 1 + float64(i)*0.75
			r := &syncRequest{
				instance: in.name, epoch: in.epoch, seq: in.seq, lease: time.Minute, knownToken: in.known, hint: 1,
				freePool: 3000, fpCap: int64(400 * (i + round)), fpWeight: w,
				buckets: []bucketDemand{
					{name: "a", reserved: 1000, hard: 2500, cum: in.cum[0], cap: capA, weight: w},
					{name: "c", reserved: -1, hard: 1200, cum: in.cum[1], cap: int64(100 + 250*i), weight: 1},
				},
			}
			rep := mustSync(t, st, r)
			if round == 3 && i == 0 { // a retry of the same report
				rep = mustSync(t, st, r)
			}
			if rep.state != nil {
				in.known = rep.token
			}
			out = append(out, scenarioStep{rep.status, rep.instances, rep.freePool, rep.buckets, string(rep.state)})
		}
	}
	return out
}

// TestRedisMatchesMiniredis: the same reports give the same shares,
// usage counts and statuses in a real redis-server and in miniredis, so
// the simulations (which run on miniredis) say how the protocol behaves in
// production.
func TestRedisMatchesMiniredis(t *testing.T) {
	real, _ := realStore(t, "same")
	mr := miniredis.RunT(t)
	mrdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { mrdb.Close() })
	mini := newStore(mrdb, "same")

	got, want := runScenario(t, real), runScenario(t, mini)
	if len(got) != len(want) {
		t.Fatalf("real Redis gave %d replies, miniredis %d", len(got), len(want))
	}
	var shares int
	for i := range got {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Errorf("reply %d: real Redis %+v, miniredis %+v", i, got[i], want[i])
		}
		for _, b := range got[i].Buckets {
			if b.hard > 0 {
				shares++
			}
		}
	}
	if shares == 0 {
		t.Fatal("the scenario granted nothing: it compares nothing")
	}
	if last := got[len(got)-1]; last.Status != "ok" || last.Instances != 3 {
		t.Fatalf("last reply %+v: want ok from 3 instances", last)
	}
	t.Logf("%d replies agree; last: %+v", len(got), got[len(got)-1])
}

// TestOpenStoreKinds: the URL picks one server, Sentinel or Cluster.
func TestOpenStoreKinds(t *testing.T) {
	for url, want := range map[string]string{
		"redis://127.0.0.1:6379/0":                                       "*redis.Client",
		"rediss://u:p@cache.example:6380/2":                              "*redis.Client",
		"redis://127.0.0.1:26379?master_name=main&addr=127.0.0.1:26380":  "*redis.Client",
		"redis://127.0.0.1:7000?addr=127.0.0.1:7001&addr=127.0.0.1:7002": "*redis.ClusterClient",
	} {
		st, err := OpenStore(url, "t")
		if err != nil {
			t.Errorf("%s: %v", url, err)
			continue
		}
		if got := fmt.Sprintf("%T", st.rdb); got != want {
			t.Errorf("%s: client %s, want %s", url, got, want)
		}
		st.Close()
	}
	for _, url := range []string{"http://x", "redis://127.0.0.1:7000?addr=x&bogus=1", "redis://%zz"} {
		if _, err := OpenStore(url, "t"); err == nil {
			t.Errorf("%s: no error", url)
		}
	}
}

// TestOpenStoreErrorsHideThePassword: a malformed redis_url is reported
// without the password it holds.
func TestOpenStoreErrorsHideThePassword(t *testing.T) {
	for _, url := range []string{
		"redis://u:S3cretPw@127.0.0.1:63x9/0",
		"redis://u:S3cretPw@127.0.0.1:6379/notadb",
		"redis://u:S3cretPw@127.0.0.1:6379?addr=h:1&bogus=S3cretPw",
		"redis://:S3c%retPw@127.0.0.1:6379/0",
		"redis://127.0.0.1:6379/0?password=S3cretPw&bogus=S3cretPw",
	} {
		_, err := OpenStore(url, "t")
		if err == nil {
			t.Errorf("%s: no error", url)
			continue
		}
		if strings.Contains(err.Error(), "S3cretPw") || strings.Contains(err.Error(), "%re") {
			t.Errorf("the error shows the password: %v", err)
		}
	}
}

// TestRedisReviewGuards: what an outside review found, each against a real
// Redis: two live instances under one name; instances whose limits
// disagree; records that are not the script's; an emptied store's first
// caller while earlier instances may still hold shares.
func TestRedisReviewGuards(t *testing.T) {
	st, rdb := realStore(t, "guards")
	ctx := ctx5(t)
	tok, _, err := st.Seed(ctx, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	status := func(r *syncRequest) string {
		t.Helper()
		return mustSync(t, st, r).status
	}

	// One name, two runs: a restart (seq 1) takes the name back; a second
	// live run that is not starting gets "conflict" and changes nothing.
	mustSync(t, st, req("a", "e1", 1, tok, 0, -1))
	mustSync(t, st, req("a", "e1", 2, tok, 10, -1))
	if s := status(req("a", "twin", 5, tok, 10, -1)); s != "conflict" {
		t.Errorf("a second live run of name a: status %q, want conflict", s)
	}
	if s := status(req("a", "e2", 1, tok, 0, -1)); s != "ok" {
		t.Errorf("a restart of a (seq 1): status %q, want ok", s)
	}
	if s := status(req("a", "e1", 3, tok, 20, -1)); s != "conflict" {
		t.Errorf("the old run of a after the restart: status %q, want conflict", s)
	}

	// Limits that disagree: b has 6000 in its file, a 3000. The shares
	// never add up to more than the lowest.
	rb := req("b", "e1", 1, tok, 0, -1)
	rb.buckets[0].hard = 6000
	held := map[string]int64{}
	for seq := int64(2); seq < 6; seq++ {
		ra := req("a", "e2", seq, tok, 0, -1)
		held["a"] = hardShare(t, mustSync(t, st, ra))
		rb.seq = seq
		held["b"] = hardShare(t, mustSync(t, st, rb))
		if held["a"]+held["b"] > 3000 {
			t.Fatalf("with limits 3000 and 6000 the shares are %v", held)
		}
	}

	// Garbage in the fleet's keys: ignored or dropped, never fatal.
	rdb.HSet(ctx, "{kvthrottle:guards}:members", "junk", "garbage")
	rdb.HSet(ctx, "{kvthrottle:guards}:entries", "b|a", "x y")
	rb.seq = 10
	if rep := mustSync(t, st, rb); rep.status != "ok" || len(rep.buckets) != 1 {
		t.Errorf("with junk records: %+v", rep)
	}
	if n, _ := rdb.HExists(ctx, "{kvthrottle:guards}:members", "junk").Result(); n {
		t.Errorf("the junk member record was kept")
	}
	rdb.HSet(ctx, "{kvthrottle:guards}:config", "version", "abc")
	rb.seq = 11
	if s := status(rb); s != "seed" {
		t.Errorf("with a version that is no number: status %q, want seed", s)
	}
	if _, seeded, err := st.Seed(ctx, []byte(`{}`)); err != nil || !seeded {
		t.Errorf("seeding over a junk version: seeded %v, %v", seeded, err)
	}

	// The store emptied and seeded again: its first caller, which knew of
	// three instances, takes at most a third until the others have called
	// or a lease has passed.
	rdb.Del(ctx, "{kvthrottle:guards}:config", "{kvthrottle:guards}:members", "{kvthrottle:guards}:entries")
	tok, _, err = st.Seed(ctx, []byte(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	first := req("c", "e1", 1, tok, 0, -1)
	first.hint = 3
	if got := hardShare(t, mustSync(t, st, first)); got > 1000 {
		t.Errorf("the first caller of a reseeded store took %d of 3000, knowing of 3 instances", got)
	}
}

// fleetOn makes a Fleet of instance name against the store at url, with
// hooks that report one saturated bucket "b" (hard limit 3000) and record
// the state documents offered.
func fleetOn(t *testing.T, url, name string, state func([]byte, string) error) *Fleet {
	t.Helper()
	st, err := OpenStore(url, "fl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if state == nil {
		state = func([]byte, string) error { return nil }
	}
	// The tests drive syncOnce by hand and stop no store: a call's
	// timeout is a liveness bound, not the default half period (100 ms),
	// which a loaded machine's Redis round trip can exceed.
	f, err := New(Config{Store: st, Instance: name, Period: 200 * time.Millisecond, CallTimeout: 20 * time.Second}, Hooks{
		Usage: func(dst []Usage) (Node, []Usage) {
			return Node{Capacity: throttle.Unlimited, FreePool: throttle.Unlimited},
				append(dst, Usage{Name: "b", Reserved: 0, HardLimit: 3000, Waiting: 4})
		},
		State:   state,
		Seed:    func() []byte { return []byte(`{}`) },
		Granted: func(*Grants) {},
		Synced:  func(time.Duration, error) {},
	})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestRedisTwinsMoveApart: two live instances configured with one name
// end up under two names, and their shares add up to the limit at most.
func TestRedisTwinsMoveApart(t *testing.T) {
	r := testmc.StartRedis(t)
	a, b := fleetOn(t, r.URL(), "same", nil), fleetOn(t, r.URL(), "same", nil)
	for i := 0; i < 6; i++ {
		a.sample()
		a.syncOnce()
		b.sample()
		b.syncOnce()
	}
	if a.Instance() == b.Instance() {
		t.Fatalf("both still report as %q", a.Instance())
	}
	ga, _ := a.Grants().Bucket("b")
	gb, _ := b.Grants().Bucket("b")
	if a.Grants().Instances() != 2 || ga.HardLimit+gb.HardLimit > 3000 || ga.HardLimit <= 0 || gb.HardLimit <= 0 {
		t.Errorf("twins %q and %q: %d live, shares %d + %d of 3000", a.Instance(), b.Instance(), a.Grants().Instances(), ga.HardLimit, gb.HardLimit)
	}
}

// TestRedisStateRetriedAndNotStale: a state document the instance could not
// adopt is offered again at the next sync; a document read before the
// instance's own Update landed is not offered at all.
func TestRedisStateRetriedAndNotStale(t *testing.T) {
	r := testmc.StartRedis(t)
	var offered []string
	refuse := true
	f := fleetOn(t, r.URL(), "i", func(doc []byte, tok string) error {
		offered = append(offered, string(doc))
		if refuse {
			refuse = false
			return errors.New("disk full")
		}
		return nil
	})
	f.syncOnce() // seeds {} and offers it: refused
	f.syncOnce() // offered again: adopted
	f.syncOnce() // nothing new
	if len(offered) != 2 || offered[0] != `{}` || offered[1] != `{}` {
		t.Fatalf("offered %q, want the refused document once more and then nothing", offered)
	}

	// An Update of this instance lands while its sync is in flight: the
	// sync's (older) document must not be offered.
	opts, _ := redis.ParseURL(r.URL())
	other := redis.NewClient(opts)
	defer other.Close()
	otherStore := newStore(other, "fl")
	if _, err := otherStore.Update(ctx5(t), mustToken(t, otherStore), []byte(`{"v":2}`)); err != nil {
		t.Fatal(err)
	}
	done := false
	f.cfg.Store.rdb.AddHook(procHook(func(next redis.ProcessHook) redis.ProcessHook {
		return func(ctx context.Context, cmd redis.Cmder) error {
			err := next(ctx, cmd)
			// The sync script is the call with many arguments.
			if !done && (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(cmd.Args()) > 8 {
				done = true
				if _, err := f.Update(context.Background(), func([]byte) ([]byte, error) { return []byte(`{"v":3}`), nil }); err != nil {
					t.Error(err)
				}
			}
			return err
		}
	}))
	offered = nil
	f.syncOnce()
	for _, d := range offered {
		if d == `{"v":2}` {
			t.Errorf("the document read before this instance's update was offered: %q", offered)
		}
	}
}

func mustToken(t *testing.T, st *Store) string {
	t.Helper()
	_, tok, ok, err := st.Load(ctx5(t))
	if err != nil || !ok {
		t.Fatalf("load: %v %v", ok, err)
	}
	return tok
}
