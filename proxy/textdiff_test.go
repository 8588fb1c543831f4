package proxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/internal/textdiff"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestTextDifferential sends the same long, seeded stream of text and meta
// commands (every command, their flags, noreply and quiet mode, pipelined
// batches, bad lines, over-long lines that close, huge and too large
// values; internal/textdiff) to a fresh memcached and through the proxy to
// another, and requires byte-identical replies. Keys are at most as long
// as the proxy's namespace leaves room for (250 bytes less "default:", or
// "default#N:" once flush_all moved the bucket); with flush_all in the
// stream CAS values are compared by identity (textdiff.Options
// CASByIdentity says why).
//
// The stream also holds failure batches (textdiff's package doc): the
// proxy gets them where every command that needs memcached fails, in
// turn through a second proxy whose memcached never answers (its 100 ms
// upstream timeout fires) and through a [[listener]] of a bucket whose
// budget is spent with the engine's clock standing still (max_hold
// refuses everything), and memcached gets each command made to fail as it
// fails commands; both must frame every failure alike.
//
// Under -race each stream is half as long: make test runs the whole
// streams without race in the upstream-TLS pass, where TLS changes only
// the proxy's upstream wire, and the race pass's half was the last test
// it waited for.
func TestTextDifferential(t *testing.T) {
	t.Parallel()
	share := testmc.UnderRace(1, 2)
	runs := []struct {
		seed     uint64
		commands int
		flush    bool
	}{
		{1, 4000, false}, {2, 4000, false}, {3, 4000, false}, {11, 8000, true},
	}
	for _, run := range runs {
		t.Run(fmt.Sprintf("seed%d", run.seed), func(t *testing.T) {
			t.Parallel()
			direct := testmc.Start(t, textdiff.MemcachedFlags...)
			p, failAddrs := startDiffProxy(t)
			keyMax := textdiffKeyMax("default:")
			if run.flush {
				keyMax = textdiffKeyMax("default#999:")
			}
			s := textdiff.Generate(textdiff.GenOptions{Seed: run.seed, Commands: run.commands / share, FlushAll: run.flush, KeyMax: keyMax, Failures: true})
			// Liveness bounds only (the replies are compared, not timed):
			// a batch gets two minutes, the stream the test binary's
			// time. Under -race on a machine loaded 30 times over, a
			// batch of one get of 2,000 keys once took more than 20 s.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			rep, err := textdiff.Run(ctx, direct.Addr, p.Addr, s, textdiff.Options{Timeout: 2 * time.Minute, CASByIdentity: run.flush, FailAddrs: failAddrs})
			if err != nil {
				t.Fatalf("after %d commands: %v", rep.Commands, err)
			}
			if rep.Diff != nil {
				t.Fatalf("after %d commands:\n%v", rep.Commands, rep.Diff)
			}
			if rep.Commands != s.Len() {
				t.Fatalf("ran %d of %d commands", rep.Commands, s.Len())
			}
			t.Logf("%d commands (%d failing) in %d batches on %d connections: identical", rep.Commands, failing(s), rep.Batches, rep.Conns)
		})
	}
}

// startDiffProxy starts the proxy TestTextDifferential compares with
// memcached, in front of a fresh memcached started with
// textdiff.MemcachedFlags, and returns it with the addresses where it
// fails every command that needs memcached (textdiff.Options FailAddrs):
// a second proxy whose memcached never answers, and a [[listener]] of the
// first whose bucket "held" has spent its budget. The engine's clock
// stands still: the default bucket, with no limit, is never held, and the
// held bucket is never admitted again, so max_hold refuses its commands.
func startDiffProxy(t *testing.T) (*testProxy, []string) {
	t.Helper()
	clock := throttle.NewFakeClock(time.Hour)
	held := testmc.FreeAddr(t)
	p := startProxyTo(t, testmc.Start(t, textdiff.MemcachedFlags...), testConfig{
		throttle: "capacity = \"unlimited\"\nburst_ms = 0\nmax_hold = \"1ms\"",
		tail: "[[bucket]]\nname = \"default\"\nflush_enabled = true\n[[bucket]]\nname = \"held\"\nhard_limit = 1\n" +
			fmt.Sprintf("[[listener]]\nlisten = %q\nbucket = \"held\"\n", held),
		clock: clock,
	})
	// One command spends its budget (a miss: memcached's CAS counter,
	// which the stream compares, does not move).
	clock.Advance(10 * time.Second)
	if got := textDo(t, dialText(t, held), "get spend\r\n", "END\r\n"); got != "END\r\n" {
		t.Fatalf("spending the held bucket's budget: %q", got)
	}
	silent := startProxyTo(t, &testmc.Server{Addr: silentUpstream(t)}, testConfig{upstream: `timeout = "100ms"`})
	return p, []string{silent.Addr, held}
}

// failing counts the commands of the failure batches of s.
func failing(s *textdiff.Stream) int {
	n := 0
	for _, b := range s.Batches {
		if b.Fails {
			n += len(b.Cmds)
		}
	}
	return n
}

// textdiffKeyMax is the longest key a client of a bucket whose namespace
// is prefix can use: memcached's 250 bytes less the namespace.
func textdiffKeyMax(prefix string) int { return 250 - len(prefix) }
