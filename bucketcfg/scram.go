package bucketcfg

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/xdg-go/scram"
)

// SCRAMHash names the hash function of a SCRAM mechanism (RFC 5802, RFC
// 7677): the [[user]] keys scram_sha256 and scram_sha512 hold one
// credential each.
type SCRAMHash int

// The SCRAM hash functions a [[user]] may hold credentials for.
const (
	// SCRAMSHA256 is SCRAM-SHA-256 (key scram_sha256; the memcached
	// binary protocol mechanism "SCRAM-SHA256").
	SCRAMSHA256 SCRAMHash = iota + 1
	// SCRAMSHA512 is SCRAM-SHA-512 (key scram_sha512; mechanism
	// "SCRAM-SHA512").
	SCRAMSHA512
)

// String returns the RFC name of h ("SCRAM-SHA-256" or "SCRAM-SHA-512"),
// which is also the prefix of its credential strings.
func (h SCRAMHash) String() string {
	switch h {
	case SCRAMSHA256:
		return "SCRAM-SHA-256"
	case SCRAMSHA512:
		return "SCRAM-SHA-512"
	}
	return "SCRAM-unknown"
}

// Func returns h's hash generator for github.com/xdg-go/scram (nil for an
// unknown h).
func (h SCRAMHash) Func() scram.HashGeneratorFcn {
	switch h {
	case SCRAMSHA256:
		return scram.SHA256
	case SCRAMSHA512:
		return scram.SHA512
	}
	return nil
}

// size is h's digest size in bytes (StoredKey and ServerKey).
func (h SCRAMHash) size() int {
	if h == SCRAMSHA512 {
		return 64
	}
	return 32
}

// key is h's [[user]] key.
func (h SCRAMHash) key() string {
	if h == SCRAMSHA512 {
		return "scram_sha512"
	}
	return "scram_sha256"
}

// Bounds and defaults of SCRAM credentials.
const (
	// DefaultSCRAMIterations is the PBKDF2 iteration count [HashSCRAM]
	// uses. The proxy never runs PBKDF2 (it stores its result); each
	// client does, once per login: 15000 iterations take a few
	// milliseconds of a client core, and make guessing a password from a
	// leaked credential or an observed exchange that much slower.
	DefaultSCRAMIterations = 15000
	// MinSCRAMIterations is the lowest iteration count accepted in a
	// credential (RFC 7677's minimum for SCRAM-SHA-256).
	MinSCRAMIterations = 4096
	// MaxSCRAMIterations is the highest accepted: clients would spend
	// seconds per login past it.
	MaxSCRAMIterations = 10_000_000
	// scramSaltBytes is the salt length HashSCRAM draws.
	scramSaltBytes = 16
	// minSCRAMSaltBytes is the shortest salt accepted.
	minSCRAMSaltBytes = 8
)

// scramCred is one parsed SCRAM credential of a user.
type scramCred struct {
	iters                int
	salt                 []byte
	storedKey, serverKey []byte
}

// HashSCRAM returns the scram_sha256 or scram_sha512 value (as h says) for
// password, with a random salt and iterations PBKDF2 iterations
// (MinSCRAMIterations..MaxSCRAMIterations; DefaultSCRAMIterations is the
// usual choice). The value is PostgreSQL's format:
//
//	SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>
//
// with salt and keys in standard base64 (with padding). The password is
// normalized with SASLprep first (RFC 5802), as SCRAM clients do. It
// refuses an empty password and one SASLprep refuses; errors never contain
// the password. It takes the time of the iterations (milliseconds).
func HashSCRAM(h SCRAMHash, password string, iterations int) (string, error) {
	f := h.Func()
	switch {
	case f == nil:
		return "", fmt.Errorf("unknown SCRAM hash %d", int(h))
	case password == "":
		return "", errors.New("password must not be empty")
	case iterations < MinSCRAMIterations || iterations > MaxSCRAMIterations:
		return "", fmt.Errorf("%d iterations: must be from %d to %d", iterations, MinSCRAMIterations, MaxSCRAMIterations)
	}
	// The user name plays no part in the stored credential.
	c, err := f.NewClient("", password, "")
	if err != nil {
		return "", fmt.Errorf("preparing the password for %s: %w", h, err)
	}
	salt := make([]byte, scramSaltBytes)
	_, _ = rand.Read(salt) // never fails
	sc, err := c.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: iterations})
	if err != nil {
		return "", fmt.Errorf("deriving the %s keys: %w", h, err)
	}
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("%s$%d:%s$%s:%s", h, iterations, b64(salt), b64(sc.StoredKey), b64(sc.ServerKey)), nil
}

// parseSCRAM parses a credential for h. The error never quotes v.
func parseSCRAM(h SCRAMHash, v string) (scramCred, error) {
	const hint = " (create one with `kvthrottle hash-password`)"
	bad := func(what string) (scramCred, error) {
		return scramCred{}, fmt.Errorf("not a %s credential: %s; want %s$<iterations>:<salt>$<StoredKey>:<ServerKey>%s", h, what, h, hint)
	}
	rest, ok := strings.CutPrefix(v, h.String()+"$")
	if !ok {
		return bad("it must start with " + h.String() + "$")
	}
	factors, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return bad("no $ before the keys")
	}
	itersText, saltText, ok := strings.Cut(factors, ":")
	if !ok {
		return bad("no : between iterations and salt")
	}
	storedText, serverText, ok := strings.Cut(keys, ":")
	if !ok {
		return bad("no : between StoredKey and ServerKey")
	}
	var c scramCred
	var err error
	if c.iters, err = strconv.Atoi(itersText); err != nil {
		return bad("the iteration count is not a number")
	}
	if c.iters < MinSCRAMIterations || c.iters > MaxSCRAMIterations {
		return scramCred{}, fmt.Errorf("%d iterations: must be from %d to %d%s", c.iters, MinSCRAMIterations, MaxSCRAMIterations, hint)
	}
	dec := base64.StdEncoding.DecodeString
	if c.salt, err = dec(saltText); err != nil {
		return bad("the salt is not base64")
	}
	if len(c.salt) < minSCRAMSaltBytes {
		return scramCred{}, fmt.Errorf("the salt is %d bytes, at least %d needed%s", len(c.salt), minSCRAMSaltBytes, hint)
	}
	if c.storedKey, err = dec(storedText); err != nil || len(c.storedKey) != h.size() {
		return bad(fmt.Sprintf("StoredKey is not %d bytes of base64", h.size()))
	}
	if c.serverKey, err = dec(serverText); err != nil || len(c.serverKey) != h.size() {
		return bad(fmt.Sprintf("ServerKey is not %d bytes of base64", h.size()))
	}
	return c, nil
}

// SCRAMCredentials returns what a SCRAM server conversation with hash h
// needs for the client naming itself user, for
// github.com/xdg-go/scram's CredentialLookup: the user's stored credential
// and the user when it exists and has one for h. Otherwise it returns a
// decoy and nil, so that the conversation goes on and fails at the proof,
// as a wrong password does: the salt is derived from h and the name with
// a key derived from the users' credentials (see decoyKeyOf: the same name
// gets the same salt for as long as the [[user]] credentials stay the
// same, across restarts and reloads too, as a real user's does), the
// iteration count is the one most users of c have for h, and the keys are
// random, so no proof matches. Cheap (no PBKDF2), safe for concurrent
// use; the result must not be modified.
func (c *Config) SCRAMCredentials(h SCRAMHash, user string) (scram.StoredCredentials, *User) {
	if u := c.User(user); u != nil {
		if sc := u.scram(h); sc != nil {
			return scram.StoredCredentials{
				KeyFactors: scram.KeyFactors{Salt: string(sc.salt), Iters: sc.iters},
				StoredKey:  sc.storedKey, ServerKey: sc.serverKey,
			}, u
		}
	}
	iters := DefaultSCRAMIterations
	if c.auth != nil && c.auth.scramIters[h] != 0 {
		iters = c.auth.scramIters[h]
	}
	var key []byte
	if c.auth != nil {
		key = c.auth.decoyKey
	} else { // not a Config from Load, Parse or Effective
		key = decoyKeyOf(c.Users)
	}
	m := hmac.New(sha256.New, key)
	fmt.Fprintf(m, "%d\x00%s", int(h), user)
	salt := m.Sum(nil)[:scramSaltBytes]
	keys := make([]byte, 2*h.size())
	_, _ = rand.Read(keys)
	return scram.StoredCredentials{
		KeyFactors: scram.KeyFactors{Salt: string(salt), Iters: iters},
		StoredKey:  keys[:h.size()], ServerKey: keys[h.size():],
	}, nil
}

// HasSCRAM reports whether the user has a credential for h.
func (u *User) HasSCRAM(h SCRAMHash) bool { return u.scram(h) != nil }

// SameSCRAM reports whether u and v (both non-nil) hold the same
// credential for h (both none counts as the same). Constant time in the
// keys.
func (u *User) SameSCRAM(v *User, h SCRAMHash) bool {
	a, b := u.scram(h), v.scram(h)
	if a == nil || b == nil {
		return a == b
	}
	return a.iters == b.iters && bytes.Equal(a.salt, b.salt) &&
		hmac.Equal(a.storedKey, b.storedKey) && hmac.Equal(a.serverKey, b.serverKey)
}

// HasPassword reports whether the user has a password_hash (may log in
// with SASL PLAIN).
func (u *User) HasPassword() bool { return len(u.passwordHash) > 0 }

func (u *User) scram(h SCRAMHash) *scramCred {
	switch h {
	case SCRAMSHA256:
		return u.scram256
	case SCRAMSHA512:
		return u.scram512
	}
	return nil
}

// decoyDomain separates decoyKeyOf's hash from any other use of the same
// credentials.
const decoyDomain = "kvthrottle SCRAM decoy salt key v1"

// decoyKeyOf returns the key of the decoy salts (SCRAMCredentials) for
// users: SHA-256 over decoyDomain and every user's name and credentials
// (password_hash, and both SCRAM credentials with their secret StoredKey
// and ServerKey), in name order, each field length-prefixed. It needs no
// secret of its own, yet is secret (it covers keys that never leave the
// proxy) and stable: every process that loads the same users computes the
// same key, so a name's decoy salt does not change across restarts, while
// a real user's salt never changes either. Changing the users' credentials
// (a user added, removed, renamed or given a new credential) changes
// every decoy salt at once; an unknown name then gets a new salt while an
// unchanged real user keeps its own, so someone who asked for the same
// names before and after such a change can tell them apart (they cannot
// across a restart or a reload that keeps the credentials). With no users
// the key is that of the empty list: constant, and nobody can log in.
func decoyKeyOf(users []User) []byte {
	order := make([]*User, len(users))
	for i := range users {
		order[i] = &users[i]
	}
	slices.SortFunc(order, func(a, b *User) int { return strings.Compare(a.Name, b.Name) })
	h := sha256.New()
	field := func(b []byte) {
		h.Write(binary.BigEndian.AppendUint64(nil, uint64(len(b))))
		h.Write(b)
	}
	field([]byte(decoyDomain))
	for _, u := range order {
		field([]byte(u.Name))
		field(u.passwordHash)
		for _, sc := range []*scramCred{u.scram256, u.scram512} {
			if sc == nil {
				field(nil)
				continue
			}
			field(binary.BigEndian.AppendUint64(nil, uint64(sc.iters)))
			field(sc.salt)
			field(sc.storedKey)
			field(sc.serverKey)
		}
	}
	return h.Sum(nil)
}

// commonSCRAMIters returns, for each hash, the iteration count most users
// have (the higher on a tie), 0 when none has a credential.
func commonSCRAMIters(users []User) map[SCRAMHash]int {
	out := map[SCRAMHash]int{}
	for _, h := range []SCRAMHash{SCRAMSHA256, SCRAMSHA512} {
		count := map[int]int{}
		for i := range users {
			if sc := users[i].scram(h); sc != nil {
				count[sc.iters]++
			}
		}
		best, bestN := 0, 0
		for it, n := range count {
			if n > bestN || n == bestN && it > best {
				best, bestN = it, n
			}
		}
		if best != 0 {
			out[h] = best
		}
	}
	return out
}
