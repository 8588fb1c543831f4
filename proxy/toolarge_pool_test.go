package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A write is held to the item size limit of its key's server, also when
// the ring changes (issue 28, rule 4): behind a memcached of 1 KiB items
// and one of 1 MiB, a 2000-byte set of a key of the small server is
// refused (and its old value unlinked, as memcached does); once that
// server is down and ejected its keys go to the large one, and the same
// set is stored there: the figure the down server last told caps none of
// the keys it no longer has.
func TestTooLargeEjectedServersLimitCapsNoKey(t *testing.T) {
	t.Parallel()
	p, small, big := startMixedItems(t, "eject_after_failures = 2\neject_retry = \"1h\"")
	via := dialText(t, p.Addr)
	key := keyOnServer(t, via, small, "ej")
	v := strings.Repeat("y", 2000)
	set := fmt.Sprintf("set %s 0 0 2000\r\n%s\r\nget %s\r\n", key, v, key)
	if got, want := textDo(t, via, set, "END\r\n"), "SERVER_ERROR object too large for cache\r\nEND\r\n"; got != want {
		t.Fatalf("2000-byte set of %s on the 1 KiB server: %q, want %q", key, got, want)
	}
	small.Stop()
	// Ejected as the loops see it (the prober publishes an ejection at the
	// end of its round): a small set of the key is stored again.
	eventually(t, time.Minute, "the 1 KiB server's keys on the other", func() bool {
		return textDo(t, via, "set "+key+" 0 0 3\r\nold\r\nmn\r\n", "MN\r\n") == "STORED\r\nMN\r\n"
	})
	got := textDo(t, via, set, "END\r\n")
	if want := fmt.Sprintf("STORED\r\nVALUE %s 0 2000\r\n%s\r\nEND\r\n", key, v); got != want {
		t.Fatalf("2000-byte set of %s with its 1 KiB server ejected:\n%.120q\nwant it stored on the 1 MiB server:\n%.120q", key, got, want)
	}
	if !onServer(t, big, key) {
		t.Fatalf("%s not on the 1 MiB server", key)
	}
}

// The binary protocol over a pool of mixed limits: the proxy reads a SET
// up to its key to tell its server's limit. Behind a memcached of 1 KiB
// items and one of 1 MiB, a 2000-byte SET of a key of the small server
// gets memcached's 0x0003 and unlinks the key there; SETs of 2000 bytes
// and of 300 KB (arriving over many reads) of a key of the large server
// are stored there.
func TestTooLargeMixedItemSizesBinary(t *testing.T) {
	t.Parallel()
	p, small, big := startMixedItems(t, "")
	via := dialText(t, p.Addr)
	onSmall, onBig := keyOnServer(t, via, small, "bs"), keyOnServer(t, via, big, "bb")
	c := dial(t, p.Addr)
	if r, err := c.Set([]byte(onSmall), bytes.Repeat([]byte{'y'}, 2000)); err != nil || r.Status() != mc.StatusE2big {
		t.Fatalf("2000-byte SET of %s on the 1 KiB server: %v %v, want E2big", onSmall, r, err)
	}
	if onServer(t, small, onSmall) {
		t.Fatalf("%s still on the 1 KiB server after the refused SET", onSmall)
	}
	for _, size := range []int{2000, 300 << 10} {
		v := bytes.Repeat([]byte{'z'}, size)
		if r, err := c.Set([]byte(onBig), v); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("%d-byte SET of %s on the 1 MiB server: %v %v, want stored", size, onBig, r, err)
		}
		if r, err := c.Get([]byte(onBig)); err != nil || r.Status() != mc.StatusSuccess || !bytes.Equal(r.Value, v) {
			t.Fatalf("GET %s after its %d-byte SET: %v %v", onBig, size, r, err)
		}
	}
}

// startMixedItems starts a proxy (startProxyOver, upstreamExtra in its
// [upstream]) in front of a memcached of 1 KiB items and one of the
// default 1 MiB, in that order, and waits until it knows the small one's
// limit.
func startMixedItems(t *testing.T, upstreamExtra string) (p *testProxy, small, big *testmc.Server) {
	t.Helper()
	small, big = testmc.Start(t, smallItems...), testmc.Start(t)
	p = startProxyOver(t, upstreamExtra, small, big)
	eventually(t, time.Minute, "the small server's item size known", func() bool { return p.pool.ItemSizeMax() == 1024 })
	return p, small, big
}

// keyOnServer sets keys named prefix0, prefix1, ... to "old" through the
// proxy on via until one lands on m, and returns it.
func keyOnServer(t *testing.T, via *textConn, m *testmc.Server, prefix string) string {
	t.Helper()
	for i := range 200 {
		k := fmt.Sprintf("%s%d", prefix, i)
		textDo(t, via, "set "+k+" 0 0 3\r\nold\r\n", "STORED\r\n")
		if onServer(t, m, k) {
			return k
		}
	}
	t.Fatalf("no key of 200 on %s", m.Addr)
	return ""
}

// TestTooLargeMixedItemSizes: a text write is held to the item size limit
// of its key's server, not to the smallest of the pool's: behind a
// memcached of 1 KiB items and one of the default 1 MiB, a 2000-byte set
// of a key of the 1 MiB server is stored there and read back, as that
// server answers it directly (a pool of mixed -I, or a rolling restart
// that changes it, loses no write the key's own server accepts, and
// unlinks no value there).
func TestTooLargeMixedItemSizes(t *testing.T) {
	t.Parallel()
	p, _, big := startMixedItems(t, "")
	via := dialText(t, p.Addr)
	key := keyOnServer(t, via, big, "mixed") // a key that lives on the 1 MiB server
	v := strings.Repeat("y", 2000)
	got := textDo(t, via, fmt.Sprintf("set %s 0 0 2000\r\n%s\r\nget %s\r\n", key, v, key), "END\r\n")
	want := fmt.Sprintf("STORED\r\nVALUE %s 0 2000\r\n%s\r\nEND\r\n", key, v)
	if got != want {
		t.Errorf("2000-byte set of %s (on the 1 MiB server) through the proxy:\n%.120q\nwant what its server answers:\n%.120q", key, got, want)
	}
}
