package upstream

import (
	"testing"
	"time"
)

// Outside review of issue 28, rule 4 (the prober learning item_size_max).

// TestPoolAsksSettingsAgainAfterOneLostAnswer: a memcached whose first
// `stats settings` answer is lost (here: not sent in time, as under load;
// every later one is answered at once with item_size_max 1024) stays up
// the whole time. The proxy must learn its item size anyway, if later
// than at once. (The prober stops asking a server after one unanswered
// ask until the server has been down: one slow answer at start leaves the
// too-large refusal off for as long as the server stays up, and a figure
// learned before is never refreshed, so a restart with another -I between
// two probes goes unseen.)
func TestPoolAsksSettingsAgainAfterOneLostAnswer(t *testing.T) {
	fs := startSettingsServer(t, func(ask int32) int64 {
		if ask == 1 {
			return 0 // lost
		}
		return 1024
	})
	stats := &fs.asks
	p := newTestPool(t, PoolConfig{Servers: []string{fs.addr}},
		PoolOptions{Timeout: 100 * time.Millisecond, ProbeInterval: 5 * time.Millisecond})
	p.Start()
	eventually(t, 5*time.Second, "the first ask", func() bool { return stats.Load() >= 1 })
	deadline := time.Now().Add(10 * time.Second)
	for p.ItemSizeMax() != 1024 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s up (about 2,000 probes): ItemSizeMax %d, asked for settings %d times; want 1024",
				p.ItemSizeMax(), stats.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
