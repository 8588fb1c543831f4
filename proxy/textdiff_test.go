package proxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/internal/textdiff"
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
func TestTextDifferential(t *testing.T) {
	runs := []struct {
		seed     uint64
		commands int
		flush    bool
	}{
		{1, 4000, false}, {2, 4000, false}, {3, 4000, false}, {11, 8000, true},
	}
	for _, run := range runs {
		t.Run(fmt.Sprintf("seed%d", run.seed), func(t *testing.T) {
			direct := testmc.Start(t, textdiff.MemcachedFlags...)
			p := startProxyTo(t, testmc.Start(t, textdiff.MemcachedFlags...), testConfig{})
			keyMax := textdiffKeyMax("default:")
			if run.flush {
				keyMax = textdiffKeyMax("default#999:")
			}
			s := textdiff.Generate(textdiff.GenOptions{Seed: run.seed, Commands: run.commands, FlushAll: run.flush, KeyMax: keyMax})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			rep, err := textdiff.Run(ctx, direct.Addr, p.Addr, s, textdiff.Options{Timeout: 20 * time.Second, CASByIdentity: run.flush})
			if err != nil {
				t.Fatalf("after %d commands: %v", rep.Commands, err)
			}
			if rep.Diff != nil {
				t.Fatalf("after %d commands:\n%v", rep.Commands, rep.Diff)
			}
			if rep.Commands != s.Len() {
				t.Fatalf("ran %d of %d commands", rep.Commands, s.Len())
			}
			t.Logf("%d commands in %d batches on %d connections: identical", rep.Commands, rep.Batches, rep.Conns)
		})
	}
}

// textdiffKeyMax is the longest key a client of a bucket whose namespace
// is prefix can use: memcached's 250 bytes less the namespace.
func textdiffKeyMax(prefix string) int { return 250 - len(prefix) }
