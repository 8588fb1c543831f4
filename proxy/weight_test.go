package proxy

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// weightTail is tenantTail with bob's weight set to w in the file.
func weightTail(t testing.TB, w string) string {
	tail := tenantTail(t)
	return strings.Replace(tail, "[[bucket]]\nname = \"bob\"\n", "[[bucket]]\nname = \"bob\"\nweight = "+w+"\n", 1)
}

// TestBucketWeight: a bucket's weight (DESIGN.md section 13) comes from
// the file, is changed with 0x2a "weight" (an absent "weight" keeps it, a
// bad one is refused with the reason), reaches the engine, shows in STAT
// throttle and kvthrottle_bucket_weight, survives a restart through the
// state file, and a reload applies the file's weight where no 0x2a set one.
func TestBucketWeight(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{throttle: "capacity = 9000\nfree_pool = \"fcfs\"", tail: weightTail(t, "2")})
	admin := login(t, p.Addr, "admin")
	stats := func(c *mcclient.Client) mcclient.ThrottleStats {
		t.Helper()
		kv, err := c.Stats("throttle")
		if err != nil {
			t.Fatal(err)
		}
		st, err := mcclient.ParseThrottleStats(kv)
		if err != nil {
			t.Fatalf("STAT throttle breaks its contract: %v", err)
		}
		return st
	}
	// want checks the weights in STAT throttle, the engine and the metrics.
	want := func(srv *Server, c *mcclient.Client, weights map[string]int) {
		t.Helper()
		st := stats(c)
		if st.Node.FreePoolMode != "fcfs" {
			t.Errorf("node:free_pool_mode %q, want fcfs", st.Node.FreePoolMode)
		}
		fams, err := srv.Metrics().Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*dto.MetricFamily{}
		for _, f := range fams {
			byName[f.GetName()] = f
		}
		for name, w := range weights {
			b, ok := st.Bucket(name)
			if !ok || !b.HasWeight || b.Weight != uint64(w) {
				t.Errorf("STAT throttle bucket %s: weight %d (reported %v), want %d", name, b.Weight, b.HasWeight, w)
			}
			if got := srv.throttle.Bucket(name).Weight(); got != w {
				t.Errorf("engine bucket %s: weight %d, want %d", name, got, w)
			}
			if got := testmc.SeriesValue(t, byName, "kvthrottle_bucket_weight", "bucket", name); got != float64(w) {
				t.Errorf("kvthrottle_bucket_weight{bucket=%q} = %v, want %d", name, got, w)
			}
		}
		if srv.throttle.FreePoolMode() != throttle.FreePoolFCFS {
			t.Errorf("engine free pool mode %v", srv.throttle.FreePoolMode())
		}
	}
	want(p.Server, admin, map[string]int{"default": 1, "alice": 1, "bob": 2})

	set := func(bucket, body string) *mcclient.Response {
		t.Helper()
		return adminDo(t, admin, mc.OpSetBucketThrottleProperties, bucket, body)
	}
	if r := set("alice", `{"reserved":10,"hard_limit":100,"weight":5}`); r.Status() != mc.StatusSuccess {
		t.Fatalf("set weight: %s %q", r.Status(), r.Value)
	}
	want(p.Server, admin, map[string]int{"alice": 5, "bob": 2})
	// Without "weight" the limits change and the weight stays.
	if r := set("alice", `{"reserved":20,"hard_limit":200}`); r.Status() != mc.StatusSuccess {
		t.Fatalf("set limits: %s %q", r.Status(), r.Value)
	}
	st := stats(admin)
	if a, _ := st.Bucket("alice"); a.Reserved != 20 || a.HardLimit != 200 || a.Weight != 5 {
		t.Fatalf("alice after a change without weight: %+v", a)
	}
	for body, reason := range map[string]string{
		`{"weight":0}`:                    "weight: must be an integer from 1 to 10000, got 0",
		`{"weight":10001}`:                "weight: must be an integer from 1 to 10000, got 10001",
		`{"weight":2.5}`:                  "weight: must be an integer from 1 to 10000, got 2.5",
		`{"weight":"3"}`:                  `weight: must be an integer from 1 to 10000, got "3"`,
		`{"reserved":1,"weight":"x"}`:     "weight: must be",
		`{"hard_limit":5,"weight":3}`:     "reserved is missing",
		`{"reserved":1,"weight":3,"x":1}`: `unknown field "x"`,
	} {
		r := set("alice", body)
		if r.Status() != mc.StatusEinval || !strings.Contains(string(r.Value), reason) {
			t.Errorf("%s: %s %q, want Einval %q", body, r.Status(), r.Value, reason)
		}
	}
	if r := set("nobody", `{"weight":3}`); r.Status() != mc.StatusKeyEnoent {
		t.Errorf("unknown bucket: %s", r.Status())
	}
	want(p.Server, admin, map[string]int{"alice": 5, "bob": 2}) // nothing refused changed anything
	// A tenant sees its own bucket's weight.
	if b := stats(login(t, p.Addr, "bob")); len(b.Buckets) != 1 || b.Buckets[0].Weight != 2 {
		t.Errorf("bob's own view: %+v", b.Buckets)
	}
	problems, err := testutil.GatherAndLint(p.Metrics().Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, pr := range problems {
		t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
	}

	// A restart on the same state file: alice's weight is the state's,
	// bob's the file's.
	admin.Close()
	p.stop(t)
	q := startProxyTo(t, p.MC, testConfig{tail: weightTail(t, "2"), statePath: p.StatePath})
	qa := login(t, q.Addr, "admin")
	want(q.Server, qa, map[string]int{"default": 1, "alice": 5, "bob": 2})
	st = stats(qa)
	if a, _ := st.Bucket("alice"); a.Reserved != 20 || a.HardLimit != 200 {
		t.Fatalf("alice's limits after the restart: %+v", a)
	}

	// A reload: the file's new weights apply where no 0x2a set one (bob),
	// the state's still win (alice, whose file weight changes too).
	tail := strings.Replace(weightTail(t, "4"), "[[bucket]]\nname = \"alice\"\n", "[[bucket]]\nname = \"alice\"\nweight = 9\n", 1)
	cfg, err := bucketcfg.Parse([]byte(testConfig{throttle: `free_pool = "fcfs"`, tail: tail}.render(q.opts.listen, []string{q.MC.Addr}, q.StatePath)))
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	want(q.Server, qa, map[string]int{"default": 1, "alice": 5, "bob": 4})
}

// In fleet mode a reload writes the file's changed throttle values to the
// fleet's state document: a weight the file changes is one of them, an
// unchanged or unset one is not.
func TestFileLimitChangesWeight(t *testing.T) {
	t.Parallel()
	parse := func(tail string) *bucketcfg.Config {
		t.Helper()
		cfg, err := bucketcfg.Parse([]byte("[proxy]\ndefault_bucket = \"\"\n" + tail))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	prev := parse("[[bucket]]\nname = \"a\"\nweight = 2\n[[bucket]]\nname = \"b\"\n[[bucket]]\nname = \"c\"\nweight = 3\n")
	next := parse("[[bucket]]\nname = \"a\"\nweight = 5\n[[bucket]]\nname = \"b\"\n[[bucket]]\nname = \"c\"\nweight = 3\n")
	if fileLimitChanges(prev, prev) != nil {
		t.Fatal("a change for an unchanged file")
	}
	change := fileLimitChanges(prev, next)
	if change == nil {
		t.Fatal("no change for a changed weight")
	}
	st := bucketcfg.NewState()
	if err := change(st); err != nil {
		t.Fatal(err)
	}
	if len(st.Weights) != 1 || st.Weights["a"] != 5 || len(st.Buckets) != 0 {
		t.Fatalf("state after the change: weights %v, buckets %v", st.Weights, st.Buckets)
	}
}
