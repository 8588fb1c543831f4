package upstream

import (
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	"github.com/kvthrottle/kvthrottle/proto/binary"
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

// A server that answers VERSION but not `stats settings` (not memcached)
// stays up with no item size known, and is asked for its settings once,
// not at every probe (each unanswered ask holds the prober up to its
// timeout).
func TestPoolAsksSettingsOnceOfAServerThatDoesNotAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var versions, stats atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
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
					if h.Opcode == binary.OpStat {
						stats.Add(1) // never answered
						continue
					}
					versions.Add(1)
					resp := binary.AppendFrame(nil, binary.Header{Magic: binary.MagicResponse, Opcode: binary.OpVersion, Opaque: h.Opaque}, nil, nil, nil, []byte("1.6.18"))
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	p := newTestPool(t, PoolConfig{Servers: []string{ln.Addr().String()}},
		PoolOptions{Timeout: 100 * time.Millisecond, ProbeInterval: 5 * time.Millisecond})
	p.Start()
	eventually(t, 5*time.Second, "five probes answered", func() bool { return versions.Load() >= 5 })
	if !p.AnyUp() || p.ItemSizeMax() != 0 {
		t.Fatalf("up %v, ItemSizeMax %d; want up with no item size", p.AnyUp(), p.ItemSizeMax())
	}
	if n := stats.Load(); n != 1 {
		t.Fatalf("asked for settings %d times in %d probes, want once", n, versions.Load())
	}
}
