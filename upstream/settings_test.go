package upstream

import (
	"io"
	"net"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// The prober learns each server's item_size_max from its `stats
// settings`, and ItemSizeMax is the smallest known: 0 before any probe,
// the least of two servers started with different -I, kept while a
// server is down, and carried over a reload that keeps the servers. The
// test runs the prober's rounds itself (the pool is not started), so what
// it reads after a reload is the carried figure, never one a prober
// learned in between.
func TestPoolLearnsItemSizeMax(t *testing.T) {
	big := testmc.Start(t, "-I", "2m")
	small := testmc.Start(t, "-I", "1k", "-o", "slab_chunk_max=512")
	p := newTestPool(t, PoolConfig{Servers: []string{big.Addr}},
		PoolOptions{Timeout: 5 * time.Second, ProbeInterval: time.Hour})
	probe := func() {
		h := p.set.Load().health
		h.probeAll(make([]int, len(h.servers)), make([]time.Time, len(h.servers)))
	}
	if n := p.ItemSizeMax(); n != 0 {
		t.Fatalf("ItemSizeMax %d before any probe, want 0", n)
	}
	probe()
	if n := p.ItemSizeMax(); n != 2<<20 {
		t.Fatalf("ItemSizeMax %d after the first probe, want %d", n, 2<<20)
	}
	if err := p.Update(PoolConfig{Servers: []string{big.Addr, small.Addr}}); err != nil {
		t.Fatal(err)
	}
	if n := p.ItemSizeMax(); n != 2<<20 {
		t.Fatalf("ItemSizeMax %d right after a reload that keeps the server, want %d", n, 2<<20)
	}
	probe()
	if n := p.ItemSizeMax(); n != 1024 {
		t.Fatalf("ItemSizeMax %d once both servers answered, want the smaller 1024", n)
	}
	small.Stop()
	probe()
	if stateOf(p, small.Addr).Up {
		t.Fatal("the small server still up after it stopped")
	}
	if n := p.ItemSizeMax(); n != 1024 {
		t.Fatalf("ItemSizeMax %d with the small server down, want its last figure 1024", n)
	}
}

// The ask schedule of a server that answers VERSION but not `stats
// settings` (not memcached, or its answers lost): it stays up with no item
// size known, and is asked at the first probe, then again one probe after
// each unanswered ask with the gap doubling (1, 2, 4, ... probes) up to a
// minute's worth of probes: at a 15 s interval, 4 probes. So it holds up
// the prober (each unanswered ask costs the probe timeout) less and less
// often, yet its figure is learned soon after it starts answering. The
// probes are counted, not timed: the test runs the prober's rounds itself.
func TestPoolAsksSettingsWithGrowingGaps(t *testing.T) {
	var answer atomic.Int64 // 0: asks answered without the figure
	fs := startSettingsServer(t, func(int32) int64 { return answer.Load() })
	p := newTestPool(t, PoolConfig{Servers: []string{fs.addr}},
		PoolOptions{Timeout: 10 * time.Second, ProbeInterval: 15 * time.Second}) // liveness: no ask waits for it
	h := p.set.Load().health
	fails, retryAt := make([]int, 1), make([]time.Time, 1)
	var probes int32
	asked := func(n int) []int { // which of the next n probes (numbered from 1) asked for settings
		var at []int
		for i := 1; i <= n; i++ {
			before := fs.asks.Load()
			h.probeAll(fails, retryAt)
			probes++
			fs.settle(t, probes)
			if fs.asks.Load() > before {
				at = append(at, i)
			}
		}
		return at
	}
	// Gaps 1, 2, 4, then the cap of 4 (a minute at 15 s).
	if got, want := asked(19), []int{1, 2, 4, 8, 12, 16}; !slices.Equal(got, want) {
		t.Fatalf("unanswered: asked at probes %v, want %v", got, want)
	}
	if !p.AnyUp() || p.ItemSizeMax() != 0 {
		t.Fatalf("up %v, ItemSizeMax %d; want up with no item size", p.AnyUp(), p.ItemSizeMax())
	}
	// It starts answering: learned at the next ask, then asked at every
	// probe (a memcached restarted with another -I is followed at once).
	answer.Store(2048)
	if got, want := asked(4), []int{1, 2, 3, 4}; !slices.Equal(got, want) || p.ItemSizeMax() != 2048 {
		t.Fatalf("answering after probe 16: asked at probes %v of the next 4, want %v; ItemSizeMax %d, want 2048",
			got, want, p.ItemSizeMax())
	}
	answer.Store(1024)
	if asked(1); p.ItemSizeMax() != 1024 {
		t.Fatalf("ItemSizeMax %d after the server told 1024, want 1024", p.ItemSizeMax())
	}
	// Unanswered again: the known figure stays, the gaps start at 1 again.
	answer.Store(0)
	if got, want := asked(8), []int{1, 2, 4, 8}; !slices.Equal(got, want) || p.ItemSizeMax() != 1024 {
		t.Fatalf("unanswered after an answer: asked at probes %v, want %v; ItemSizeMax %d, want the last figure 1024",
			got, want, p.ItemSizeMax())
	}
	// Down for a probe (a restart): asked at the first probe it answers,
	// whatever the gap had grown to.
	fs.down.Store(true)
	asked(1)
	fs.down.Store(false)
	answer.Store(4096)
	if got := asked(1); len(got) != 1 || p.ItemSizeMax() != 4096 {
		t.Fatalf("first probe after down: asked %v, ItemSizeMax %d; want asked, 4096", got, p.ItemSizeMax())
	}
}

// settingsServer is a fake memcached for the prober, on a loopback port of
// its own until the test ends: it answers VERSION, and `stats settings`
// with the item_size_max reply returns for the ask (numbered from 1),
// and without one when that is 0: to the prober the same as an answer
// lost (it learns nothing, and asks again on the same schedule), but
// given at once, so that no probe waits for the probe timeout (a test
// that counts probes sets it long: a probe that timed out on a loaded
// machine would count the server down). While down is set it closes every
// connection at once.
type settingsServer struct {
	addr   string
	asks   atomic.Int32 // `stats settings` asks received
	served atomic.Int32 // connections it has read to their end
	down   atomic.Bool
}

// settle waits until the server has read conns connections to their end
// (a probe's connection ends when the probe returns): every ask they made
// is counted.
func (fs *settingsServer) settle(t *testing.T, conns int32) {
	t.Helper()
	eventually(t, time.Minute, "the probes' connections read", func() bool { return fs.served.Load() >= conns })
}

func startSettingsServer(t *testing.T, reply func(ask int32) int64) *settingsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := &settingsServer{addr: ln.Addr().String()}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if fs.down.Load() {
				c.Close()
				fs.served.Add(1)
				continue
			}
			go fs.serve(c, reply)
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return fs
}

// serve answers the requests of one connection (settingsServer).
func (fs *settingsServer) serve(c net.Conn, reply func(ask int32) int64) {
	defer fs.served.Add(1)
	defer c.Close()
	var hdr [binary.HeaderLen]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return
		}
		h, _ := binary.ParseHeader(hdr[:])
		if _, err := io.CopyN(io.Discard, c, int64(h.BodyLen)); err != nil {
			return
		}
		var resp []byte
		if h.Opcode == binary.OpStat {
			v := reply(fs.asks.Add(1))
			sh := binary.Header{Magic: binary.MagicResponse, Opcode: binary.OpStat, Opaque: h.Opaque}
			resp = binary.AppendFrame(resp, sh, nil, nil, []byte("maxconns"), []byte("1024"))
			if v != 0 {
				resp = binary.AppendFrame(resp, sh, nil, nil, []byte("item_size_max"), strconv.AppendInt(nil, v, 10))
			}
			resp = binary.AppendFrame(resp, sh, nil, nil, nil, nil)
		} else {
			resp = binary.AppendFrame(nil, binary.Header{Magic: binary.MagicResponse, Opcode: binary.OpVersion, Opaque: h.Opaque}, nil, nil, nil, []byte("1.6.18"))
		}
		if _, err := c.Write(resp); err != nil {
			return
		}
	}
}

// ItemSizeMaxFor is the figure of the server Pick sends the key to, on the
// loop's server list: its own server's, that of the server taking its keys
// while it is ejected (an ejected server's figure applies to no key), 0
// for a server whose figure is unknown, and, after a reload, the new
// list's once the loop has adopted it (Tick), in step with Pick. It
// allocates nothing.
func TestLoopPoolItemSizeMaxFor(t *testing.T) {
	servers := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"}
	figures := map[string]int64{servers[0]: 1024, servers[1]: 4096} // servers[2]: unknown
	p := newTestPool(t, PoolConfig{Servers: servers}, PoolOptions{})
	h := p.set.Load().health
	for i, addr := range servers {
		h.itemMax[i].Store(figures[addr])
	}
	h.itemMin.Store(h.minItemSize())
	lp := p.Loop(nil, nil)
	keys := testKeys(1000)
	check := func(when string) map[string]int {
		t.Helper()
		on := map[string]int{}
		for _, k := range keys {
			addr := lp.Pick(k).Addr()
			on[addr]++
			if got := lp.ItemSizeMaxFor(k); got != figures[addr] {
				t.Fatalf("%s: key %s on %s: ItemSizeMaxFor %d, want that server's %d", when, k, addr, got, figures[addr])
			}
		}
		return on
	}
	if on := check("all in"); on[servers[0]] == 0 || on[servers[1]] == 0 || on[servers[2]] == 0 {
		t.Fatalf("keys per server %v: want some on each", on)
	}
	if p.ItemSizeMax() != 1024 || lp.LeastItemSizeMax() != 1024 {
		t.Fatalf("least figure %d (loop %d), want 1024", p.ItemSizeMax(), lp.LeastItemSizeMax())
	}
	h.ejected[0].Store(true)
	h.publish()
	if on := check("1 KiB server ejected"); on[servers[0]] != 0 {
		t.Fatalf("%d keys still on the ejected server", on[servers[0]])
	}
	if n := testing.AllocsPerRun(100, func() { lp.ItemSizeMaxFor(keys[7]) }); n != 0 {
		t.Errorf("ItemSizeMaxFor: %v allocations, want 0", n)
	}
	h.ejected[0].Store(false)
	h.publish()
	// A reload that drops the 4 KiB server: the loop routes with the old
	// list, figures included, until its Tick.
	if err := p.Update(PoolConfig{Servers: []string{servers[0], servers[2]}}); err != nil {
		t.Fatal(err)
	}
	check("reloaded, not adopted")
	lp.Tick(time.Now())
	if on := check("reloaded and adopted"); on[servers[1]] != 0 || on[servers[0]] == 0 {
		t.Fatalf("keys per server after the reload %v", on)
	}
}

// TestPoolAsksSettingsAgainAfterOneLostAnswer: the prober keeps asking a
// server that stays up for its settings after an ask goes unanswered (as
// under load), so a memcached whose first `stats settings` answer is lost
// (every later one answered at once with item_size_max 1024) has its item
// size learned, if later than at once: one slow answer at start does not
// leave the too-large refusal off while the server stays up, and a figure
// learned before is refreshed (a restart with another -I between two
// probes is seen).
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
	eventually(t, time.Minute, "the first ask", func() bool { return stats.Load() >= 1 })
	deadline := time.Now().Add(10 * time.Second)
	for p.ItemSizeMax() != 1024 {
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s up (about 2,000 probes): ItemSizeMax %d, asked for settings %d times; want 1024",
				p.ItemSizeMax(), stats.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
