package testmc

import (
	"sync"
	"testing"

	"golang.org/x/crypto/bcrypt"
)

// hashes holds the PasswordHash of each password asked for, so that every
// call for one password returns the same hash.
var hashes sync.Map // password -> hash

// PasswordHash returns a bcrypt hash of password at the minimum cost (4),
// for the password_hash of a test user: cheap, so tests stay fast. Every
// call with the same password returns the same hash. Safe for concurrent
// use.
func PasswordHash(t testing.TB, password string) string {
	t.Helper()
	if h, ok := hashes.Load(password); ok {
		return h.(string)
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatalf("bcrypt: %v", err)
	}
	got, _ := hashes.LoadOrStore(password, string(h))
	return got.(string)
}
