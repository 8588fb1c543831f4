package textdiff

import (
	"context"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// TestMemcachedAgainstItself runs long streams against two fresh
// memcached servers started alike: every reply must match, which shows
// that the generator only makes commands with deterministic replies.
func TestMemcachedAgainstItself(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		a, b := testmc.Start(t, MemcachedFlags...), testmc.Start(t, MemcachedFlags...)
		s := Generate(GenOptions{Seed: seed, Commands: 20000, FlushAll: true})
		start := time.Now()
		rep, err := Run(context.Background(), a.Addr, b.Addr, s, Options{})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if rep.Diff != nil {
			t.Fatalf("seed %d: %s", seed, rep.Diff)
		}
		t.Logf("seed %d: %d commands in %d batches on %d connections, %d bytes sent, %d bytes of replies, %v",
			seed, rep.Commands, rep.Batches, rep.Conns, rep.BytesSent, rep.RepliesA, time.Since(start))
	}
}
