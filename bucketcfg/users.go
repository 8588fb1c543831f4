package bucketcfg

import (
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/bcrypt"

	"github.com/kvthrottle/kvthrottle/internal/echo"
)

// Privilege is a user privilege of the [[user]] privileges list.
type Privilege string

// The privileges a user may hold.
const (
	// PrivilegeAdmin allows the admin opcodes 0x2a and 0x2c.
	PrivilegeAdmin Privilege = "admin"
	// PrivilegeUnthrottled makes the user's connections never held (their
	// units are still charged to the bucket).
	PrivilegeUnthrottled Privilege = "unthrottled"
)

// AllBuckets is the buckets entry granting access to every bucket.
const AllBuckets = "*"

// User is one [[user]] table. Its credentials (password_hash for SASL
// PLAIN, scram_sha256 and scram_sha512 for SCRAM; at least one) are kept
// private: they are never printed, marshalled or put in an error; use
// [Config.Authenticate] and [Config.SCRAMCredentials].
type User struct {
	// Name is unique, 1..MaxUserNameLen bytes of printable UTF-8 (no
	// control characters, no spaces).
	Name string
	// Buckets lists the buckets the user may select, each a defined bucket
	// name or AllBuckets; it may be empty (key buckets, default []).
	Buckets []string
	// Privileges lists the user's privileges without duplicates (key
	// privileges, default []).
	Privileges []Privilege

	passwordHash []byte     // empty: the user may not use SASL PLAIN
	scram256     *scramCred // scram_sha256; nil: none
	scram512     *scramCred // scram_sha512; nil: none
	allBuckets   bool
	buckets      map[string]bool
	admin        bool
	unthrottled  bool
}

// CanAccess reports whether the user may use bucket (listed by name, or
// access to all buckets through "*"). It does not check that the bucket
// exists.
func (u *User) CanAccess(bucket string) bool {
	return u.allBuckets || u.buckets[bucket]
}

// IsAdmin reports whether the user holds the "admin" privilege.
func (u *User) IsAdmin() bool { return u.admin }

// IsUnthrottled reports whether the user holds the "unthrottled" privilege.
func (u *User) IsUnthrottled() bool { return u.unthrottled }

// String returns the user name only.
func (u *User) String() string { return u.Name }

// GoString returns the user name only, so that %#v never prints the hash.
func (u *User) GoString() string { return fmt.Sprintf("bucketcfg.User{Name: %q}", u.Name) }

// SamePasswordHash reports whether u and v have the same password_hash (a
// nil User has none, as a User without one): a password that fails
// against one fails against the other.
func (u *User) SamePasswordHash(v *User) bool {
	var a, b []byte
	if u != nil {
		a = u.passwordHash
	}
	if v != nil {
		b = v.passwordHash
	}
	return subtle.ConstantTimeCompare(a, b) == 1
}

// DefaultHashCost is the bcrypt cost used by [HashPassword].
//
// bcrypt is salted and deliberately slow, which protects the passwords if a
// configuration file leaks. Authentication happens once per client
// connection, on SASL AUTH, so the cost must stay affordable: cost 10 (the
// bcrypt default) takes about 50-100 ms of one core per verification, which
// bounds a burst of reconnections to roughly 10-20 authentications per second
// and core. The proxy should therefore verify passwords off the event loop.
const DefaultHashCost = 10

// MaxHashCost is the largest bcrypt cost accepted in password_hash: every
// step doubles the time of each authentication, and cost 14 already takes
// about a second.
const MaxHashCost = 14

// MaxPasswordBytes is the longest password bcrypt can hash; longer ones are
// refused rather than silently truncated.
const MaxPasswordBytes = 72

// ErrAuthFailed is the only error of [Config.Authenticate]: the user does
// not exist or the password is wrong (deliberately indistinguishable).
var ErrAuthFailed = errors.New("authentication failed")

// HashPassword returns the password_hash value for password: a bcrypt hash
// (with a random salt) at DefaultHashCost. It refuses an empty password and
// one longer than MaxPasswordBytes. The error never contains the password.
func HashPassword(password string) (string, error) {
	return hashPassword(password, DefaultHashCost)
}

func hashPassword(password string, cost int) (string, error) {
	if password == "" {
		return "", errors.New("password must not be empty")
	}
	if len(password) > MaxPasswordBytes {
		return "", fmt.Errorf("password is longer than %d bytes", MaxPasswordBytes)
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), cost)
	if err != nil {
		return "", fmt.Errorf("hashing password: %w", err)
	}
	return string(h), nil
}

// checkHash reports whether h is a bcrypt hash this package verifies:
// "$2a$", "$2b$" or "$2y$", a two-digit cost in [bcrypt.MinCost,
// MaxHashCost], then 53 characters of bcrypt's base64 alphabet. The error
// never quotes h.
func checkHash(h string) error {
	const hint = " (create one with `kvthrottle hash-password`)"
	if len(h) != 60 || h[0] != '$' || h[1] != '2' || (h[2] != 'a' && h[2] != 'b' && h[2] != 'y') || h[3] != '$' || h[6] != '$' {
		return errors.New("not a bcrypt hash" + hint)
	}
	for i := 7; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '/') {
			return errors.New("not a bcrypt hash" + hint)
		}
	}
	cost, err := bcrypt.Cost([]byte(h))
	if err != nil {
		return errors.New("not a bcrypt hash" + hint)
	}
	if cost > MaxHashCost {
		return fmt.Errorf("bcrypt cost %d is above %d, which would make every authentication too slow%s", cost, MaxHashCost, hint)
	}
	return nil
}

// checkUserName validates a user name.
func checkUserName(name string) error {
	if name == "" {
		return errors.New("must not be empty")
	}
	if len(name) > MaxUserNameLen {
		return fmt.Errorf("is %d bytes long, at most %d allowed", len(name), MaxUserNameLen)
	}
	if !utf8.ValidString(name) {
		return errors.New("is not valid UTF-8")
	}
	for _, r := range name {
		if unicode.IsControl(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%s contains a space or control character", echo.Quote(name))
		}
	}
	return nil
}

func buildUsers(cfg *Config, raws []tomlUser, probs *problems) {
	cfg.Users = make([]User, 0, len(raws))
	cfg.userIndex = make(map[string]int, len(raws))
	for i, ru := range raws {
		u := User{buckets: map[string]bool{}}
		label := fmt.Sprintf("user[%d]", i)
		if ru.Name == nil {
			probs.addf(label+".name", "missing")
		} else if err := checkUserName(*ru.Name); err != nil {
			probs.addf(label+".name", "%s", err)
		} else {
			u.Name = *ru.Name
			label = fmt.Sprintf("user %q", u.Name)
			if _, dup := cfg.userIndex[u.Name]; dup {
				probs.addf(label, "defined more than once")
			} else {
				cfg.userIndex[u.Name] = len(cfg.Users)
			}
		}
		switch {
		case ru.PasswordHash == nil && ru.ScramSHA256 == nil && ru.ScramSHA512 == nil:
			probs.addf(label+": password_hash", "missing: give password_hash (SASL PLAIN), scram_sha256 or scram_sha512 (SCRAM), or several (create them with `kvthrottle hash-password`)")
		case ru.PasswordHash == nil:
		default:
			if err := checkHash(*ru.PasswordHash); err != nil {
				probs.addf(label+": password_hash", "%s", err)
			} else {
				u.passwordHash = []byte(*ru.PasswordHash)
			}
		}
		for _, f := range []struct {
			h   SCRAMHash
			v   *string
			dst **scramCred
		}{{SCRAMSHA256, ru.ScramSHA256, &u.scram256}, {SCRAMSHA512, ru.ScramSHA512, &u.scram512}} {
			if f.v == nil {
				continue
			}
			sc, err := parseSCRAM(f.h, *f.v)
			if err != nil {
				probs.addf(label+": "+f.h.key(), "%s", err)
				continue
			}
			*f.dst = &sc
		}
		u.Buckets = []string{}
		if ru.Buckets != nil {
			u.Buckets = append(u.Buckets, (*ru.Buckets)...)
		}
		for _, b := range u.Buckets {
			switch {
			case b == AllBuckets:
				u.allBuckets = true
			case cfg.Bucket(b) == nil:
				probs.addf(label+": buckets", "%s is not a [[bucket]] (use \"*\" for every bucket)", echo.Quote(b))
			default:
				u.buckets[b] = true
			}
		}
		if ru.Privileges != nil {
			for _, p := range *ru.Privileges {
				switch Privilege(p) {
				case PrivilegeAdmin:
					u.admin = true
				case PrivilegeUnthrottled:
					u.unthrottled = true
				default:
					probs.addf(label+": privileges", `unknown privilege %s (known: "admin", "unthrottled")`, echo.Quote(p))
					continue
				}
				dup := false
				for _, q := range u.Privileges {
					dup = dup || q == Privilege(p)
				}
				if dup {
					probs.addf(label+": privileges", "%q listed twice", p)
					continue
				}
				u.Privileges = append(u.Privileges, Privilege(p))
			}
		}
		if u.Privileges == nil {
			u.Privileges = []Privilege{}
		}
		cfg.Users = append(cfg.Users, u)
	}
}

// authState holds what Authenticate needs besides the users: a dummy hash,
// made lazily, at the highest cost in use, verified when the user does not
// exist so that a missing user takes as long as a wrong password.
type authState struct {
	cost  int
	once  sync.Once
	dummy []byte

	scramIters map[SCRAMHash]int // the decoys' iteration counts (SCRAMCredentials)
	decoyKey   []byte            // the decoys' salt key (decoyKeyOf)
}

func newAuthState(users []User) *authState {
	cost := 0
	for _, u := range users {
		if c, err := bcrypt.Cost(u.passwordHash); err == nil && c > cost {
			cost = c
		}
	}
	if cost == 0 {
		cost = DefaultHashCost
	}
	return &authState{cost: cost, scramIters: commonSCRAMIters(users), decoyKey: decoyKeyOf(users)}
}

func (a *authState) dummyHash() []byte {
	a.once.Do(func() {
		pw := make([]byte, 16)
		_, _ = rand.Read(pw)
		// Cannot fail: the cost was validated and crypto/rand does not fail.
		a.dummy, _ = bcrypt.GenerateFromPassword(pw, a.cost)
	})
	return a.dummy
}

// Authenticate checks user's password and returns the user on success.
//
// Any failure (unknown user, user without password_hash, wrong password,
// password longer than MaxPasswordBytes) returns nil and [ErrAuthFailed].
// Every call spends one bcrypt verification: for an unknown user (or one
// without password_hash) a dummy hash at the highest cost
// configured is verified, so the response time does not reveal whether the
// user exists. The comparison of hashes is constant-time (bcrypt uses
// crypto/subtle). Authenticate is safe for concurrent use and takes about
// DefaultHashCost's time (tens of milliseconds): call it off the event loop.
func (c *Config) Authenticate(user, password string) (*User, error) {
	if c.auth == nil { // not a Config from Load, Parse or Effective
		return nil, ErrAuthFailed
	}
	u := c.User(user)
	var hash []byte
	if u != nil && len(u.passwordHash) > 0 {
		hash = u.passwordHash
	} else {
		// An unknown user, or one without password_hash (SCRAM only):
		// the same time as a wrong password.
		hash = c.auth.dummyHash()
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(password))
	if u == nil || len(u.passwordHash) == 0 || err != nil || len(password) > MaxPasswordBytes {
		return nil, ErrAuthFailed
	}
	return u, nil
}
