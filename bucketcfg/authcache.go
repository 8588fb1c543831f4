package bucketcfg

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"sync"
	"time"
)

// Defaults for [NewAuthCache].
const (
	// DefaultAuthCacheTTL is how long a verified password is remembered:
	// long enough to cover a client's reconnections, short enough that a
	// password stolen from a client stops working soon after its hash is
	// changed (it stops at once: see AuthCache) or the process restarts.
	DefaultAuthCacheTTL = 5 * time.Minute
	// DefaultAuthCacheEntries bounds the entries (one per user at most).
	DefaultAuthCacheEntries = 4096
)

// AuthCache remembers, for a short time, the credentials that passed a
// bcrypt verification, so that a client reconnecting with the same user and
// password logs in without another bcrypt run (tens of milliseconds of a
// core each), and keeps logging in while a flood of wrong passwords keeps
// the verifier busy.
//
// It never stores a password. An entry is keyed by user name and holds
// HMAC-SHA256, under a random key drawn when the cache is made (kept only in
// memory, never logged), of the user name, the user's password_hash and the
// password, plus the time of the verification. Because the password_hash is
// part of the MAC, an entry matches only a configuration in which the user
// still exists with the same hash: a reload or admin change that changes the
// hash or removes the user makes the cached password useless at once, with
// no hook to call; an unchanged user keeps its entry. Entries expire their
// TTL after the verification that made them (a hit does not extend it).
// MACs are compared in constant time.
//
// An AuthCache is safe for concurrent use; Lookup is cheap (one HMAC, about
// a microsecond) and may run on an event loop, Authenticate may not.
type AuthCache struct {
	key [32]byte
	ttl time.Duration
	max int
	now func() time.Time

	mu      sync.Mutex
	entries map[string]authEntry // by user name
}

type authEntry struct {
	mac [sha256.Size]byte
	at  time.Time // when the password was verified with bcrypt
}

// NewAuthCache returns an empty cache whose entries live ttl and which holds
// at most maxEntries of them. now is its clock (nil: time.Now); tests inject
// one. A ttl or maxEntries <= 0 disables caching: Lookup always misses.
func NewAuthCache(ttl time.Duration, maxEntries int, now func() time.Time) *AuthCache {
	if now == nil {
		now = time.Now
	}
	a := &AuthCache{ttl: ttl, max: maxEntries, now: now, entries: make(map[string]authEntry)}
	// crypto/rand.Read does not fail (it aborts the program if the
	// system's generator is unusable).
	_, _ = rand.Read(a.key[:])
	return a
}

// mac computes the entry MAC of user's password under u's password_hash.
func (a *AuthCache) mac(u *User, password string) [sha256.Size]byte {
	h := hmac.New(sha256.New, a.key[:])
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(u.Name)))
	h.Write(n[:])
	h.Write([]byte(u.Name))
	binary.BigEndian.PutUint32(n[:], uint32(len(u.passwordHash)))
	h.Write(n[:])
	h.Write(u.passwordHash)
	h.Write([]byte(password))
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// Lookup returns the user of cfg named user when password was verified for
// that user, with the password_hash it has in cfg, or last found here, less
// than the TTL ago (a hit starts the TTL again); otherwise nil (the caller
// then verifies with Authenticate). It runs no
// bcrypt and may be called on an event loop. A wrong password does not
// remove the entry, so failed attempts cannot evict a real user's.
func (a *AuthCache) Lookup(cfg *Config, user, password string) *User {
	if a.ttl <= 0 || a.max <= 0 || len(password) > MaxPasswordBytes {
		return nil
	}
	u := cfg.User(user)
	if u == nil || len(u.passwordHash) == 0 {
		return nil
	}
	a.mu.Lock()
	e, ok := a.entries[user]
	if ok && a.expired(e, a.now()) {
		delete(a.entries, user)
		ok = false
	}
	a.mu.Unlock()
	if !ok {
		return nil
	}
	mac := a.mac(u, password)
	if subtle.ConstantTimeCompare(mac[:], e.mac[:]) != 1 {
		return nil
	}
	// A hit keeps the entry for another TTL: a user who keeps logging in
	// never needs bcrypt again (and is not locked out by a flood of wrong
	// passwords filling the check queue) while its password_hash stands.
	a.mu.Lock()
	if cur, ok := a.entries[user]; ok && cur.mac == e.mac {
		a.entries[user] = authEntry{mac: e.mac, at: a.now()}
	}
	a.mu.Unlock()
	return u
}

func (a *AuthCache) expired(e authEntry, now time.Time) bool {
	return now.Sub(e.at) >= a.ttl || now.Before(e.at)
}

// Authenticate verifies the password with cfg.Authenticate (bcrypt: tens of
// milliseconds of a core; never call it on an event loop) and, on success,
// remembers it for Lookup. Its results and error are cfg.Authenticate's:
// the user, or nil and [ErrAuthFailed]. A failure is never remembered.
func (a *AuthCache) Authenticate(cfg *Config, user, password string) (*User, error) {
	u, err := cfg.Authenticate(user, password)
	if err != nil {
		return nil, err
	}
	if a.ttl > 0 && a.max > 0 {
		a.remember(u, a.mac(u, password))
	}
	return u, nil
}

// remember stores u's entry, making room when the cache is full: expired
// entries go first, then the oldest.
func (a *AuthCache) remember(u *User, mac [sha256.Size]byte) {
	now := a.now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.entries[u.Name]; !ok && len(a.entries) >= a.max {
		oldest, oldestAt := "", time.Time{}
		for name, e := range a.entries {
			if a.expired(e, now) {
				delete(a.entries, name)
				continue
			}
			if oldest == "" || e.at.Before(oldestAt) {
				oldest, oldestAt = name, e.at
			}
		}
		if len(a.entries) >= a.max {
			delete(a.entries, oldest)
		}
	}
	a.entries[u.Name] = authEntry{mac: mac, at: now}
}

// Len returns the number of entries held (expired ones included until they
// are looked up or pushed out).
func (a *AuthCache) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.entries)
}
