package upstream

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// The prober learns each server's item_size_max from its `stats
// settings`, and ItemSizeMax is the smallest known: 0 before any probe,
// the least of two servers started with different -I, kept while a
// server is down, and carried over a reload that keeps the servers.
func TestPoolLearnsItemSizeMax(t *testing.T) {
	big := testmc.Start(t, "-I", "2m")
	small := testmc.Start(t, "-I", "1k", "-o", "slab_chunk_max=512")
	p := newTestPool(t, PoolConfig{Servers: []string{big.Addr}},
		PoolOptions{Timeout: 500 * time.Millisecond, ProbeInterval: 20 * time.Millisecond})
	if n := p.ItemSizeMax(); n != 0 {
		t.Fatalf("ItemSizeMax %d before any probe, want 0", n)
	}
	p.Start()
	eventually(t, 5*time.Second, "the first server's item size", func() bool { return p.ItemSizeMax() == 2<<20 })
	if err := p.Update(PoolConfig{Servers: []string{big.Addr, small.Addr}, EjectAfter: 1, EjectRetry: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if n := p.ItemSizeMax(); n != 2<<20 {
		t.Fatalf("ItemSizeMax %d right after a reload that keeps the server, want %d", n, 2<<20)
	}
	eventually(t, 5*time.Second, "the smaller item size of the two", func() bool { return p.ItemSizeMax() == 1024 })
	small.Stop()
	eventually(t, 5*time.Second, "the small server down", func() bool { return !stateOf(p, small.Addr).Up })
	if n := p.ItemSizeMax(); n != 1024 {
		t.Fatalf("ItemSizeMax %d with the small server down, want its last figure 1024", n)
	}
}
