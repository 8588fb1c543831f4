package bucketcfg

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

func TestAuthenticate(t *testing.T) {
	cfg := authConfig(t)
	cases := []struct {
		user, password string
		ok             bool
	}{
		{"admin", "secret", true},
		{"alice", "secret", true},
		{"nobody", "secret", true},
		{"admin", "Secret", false},
		{"admin", "", false},
		{"admin", "secret ", false},
		{"Admin", "secret", false},
		{"mallory", "secret", false},
		{"", "secret", false},
		{"", "", false},
		{"admin", "secret" + strings.Repeat("x", 100), false},
	}
	for _, c := range cases {
		u, err := cfg.Authenticate(c.user, c.password)
		if c.ok {
			if err != nil || u == nil || u.Name != c.user || u != cfg.User(c.user) {
				t.Errorf("Authenticate(%q, %q) = %v, %v; want the user", c.user, c.password, u, err)
			}
			continue
		}
		if u != nil || !errors.Is(err, ErrAuthFailed) {
			t.Errorf("Authenticate(%q, %q) = %v, %v; want nil, ErrAuthFailed", c.user, c.password, u, err)
		}
		if err != nil && (strings.Contains(err.Error(), c.user) && c.user != "" || strings.Contains(err.Error(), "$2a$")) {
			t.Errorf("error %q reveals the user or the hash", err)
		}
	}
}

// A password longer than bcrypt's 72 bytes must not be accepted just because
// its first 72 bytes match.
func TestAuthenticateRejectsTruncationMatch(t *testing.T) {
	long := strings.Repeat("p", MaxPasswordBytes)
	h := testmc.PasswordHash(t, long)
	cfg := mustParse(t, "[[bucket]]\nname=\"default\"\n[[user]]\nname=\"u\"\npassword_hash=\""+h+"\"\n")
	if _, err := cfg.Authenticate("u", long); err != nil {
		t.Fatalf("72-byte password rejected: %v", err)
	}
	if _, err := cfg.Authenticate("u", long+"extra"); !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("73+-byte password accepted")
	}
}

// Unknown users verify a dummy hash at the highest configured cost, so that
// their response time matches a wrong password.
func TestAuthenticateUnknownUserSpendsHashTime(t *testing.T) {
	cfg := authConfig(t)
	if _, err := cfg.Authenticate("mallory", "x"); !errors.Is(err, ErrAuthFailed) {
		t.Fatal(err)
	}
	cost, err := bcrypt.Cost(cfg.auth.dummy)
	if err != nil || cost != bcrypt.MinCost {
		t.Fatalf("dummy hash cost = %d, %v; want the users' cost %d", cost, err, bcrypt.MinCost)
	}
	noUsers := mustParse(t, "")
	if noUsers.auth.cost != DefaultHashCost {
		t.Fatalf("dummy cost without users = %d, want %d", noUsers.auth.cost, DefaultHashCost)
	}
	var zero Config
	if u, err := zero.Authenticate("a", "b"); u != nil || !errors.Is(err, ErrAuthFailed) {
		t.Fatalf("zero Config Authenticate = %v, %v", u, err)
	}
}

func TestAuthenticateConcurrent(t *testing.T) {
	cfg := authConfig(t)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			name := []string{"admin", "mallory"}[i%2]
			u, err := cfg.Authenticate(name, "secret")
			if (name == "admin") != (err == nil && u != nil) {
				t.Errorf("Authenticate(%s) = %v, %v", name, u, err)
			}
		}(i)
	}
	wg.Wait()
}

func TestUserPrivilegesAndAccess(t *testing.T) {
	cfg := authConfig(t)
	admin, alice, nobody := cfg.User("admin"), cfg.User("alice"), cfg.User("nobody")
	if !admin.IsAdmin() || !admin.IsUnthrottled() || !admin.CanAccess("bob") || !admin.CanAccess("not-even-defined") {
		t.Errorf("admin: %v %v", admin.IsAdmin(), admin.IsUnthrottled())
	}
	if alice.IsAdmin() || !alice.IsUnthrottled() || !alice.CanAccess("alice") || alice.CanAccess("bob") || alice.CanAccess("default") {
		t.Errorf("alice wrong")
	}
	if nobody.IsAdmin() || nobody.IsUnthrottled() || nobody.CanAccess("default") || nobody.Buckets == nil || nobody.Privileges == nil {
		t.Errorf("nobody = %#v", nobody)
	}
	if cfg.User("mallory") != nil {
		t.Error("User(mallory) != nil")
	}
	if fmt.Sprint(admin) != "admin" || strings.Contains(fmt.Sprintf("%#v %+v", admin, admin), "$2a$") {
		t.Errorf("User formatting leaks: %#v / %+v", admin, admin)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "$2a$") {
		t.Errorf("JSON of Config leaks a hash: %s", b)
	}
}

func TestHashPassword(t *testing.T) {
	testmc.SkipUnderRace(t) // bcrypt at DefaultHashCost, on one goroutine
	h, err := HashPassword("correct horse")
	if err != nil {
		t.Fatal(err)
	}
	if err := checkHash(h); err != nil {
		t.Fatalf("HashPassword output rejected by the config check: %v", err)
	}
	if cost, _ := bcrypt.Cost([]byte(h)); cost != DefaultHashCost {
		t.Fatalf("cost = %d, want %d", cost, DefaultHashCost)
	}
	if strings.Contains(h, "correct horse") {
		t.Fatal("hash contains the password")
	}
	h2, err := hashPassword("correct horse", bcrypt.MinCost)
	if err != nil || h2 == h {
		t.Fatalf("hashes are not salted: %q %q %v", h, h2, err)
	}
	for _, bad := range []string{"", strings.Repeat("z", MaxPasswordBytes+1)} {
		_, err := HashPassword(bad)
		if err == nil {
			t.Errorf("HashPassword(%d bytes) accepted", len(bad))
		} else if bad != "" && strings.Contains(err.Error(), bad) {
			t.Errorf("error contains the password")
		}
	}
}
