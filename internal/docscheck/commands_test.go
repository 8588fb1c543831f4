package docscheck

import (
	"slices"
	"strings"
	"testing"
)

// TestDocCommandsExist: every kvthrottle command in a sh block of README.md
// and docs/*.md names a sub-command, flags and (for ctl) a command the
// built binary has, with as many arguments as it takes; every make command
// names Makefile targets.
func TestDocCommandsExist(t *testing.T) {
	c := sharedChecker(t)
	targets := MakeTargets(readRepo(t, "Makefile"))
	var nKv, nMake int
	for _, f := range docFiles(t) {
		md := readRepo(t, f)
		for _, inv := range KvthrottleInvocations(f, md) {
			nKv++
			if err := c.Check(inv); err != nil {
				t.Error(err)
			}
		}
		for _, inv := range MakeInvocations(f, md) {
			nMake++
			if err := CheckMake(inv, targets); err != nil {
				t.Error(err)
			}
		}
	}
	// The README alone shows hash-password, ctl set-bucket, stats and top,
	// make run and make test: finding fewer means the extraction broke.
	if nKv < 5 || nMake < 2 {
		t.Errorf("found %d kvthrottle and %d make commands in the documentation; expected more", nKv, nMake)
	}
}

// TestCheckerCatchesMistakes: a command, flag, ctl command or make target
// that does not exist, and a ctl command with the wrong arguments, are
// each reported; the same lines spelled right are not.
func TestCheckerCatchesMistakes(t *testing.T) {
	c := sharedChecker(t)
	md := "```sh\n" +
		"bin/kvthrottle ctl --user admin top --iterations 1\n" + // good
		"echo pw | bin/kvthrottle hash-password | tail -n 1\n" + // good
		"kvthrottle ctl --addr proxy1:11312 --ca ca.pem --cert a.pem --key a.key stats throttle\n" + // good
		"bin/kvthrottle serve --config config.example.toml\n" + // good
		"bin/kvthrottle ctl --bogus top\n" +
		"bin/kvthrottle ctl --password secret top\n" +
		"bin/kvthrottle frobnicate\n" +
		"bin/kvthrottle ctl --user admin frob\n" +
		"bin/kvthrottle ctl set-bucket alice\n" +
		"bin/kvthrottle ctl --user admin stats a b\n" +
		"bin/kvthrottle serve --conf x.toml\n" +
		"bin/kvthrottle hash-password --cost 12\n" +
		"```\n\n```sh\nmake run CONFIG=x.toml\nmake nosuchtarget\n```\n"
	var bad []string
	for _, inv := range KvthrottleInvocations("t.md", md) {
		if err := c.Check(inv); err != nil {
			bad = append(bad, strings.SplitN(err.Error(), ":", 3)[1])
		}
	}
	targets := MakeTargets(readRepo(t, "Makefile"))
	for _, inv := range MakeInvocations("t.md", md) {
		if err := CheckMake(inv, targets); err != nil {
			bad = append(bad, strings.SplitN(err.Error(), ":", 3)[1])
		}
	}
	want := []string{"6", "7", "8", "9", "10", "11", "12", "13", "18"}
	if !slices.Equal(bad, want) {
		t.Errorf("lines reported: %q, want %q", bad, want)
	}
}

// TestShellWords: quoting, pipelines and comments as the extraction needs.
func TestShellWords(t *testing.T) {
	for in, want := range map[string][]string{
		`ctl set-bucket a '{"reserved": 5, "hard_limit": 10}' # set`: {"ctl", "set-bucket", "a", `{"reserved": 5, "hard_limit": 10}`},
		`hash-password | tail -n 1)"`:                                {"hash-password"},
		`ctl --user "the admin" top; echo done`:                      {"ctl", "--user", "the admin", "top"},
		`a\ b c#d`:                                                   {"a b", "c#d"},
	} {
		if got := shellWords(in); !slices.Equal(got, want) {
			t.Errorf("shellWords(%q) = %q, want %q", in, got, want)
		}
	}
}
