package bucketcfg

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// fakeClock is a settable clock for AuthCache.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newTestCache(ttl time.Duration, n int) (*AuthCache, *fakeClock) {
	clk := &fakeClock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)}
	return NewAuthCache(ttl, n, clk.now), clk
}

// usersConfig is a configuration with users u1..un, each with password
// "secret" (or the hash given for u1).
func usersConfig(t *testing.T, n int, u1Hash string) *Config {
	t.Helper()
	doc := "[[bucket]]\nname = \"default\"\n"
	for i := 1; i <= n; i++ {
		h := fastHash(t)
		if i == 1 && u1Hash != "" {
			h = u1Hash
		}
		doc += fmt.Sprintf("[[user]]\nname = \"u%d\"\npassword_hash = %q\n", i, h)
	}
	return mustParse(t, doc)
}

func TestAuthCacheHitsOnlyAfterVerification(t *testing.T) {
	cfg := authConfig(t)
	c, _ := newTestCache(DefaultAuthCacheTTL, DefaultAuthCacheEntries)
	if u := c.Lookup(cfg, "alice", "secret"); u != nil {
		t.Fatal("hit before any verification")
	}
	if _, err := c.Authenticate(cfg, "alice", "wrong"); err != ErrAuthFailed {
		t.Fatalf("wrong password: %v", err)
	}
	if c.Len() != 0 || c.Lookup(cfg, "alice", "wrong") != nil {
		t.Fatal("a failed verification was remembered")
	}
	if u, err := c.Authenticate(cfg, "alice", "secret"); err != nil || u.Name != "alice" {
		t.Fatalf("Authenticate: %v %v", u, err)
	}
	if u := c.Lookup(cfg, "alice", "secret"); u == nil || u.Name != "alice" || !u.IsUnthrottled() {
		t.Fatalf("Lookup after verification = %v", u)
	}
	for _, tc := range []struct{ user, pw string }{
		{"alice", "Secret"}, {"alice", ""}, {"alice", "secret "}, {"alice", "secre"},
		{"admin", "secret"}, // same password, another user: verified separately
		{"mallory", "secret"},
	} {
		if u := c.Lookup(cfg, tc.user, tc.pw); u != nil {
			t.Errorf("Lookup(%q, %q) hit", tc.user, tc.pw)
		}
	}
	// A wrong password does not evict the entry.
	if c.Lookup(cfg, "alice", "secret") == nil {
		t.Error("entry lost after misses")
	}
}

func TestAuthCacheTTL(t *testing.T) {
	cfg := authConfig(t)
	c, clk := newTestCache(5*time.Minute, 10)
	if _, err := c.Authenticate(cfg, "alice", "secret"); err != nil {
		t.Fatal(err)
	}
	clk.advance(5*time.Minute - time.Nanosecond)
	if c.Lookup(cfg, "alice", "secret") == nil {
		t.Fatal("miss just before the TTL")
	}
	clk.advance(5 * time.Minute) // the TTL after the last hit
	if c.Lookup(cfg, "alice", "secret") != nil {
		t.Fatal("hit at the TTL")
	}
	if c.Len() != 0 {
		t.Errorf("expired entry kept: %d entries", c.Len())
	}
	// A hit starts the TTL again (a user who keeps logging in is never
	// sent back to the bcrypt queue, which a flood may keep full); a
	// wrong password does not.
	if _, err := c.Authenticate(cfg, "alice", "secret"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		clk.advance(4 * time.Minute)
		if c.Lookup(cfg, "alice", "wrong") != nil {
			t.Fatal("a wrong password hit")
		}
		if c.Lookup(cfg, "alice", "secret") == nil {
			t.Fatalf("miss %d min after the last hit, %d min after the verification", 4, 4*(i+1))
		}
	}
	for i := 0; i < 3; i++ {
		clk.advance(2 * time.Minute)
		c.Lookup(cfg, "alice", "wrong")
	}
	if c.Lookup(cfg, "alice", "secret") != nil {
		t.Fatal("wrong passwords kept the entry past its TTL")
	}
	// A clock that goes backwards does not make an entry immortal.
	if _, err := c.Authenticate(cfg, "alice", "secret"); err != nil {
		t.Fatal(err)
	}
	clk.advance(-time.Second)
	if c.Lookup(cfg, "alice", "secret") != nil {
		t.Fatal("hit with the clock before the verification")
	}
}

func TestAuthCacheFollowsConfiguration(t *testing.T) {
	old := usersConfig(t, 2, "")
	c, _ := newTestCache(time.Hour, 10)
	for _, u := range []string{"u1", "u2"} {
		if _, err := c.Authenticate(old, u, "secret"); err != nil {
			t.Fatal(err)
		}
	}
	// An admin change (Effective) keeps the users: still a hit.
	eff, err := Effective(old, NewState())
	if err != nil {
		t.Fatal(err)
	}
	if u := c.Lookup(eff, "u1", "secret"); u == nil || u != eff.User("u1") {
		t.Fatalf("Lookup in the effective config = %v, want its own user", u)
	}
	// A reload that changes u1's password and removes u2: the old
	// password must not let u1 in, nor u2 at all.
	h, err := hashPassword("new-secret", bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	reloaded := usersConfig(t, 1, h)
	if c.Lookup(reloaded, "u1", "secret") != nil {
		t.Error("old cached password accepted after the hash changed")
	}
	if c.Lookup(reloaded, "u2", "secret") != nil {
		t.Error("removed user accepted")
	}
	if c.Lookup(reloaded, "u1", "new-secret") != nil {
		t.Error("new password accepted without verification")
	}
	if _, err := c.Authenticate(reloaded, "u1", "new-secret"); err != nil {
		t.Fatal(err)
	}
	if c.Lookup(reloaded, "u1", "new-secret") == nil {
		t.Error("new password not remembered")
	}
	// The same hash under a new configuration (a reload that leaves the
	// user alone) keeps matching.
	same := usersConfig(t, 1, h)
	if c.Lookup(same, "u1", "new-secret") == nil {
		t.Error("unchanged user lost its entry across a reload")
	}
	// Back to the old file: u1's old hash again, but the entry was
	// replaced by the new password's.
	if c.Lookup(old, "u1", "secret") != nil {
		t.Error("old password accepted after a newer one was verified")
	}
}

func TestAuthCacheBounded(t *testing.T) {
	cfg := usersConfig(t, 5, "")
	c, clk := newTestCache(time.Hour, 3)
	for i := 1; i <= 5; i++ {
		if _, err := c.Authenticate(cfg, fmt.Sprintf("u%d", i), "secret"); err != nil {
			t.Fatal(err)
		}
		clk.advance(time.Second)
		if c.Len() > 3 {
			t.Fatalf("%d entries, bound 3", c.Len())
		}
	}
	// The oldest went first. (Each hit starts its entry's TTL again: one
	// second apart, so u3 is still the oldest.)
	for i, want := range []bool{false, false, true, true, true} {
		if got := c.Lookup(cfg, fmt.Sprintf("u%d", i+1), "secret") != nil; got != want {
			t.Errorf("u%d cached = %v, want %v", i+1, got, want)
		}
		clk.advance(time.Second)
	}
	// Expired entries make room before live ones are pushed out.
	clk.advance(time.Hour - 2500*time.Millisecond) // u3 expired, u4 and u5 not
	if _, err := c.Authenticate(cfg, "u1", "secret"); err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false, false, true, true} {
		if got := c.Lookup(cfg, fmt.Sprintf("u%d", i+1), "secret") != nil; got != want {
			t.Errorf("after expiry: u%d cached = %v, want %v", i+1, got, want)
		}
	}
}

func TestAuthCacheDisabled(t *testing.T) {
	cfg := authConfig(t)
	for _, c := range []*AuthCache{NewAuthCache(0, 10, nil), NewAuthCache(time.Hour, 0, nil)} {
		if _, err := c.Authenticate(cfg, "alice", "secret"); err != nil {
			t.Fatal(err)
		}
		if c.Lookup(cfg, "alice", "secret") != nil || c.Len() != 0 {
			t.Error("disabled cache hit")
		}
	}
}

// The cache holds no password, and two caches (two processes) derive
// different MACs from the same credentials.
func TestAuthCacheStoresNoPassword(t *testing.T) {
	cfg := authConfig(t)
	pw := "secret"
	a, _ := newTestCache(time.Hour, 10)
	b, _ := newTestCache(time.Hour, 10)
	for _, c := range []*AuthCache{a, b} {
		if _, err := c.Authenticate(cfg, "alice", pw); err != nil {
			t.Fatal(err)
		}
	}
	ea, eb := a.entries["alice"], b.entries["alice"]
	if bytes.Contains(ea.mac[:], []byte(pw)) {
		t.Error("entry contains the password")
	}
	if ea.mac == eb.mac {
		t.Error("two caches share a MAC key")
	}
	if len(ea.mac) != 32 {
		t.Errorf("mac is %d bytes", len(ea.mac))
	}
}
