package bucketcfg

import (
	"sync"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// Helpers the tests of several files share.

var (
	testHashOnce sync.Once
	testHash     string // bcrypt of "secret" at the minimum cost (fast tests)
)

// fastHash returns a cost-4 bcrypt hash of "secret".
func fastHash(t testing.TB) string {
	t.Helper()
	testHashOnce.Do(func() {
		h, err := hashPassword("secret", bcrypt.MinCost)
		if err != nil {
			panic(err)
		}
		testHash = h
	})
	return testHash
}

func mustParse(t *testing.T, doc string) *Config {
	t.Helper()
	cfg, err := Parse([]byte(doc))
	if err != nil {
		t.Fatalf("Parse:\n%s\nerror: %v", doc, err)
	}
	return cfg
}

func lim(n int64) throttle.Limit { return throttle.Limit(n) }

func authConfig(t *testing.T) *Config {
	t.Helper()
	h := fastHash(t) // password "secret"
	return mustParse(t, `
[[bucket]]
name = "default"
[[bucket]]
name = "alice"
[[bucket]]
name = "bob"
[[user]]
name = "admin"
password_hash = "`+h+`"
buckets = ["*"]
privileges = ["admin", "unthrottled"]
[[user]]
name = "alice"
password_hash = "`+h+`"
buckets = ["alice"]
privileges = ["unthrottled"]
[[user]]
name = "nobody"
password_hash = "`+h+`"
`)
}
