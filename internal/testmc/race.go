package testmc

import "testing"

// SkipUnderRace skips t in a binary built with -race. It is for tests that
// run on one goroutine at a time (the simulations a fake clock drives) or
// only compute (bcrypt at its real cost): the race detector can find
// nothing in them and makes them 5 to 30 times slower; and for the proxy's
// rate tests on fake clocks whose code paths other tests run under -race.
// make test runs them without -race, in full, in its test-norace passes: a
// package that calls this must be in the Makefile's NORACE_PKGS, a proxy
// test in PROXY_NORACE_TESTS (internal/docscheck checks both).
func SkipUnderRace(t testing.TB) {
	t.Helper()
	if RaceEnabled {
		t.Skip("one goroutine or pure computation: runs without -race (make test-norace)")
	}
}

// UnderRace returns race in a binary built with -race and full otherwise:
// the iteration count of a test that checks concurrency (so it runs under
// -race too) where the full count costs the race detector minutes. The
// caller states why the smaller count still covers what -race looks for;
// make test runs the full count without -race (the package is in
// NORACE_PKGS, or for ./proxy the test is one of UPSTREAM_TLS_TESTS or
// PROXY_NORACE_TESTS; internal/docscheck checks it).
func UnderRace[T any](full, race T) T {
	if RaceEnabled {
		return race
	}
	return full
}
