package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

func TestSASL(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	c := dial(t, p.Addr)
	r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLListMechs})
	if err != nil || r.Status() != mc.StatusSuccess || !strings.Contains(string(r.Value), "PLAIN") {
		t.Fatalf("list mechs: %v %+v", err, r)
	}
	for name, v := range map[string]string{
		"wrong password": "\x00alice\x00nope",
		"unknown user":   "\x00mallory\x00alice-pw",
		"malformed":      "alice",
	} {
		r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte(v)})
		if status(t, r, err) != mc.StatusAuthError {
			t.Errorf("%s: status %s, want AuthError", name, r.Status())
		}
		if bytes.Contains(r.Value, []byte("alice-pw")) {
			t.Errorf("%s: response leaks the password", name)
		}
	}
	if r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("CRAM-MD5"), Value: []byte("x")}); status(t, r, err) != mc.StatusAuthError {
		t.Errorf("unknown mechanism: %s", r.Status())
	}
	// Still usable after failures, and after success the bucket named
	// like the user is selected.
	login(t, p.Addr, "alice")
}

// TestTenantIsolation: no tenant can read, overwrite, delete or flush
// another's keys, nor select its bucket.
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	alice, bob := login(t, p.Addr, "alice"), login(t, p.Addr, "bob")
	anon := dial(t, p.Addr)
	key := []byte("shared-name")
	for c, v := range map[*mcclient.Client]string{alice: "alice's", bob: "bob's", anon: "default's"} {
		if r, err := c.Set(key, []byte(v)); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("set: %s", r.Status())
		}
	}
	for c, v := range map[*mcclient.Client]string{alice: "alice's", bob: "bob's", anon: "default's"} {
		r, err := c.Do(mcclient.Request{Opcode: mc.OpGetK, Key: key})
		if status(t, r, err) != mc.StatusSuccess || string(r.Value) != v || !bytes.Equal(r.Key, key) {
			t.Fatalf("GETK: got %q key %q, want %q key %q", r.Value, r.Key, v, key)
		}
	}
	// Bob deletes his key; alice's stays.
	if r, err := bob.Delete(key); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("bob delete: %s", r.Status())
	}
	if r, err := alice.Get(key); status(t, r, err) != mc.StatusSuccess || string(r.Value) != "alice's" {
		t.Fatalf("alice's key after bob's delete: %s %q", r.Status(), r.Value)
	}
	// Bob may not select alice's bucket; unknown buckets are KeyEnoent.
	if r, err := bob.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("alice")}); status(t, r, err) != mc.StatusEaccess {
		t.Fatalf("bob selects alice: %s, want Eaccess", r.Status())
	}
	if r, err := anon.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("alice")}); status(t, r, err) != mc.StatusEaccess {
		t.Fatalf("anonymous selects alice: %s, want Eaccess", r.Status())
	}
	if r, err := bob.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("nope")}); status(t, r, err) != mc.StatusKeyEnoent {
		t.Fatalf("select unknown: %s, want KeyEnoent", r.Status())
	}
	// FLUSH: refused where not enabled, and alice's flush empties only
	// alice's bucket.
	if r, err := bob.Do(mcclient.Request{Opcode: mc.OpFlush}); status(t, r, err) != mc.StatusEaccess {
		t.Fatalf("bob flush: %s, want Eaccess", r.Status())
	}
	if r, err := anon.Set([]byte("dflt"), []byte("x")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	if r, err := alice.Do(mcclient.Request{Opcode: mc.OpFlush}); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("alice flush: %s", r.Status())
	}
	if r, err := alice.Get(key); status(t, r, err) != mc.StatusKeyEnoent {
		t.Fatalf("alice's key after her flush: %s", r.Status())
	}
	if r, err := anon.Get([]byte("dflt")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("default's key after alice's flush: %s", r.Status())
	}
	// Keys too long once namespaced are refused, never truncated.
	long := bytes.Repeat([]byte("k"), 248)
	if r, err := alice.Set(long, []byte("v")); status(t, r, err) != mc.StatusEinval {
		t.Fatalf("248-byte key in bucket alice: %s, want Einval", r.Status())
	}
	// STAT shows a tenant only its own bucket; other groups are admin-only.
	kv, err := alice.Stats("throttle")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range kv {
		if strings.HasPrefix(p[0], "bucket:") && !strings.HasPrefix(p[0], "bucket:alice:") {
			t.Fatalf("alice sees %s", p[0])
		}
	}
	// (answered as an empty group: TestStatRefusedGroups)
	if kv, err := alice.Stats("items"); err != nil || len(kv) != 0 {
		t.Fatalf("alice STAT items: %v %q, want an empty group", err, kv)
	}
}

func TestAuthRequired(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tenantTail(t)})
	c := dial(t, p.Addr)
	if r, err := c.Get([]byte("k")); status(t, r, err) != mc.StatusEaccess {
		t.Fatalf("GET before auth: %s, want Eaccess", r.Status())
	}
	for _, op := range []mc.Opcode{mc.OpNoop, mc.OpVersion} {
		if r, err := c.Do(mcclient.Request{Opcode: op}); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("%s before auth: %s", op, r.Status())
		}
	}
	// The admin has no bucket named like itself: it must select one.
	a := login(t, p.Addr, "admin")
	if r, err := a.Get([]byte("k")); status(t, r, err) != mc.StatusEaccess {
		t.Fatalf("admin GET without bucket: %s", r.Status())
	}
	if r, err := a.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("bob")}); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("admin selects bob: %s", r.Status())
	}
	if r, err := a.Get([]byte("k")); status(t, r, err) != mc.StatusKeyEnoent {
		t.Fatalf("admin GET in bob: %s", r.Status())
	}
}

// TestAdminOpcodes covers every rule of DESIGN.md section 5.
func TestAdminOpcodes(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	admin, alice := login(t, p.Addr, "admin"), login(t, p.Addr, "alice")
	setB, setN := mc.OpSetBucketThrottleProperties, mc.OpSetNodeThrottleProperties
	cases := []struct {
		name   string
		c      *mcclient.Client
		op     mc.Opcode
		key    string
		body   string
		status mc.Status
	}{
		{"unprivileged bucket", alice, setB, "alice", `{"reserved":1,"hard_limit":2}`, mc.StatusEaccess},
		{"unprivileged node", alice, setN, "", `{"capacity":100}`, mc.StatusEaccess},
		{"bad json", admin, setB, "alice", `{"reserved":`, mc.StatusEinval},
		{"wrong type", admin, setB, "alice", `{"reserved":true}`, mc.StatusEinval},
		{"other string", admin, setB, "alice", `{"reserved":"lots"}`, mc.StatusEinval},
		{"negative", admin, setB, "alice", `{"reserved":-1,"hard_limit":5}`, mc.StatusEinval},
		{"non-integer", admin, setB, "alice", `{"reserved":1.5,"hard_limit":5}`, mc.StatusEinval},
		{"reserved over hard", admin, setB, "alice", `{"reserved":10,"hard_limit":5}`, mc.StatusEinval},
		{"unknown bucket", admin, setB, "nope", `{"reserved":1,"hard_limit":5}`, mc.StatusKeyEnoent},
		{"unlimited", admin, setB, "bob", `{"reserved":"unlimited","hard_limit":"unlimited"}`, mc.StatusSuccess},
		{"numbers", admin, setB, "alice", `{"reserved":100,"hard_limit":500}`, mc.StatusSuccess},
		{"node bad", admin, setN, "", `{"capacity":"big"}`, mc.StatusEinval},
		{"node key", admin, setN, "x", `{"capacity":100}`, mc.StatusEinval},
		{"node ok", admin, setN, "", `{"capacity":20000,"default_throttle_reserved_units":10,"default_throttle_hard_limit":1000}`, mc.StatusSuccess},
	}
	for _, tc := range cases {
		r := adminDo(t, tc.c, tc.op, tc.key, tc.body)
		if r.Status() != tc.status {
			t.Errorf("%s: status %s (%q), want %s", tc.name, r.Status(), r.Value, tc.status)
		}
		if tc.status == mc.StatusEinval && len(r.Value) == 0 {
			t.Errorf("%s: Einval without a reason", tc.name)
		}
	}
	// Applied: STAT throttle shows it.
	st := throttleStats(t, admin)
	if st["node:capacity"] != "20000" || st["bucket:alice:reserved"] != "100" || st["bucket:alice:hard_limit"] != "500" || st["bucket:bob:reserved"] != "unlimited" {
		t.Fatalf("stats after changes: %v", st)
	}
	// Persisted before the response.
	data, err := os.ReadFile(p.StatePath)
	if err != nil {
		t.Fatalf("state file: %v", err)
	}
	var js map[string]any
	if err := json.Unmarshal(data, &js); err != nil {
		t.Fatalf("state file is not JSON: %v", err)
	}
	if !bytes.Contains(data, []byte(`"alice"`)) || !bytes.Contains(data, []byte("20000")) {
		t.Fatalf("state file lacks the changes: %s", data)
	}
}

func throttleStats(t testing.TB, c *mcclient.Client) map[string]string {
	t.Helper()
	kv, err := c.Stats("throttle")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, p := range kv {
		m[p[0]] = p[1]
	}
	return m
}

// TestAdminChangeSurvivesRestart: a new proxy on the same state file has
// the runtime limits, overriding the TOML values.
func TestAdminChangeSurvivesRestart(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "bob", `{"reserved":7,"hard_limit":70}`); r.Status() != mc.StatusSuccess {
		t.Fatalf("set: %s %q", r.Status(), r.Value)
	}
	if r := adminDo(t, admin, mc.OpSetNodeThrottleProperties, "", `{"capacity":1234}`); r.Status() != mc.StatusSuccess {
		t.Fatalf("set node: %s %q", r.Status(), r.Value)
	}
	admin.Close()
	p.stop(t)
	q := startProxyTo(t, p.MC, testConfig{tail: tenantTail(t), statePath: p.StatePath})
	st := throttleStats(t, login(t, q.Addr, "admin"))
	if st["bucket:bob:reserved"] != "7" || st["bucket:bob:hard_limit"] != "70" || st["node:capacity"] != "1234" {
		t.Fatalf("after restart: %v", st)
	}
}

// TestAdminChangeAltersThrottling: lowering a hard limit makes a
// non-blocking client get EWouldThrottle with the real wait.
func TestAdminChangeAltersThrottling(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`, tail: tenantTail(t)})
	admin, bob := login(t, p.Addr, "admin"), login(t, p.Addr, "bob")
	hello(t, bob, mc.FeatureNonBlockingThrottlingMode)
	// burstUntilThrottled sends 1000 SETs at once and returns the first
	// EWouldThrottle answer, or nil. Pipelined, they reach the proxy
	// together: a hard limit of 100 units/s (a 10-unit burst) refuses all
	// but the first few, however slow the machine, where 20,000 SETs one
	// at a time (which this was) took 40,000 round trips to show it.
	burstUntilThrottled := func() *mcclient.Response {
		const n = 1000
		for range n {
			bob.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte("k"), Value: []byte("v")})
		}
		if err := bob.Flush(); err != nil {
			t.Fatal(err)
		}
		var first *mcclient.Response
		for range n {
			r, err := bob.Read()
			if err != nil {
				t.Fatal(err)
			}
			if first == nil && r.Status() == mc.StatusEWouldThrottle {
				first = r
			}
		}
		return first
	}
	if r := burstUntilThrottled(); r != nil {
		t.Fatalf("throttled before any limit: %q", r.Value)
	}
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "bob", `{"reserved":0,"hard_limit":100}`); r.Status() != mc.StatusSuccess {
		t.Fatalf("set: %s %q", r.Status(), r.Value)
	}
	r := burstUntilThrottled()
	if r == nil {
		t.Fatal("never throttled at hard limit 100 u/s")
	}
	var body struct {
		NextTickUS int64 `json:"next_tick_us"`
	}
	if err := json.Unmarshal(r.Value, &body); err != nil || body.NextTickUS <= 0 || body.NextTickUS > 1_000_000 {
		t.Fatalf("EWouldThrottle body %q: %v", r.Value, err)
	}
	// Raising the limit lets bob run again.
	if r := adminDo(t, admin, mc.OpSetBucketThrottleProperties, "bob", `{}`); r.Status() != mc.StatusSuccess {
		t.Fatalf("set unlimited: %s", r.Status())
	}
	if r := burstUntilThrottled(); r != nil {
		t.Fatalf("still throttled after removing the limit: %q", r.Value)
	}
}

// TestReloadBuckets: a reload adds a bucket, which gets the current node
// defaults (set at runtime with 0x2c), and removes one, whose sessions
// are closed once their responses are written.
func TestReloadBuckets(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetNodeThrottleProperties, "", `{"default_throttle_reserved_units":11,"default_throttle_hard_limit":111}`); r.Status() != mc.StatusSuccess {
		t.Fatalf("set defaults: %s %q", r.Status(), r.Value)
	}
	bob := login(t, p.Addr, "bob")
	if r, err := bob.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	// The new file: bob is gone, carol is new.
	tail := strings.Replace(tenantTail(t), "[[bucket]]\nname = \"bob\"\n", "[[bucket]]\nname = \"carol\"\n", 1)
	tail = strings.Replace(tail, `buckets = ["bob"]`, `buckets = ["carol"]`, 1)
	cfg, err := bucketcfg.Parse([]byte(testConfig{tail: tail}.render(p.opts.listen, []string{p.MC.Addr}, p.StatePath)))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	st := throttleStats(t, admin)
	if st["bucket:carol:reserved"] != "11" || st["bucket:carol:hard_limit"] != "111" {
		t.Fatalf("new bucket carol: reserved %q hard %q, want the runtime defaults 11/111", st["bucket:carol:reserved"], st["bucket:carol:hard_limit"])
	}
	if _, ok := st["bucket:bob:reserved"]; ok {
		t.Fatal("removed bucket bob still listed")
	}
	if _, err := bob.Get([]byte("k")); err == nil {
		// The session may answer one in-flight command at most; the next
		// read must see the close.
		if _, err := bob.Get([]byte("k")); err == nil {
			t.Fatal("session of the removed bucket still served")
		}
	}
	// Other tenants are untouched.
	if r, err := login(t, p.Addr, "alice").Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
}

// TestFlushSurvivesRestart: a FLUSH moves the bucket to a new namespace
// whose epoch is persisted, so flushed keys stay gone after a restart; a
// bucket removed and created again starts empty too.
func TestFlushSurvivesRestart(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	alice := login(t, p.Addr, "alice")
	if r, err := alice.Set([]byte("k"), []byte("before-flush")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	if r, err := alice.Do(mcclient.Request{Opcode: mc.OpFlush}); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	if r, err := alice.Set([]byte("after"), []byte("x")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	bob := login(t, p.Addr, "bob")
	if r, err := bob.Set([]byte("bobs"), []byte("x")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	alice.Close()
	bob.Close()
	p.stop(t)
	q := startProxyTo(t, p.MC, testConfig{tail: tenantTail(t), statePath: p.StatePath})
	alice = login(t, q.Addr, "alice")
	if r, err := alice.Get([]byte("k")); status(t, r, err) != mc.StatusKeyEnoent {
		t.Fatalf("flushed key after restart: %s %q", r.Status(), r.Value)
	}
	if r, err := alice.Get([]byte("after")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("key written after the flush, after restart: %s", r.Status())
	}
	// Remove bob by reload, then bring him back: his bucket starts empty.
	without := strings.Replace(tenantTail(t), "[[bucket]]\nname = \"bob\"\n", "", 1)
	without = strings.Replace(without, `buckets = ["bob"]`, `buckets = []`, 1)
	for _, tail := range []string{without, tenantTail(t)} {
		cfg, err := bucketcfg.Parse([]byte(testConfig{tail: tail}.render(q.opts.listen, []string{q.MC.Addr}, q.StatePath)))
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Reload(cfg); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := login(t, q.Addr, "bob").Get([]byte("bobs")); status(t, r, err) != mc.StatusKeyEnoent {
		t.Fatalf("re-created bucket sees its old keys: %s", r.Status())
	}
}

// TestReloadRevokes: a reload that takes away a privilege or a user acts
// on open connections too.
func TestReloadRevokes(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	admin, alice := login(t, p.Addr, "admin"), login(t, p.Addr, "alice")
	tail := strings.Replace(tenantTail(t), `privileges = ["admin", "unthrottled"]`, `privileges = []`, 1)
	aliceBlock := tail[strings.Index(tail, "[[user]]\nname = \"alice\""):strings.Index(tail, "[[user]]\nname = \"bob\"")]
	tail = strings.Replace(tail, aliceBlock, "", 1)
	cfg, err := bucketcfg.Parse([]byte(testConfig{tail: tail}.render(p.opts.listen, []string{p.MC.Addr}, p.StatePath)))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the admin's privilege to be revoked", func() bool {
		r := adminDo(t, admin, mc.OpSetNodeThrottleProperties, "", `{"capacity":5}`)
		return r.Status() == mc.StatusEaccess
	})
	eventually(t, time.Minute, "the deleted user's connection to close", func() bool {
		_, err := alice.Get([]byte("k"))
		return err != nil
	})
}

// A bucket removed from the file while the proxy is down (restart rather
// than SIGHUP) and created again later must start empty, as it does when
// removed and re-added by reload (TestFlushSurvivesRestart): the name may
// have gone to another tenant by then.
func TestBucketRemovedWhileDownStartsEmpty(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	bob := login(t, p.Addr, "bob")
	if r, err := bob.Set([]byte("secret"), []byte("old tenant's data")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	bob.Close()
	p.stop(t)

	without := strings.Replace(tenantTail(t), "[[bucket]]\nname = \"bob\"\n", "", 1)
	without = strings.Replace(without, `buckets = ["bob"]`, `buckets = []`, 1)
	q := startProxyTo(t, p.MC, testConfig{tail: without, statePath: p.StatePath})
	q.stop(t)

	r2 := startProxyTo(t, p.MC, testConfig{tail: tenantTail(t), statePath: p.StatePath})
	if r, err := login(t, r2.Addr, "bob").Get([]byte("secret")); status(t, r, err) != mc.StatusKeyEnoent {
		t.Fatalf("re-created bucket sees the removed bucket's keys: %s %q", r.Status(), r.Value)
	}
}

// A reload that is refused leaves no trace: in particular it must not
// persist new namespace epochs for the buckets it would have removed, which
// stay in service and would otherwise lose their keys at the next restart
// (an unrequested FLUSH).
func TestRefusedReloadPersistsNothing(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	admin := login(t, p.Addr, "admin")
	if r := adminDo(t, admin, mc.OpSetNodeThrottleProperties, "", `{"default_throttle_reserved_units":0,"default_throttle_hard_limit":50}`); r.Status() != mc.StatusSuccess {
		t.Fatalf("set defaults: %s %q", r.Status(), r.Value)
	}
	bob := login(t, p.Addr, "bob")
	if r, err := bob.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	// New file: bob removed, and a new bucket carol whose reserved = 100
	// does not fit the runtime default hard limit of 50: Effective fails.
	tail := strings.Replace(tenantTail(t), "[[bucket]]\nname = \"bob\"\n", "[[bucket]]\nname = \"carol\"\nreserved = 100\n", 1)
	tail = strings.Replace(tail, `buckets = ["bob"]`, `buckets = []`, 1)
	cfg, err := bucketcfg.Parse([]byte(testConfig{tail: tail}.render(p.opts.listen, []string{p.MC.Addr}, p.StatePath)))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(cfg); err == nil {
		t.Fatal("reload unexpectedly accepted")
	}
	// bob is still served, with its key.
	if r, err := bob.Get([]byte("k")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("bob after the refused reload: %s", r.Status())
	}
	bob.Close()
	admin.Close()
	p.stop(t)
	q := startProxyTo(t, p.MC, testConfig{tail: tenantTail(t), statePath: p.StatePath})
	if r, err := login(t, q.Addr, "bob").Get([]byte("k")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("bob's key after a restart with the same file, following a refused reload: %s", r.Status())
	}
}

// VERBOSITY is answered by the proxy: memcached's binary VERBOSITY (1.6)
// answers UnknownCommand and then swallows the first bytes of the next
// request on the connection, which every tenant of the event loop shares,
// so forwarding it failed the next tenant's request and everything in
// flight with it.
func TestVerbosityAnsweredLocally(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t), loops: 1})
	admin := login(t, p.Addr, "admin")
	alice := login(t, p.Addr, "alice")
	verbosity := mcclient.Request{Opcode: mc.OpVerbosity, Extras: []byte{0, 0, 0, 1}}
	if r, err := alice.Do(verbosity); status(t, r, err) != mc.StatusEaccess {
		t.Fatalf("tenant VERBOSITY: %s, want Eaccess", r.Status())
	}
	if r, err := admin.Do(verbosity); status(t, r, err) != mc.StatusNotSupported {
		t.Fatalf("admin VERBOSITY: %s %q, want NotSupported", r.Status(), r.Value)
	}
	for i := range 3 {
		if r, err := alice.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("SET %d after VERBOSITY: %s %q", i, r.Status(), r.Value)
		}
	}
}

// A GET pipelined before a HELLO that turns ReportUnitUsage on was sent
// before the feature was negotiated: its response keeps the classic magic
// 0x81 (the framing is decided when the command is sent, not when its
// response arrives).
func TestHelloAppliesToLaterCommandsOnly(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{})
	c := dial(t, p.Addr)
	if r, err := c.Set([]byte("hk"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	g := c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("hk")})
	feat := []byte{byte(mc.FeatureReportUnitUsage >> 8), byte(mc.FeatureReportUnitUsage)}
	h := c.Send(mcclient.Request{Opcode: mc.OpHello, Value: feat})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	r, err := c.Read()
	if err != nil || r.Opaque != g {
		t.Fatalf("first response: %v %+v", err, r)
	}
	if r.Magic != mc.MagicResponse {
		t.Errorf("GET sent before HELLO answered with magic 0x%02x, want 0x81 (feature not negotiated yet)", uint8(r.Magic))
	}
	if r, err := c.Read(); err != nil || r.Opaque != h {
		t.Fatalf("HELLO response: %v %+v", err, r)
	}
}

// A start that is refused leaves the state file as it was: it must not
// retire the buckets the refused file lacks, or, when the operator puts the
// previous file back, they would come back in fresh, empty namespaces, as
// with a refused reload (TestRefusedReloadPersistsNothing).
func TestRefusedStartPersistsNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	statePath := filepath.Join(dir, "state.json")
	conf := func(buckets string) *bucketcfg.Config {
		t.Helper()
		cfg, err := bucketcfg.Parse([]byte(fmt.Sprintf(`
[proxy]
listen = "127.0.0.1:0"
default_bucket = ""
[upstream]
servers = ["127.0.0.1:1"]
[throttle]
capacity = "unlimited"
state_file = %q
%s`, statePath, buckets)))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	good := conf("[[bucket]]\nname = \"old\"\n")
	// Runtime state: the default hard limit was set to 50 by 0x2c.
	st := bucketcfg.NewState()
	st.Defaults = &bucketcfg.BucketThrottle{Reserved: 0, HardLimit: 50}
	if err := st.Save(statePath); err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Config: good, State: st, NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	if srv == nil {
		t.Fatal("no server")
	}
	st1, _ := bucketcfg.LoadState(statePath)
	epoch := st1.Epochs["old"]

	// The edited file drops "old" and adds a bucket whose reservation does
	// not fit the state's default hard limit: the start is refused.
	bad := conf("[[bucket]]\nname = \"new\"\nreserved = 100\n")
	if _, err := New(Options{Config: bad, State: st1, NoMetrics: true}); err == nil {
		t.Fatal("start with the bad file accepted")
	} else {
		t.Logf("refused: %v", err)
	}
	st2, err := bucketcfg.LoadState(statePath)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Retired["old"] || st2.Epochs["old"] != epoch {
		t.Errorf("a refused start retired %q (epoch %d -> %d, retired %v): back with the previous file, its keys are gone",
			"old", epoch, st2.Epochs["old"], st2.Retired["old"])
	}
}
