package proxy

// Test helpers that read what memcached and the proxy counted: memcached's
// own STATs, a bucket's units, its wait histogram.

import (
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
)

// memcachedGetHits returns memcached's get_hits, asked directly.
func memcachedGetHits(t *testing.T, addr string) int { return memcachedStat(t, addr, "get_hits") }

// memcachedStat returns the general STAT named name of the memcached at
// addr, read on a connection of its own.
func memcachedStat(t *testing.T, addr, name string) int {
	t.Helper()
	c, err := mcclient.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return statOn(t, c, name)
}

// statOn returns the general STAT named name that c's server reports.
func statOn(t *testing.T, c *mcclient.Client, name string) int {
	t.Helper()
	kv, err := c.Stats("")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range kv {
		if e[0] == name {
			n, err := strconv.Atoi(e[1])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("memcached has no %s stat", name)
	return 0
}

// bytesRead returns memcached's bytes_read at addr.
func bytesRead(t *testing.T, addr string) int {
	t.Helper()
	tc := dialText(t, addr)
	for _, l := range strings.Split(textDo(t, tc, "stats\r\n", "END\r\n"), "\r\n") {
		if v, ok := strings.CutPrefix(l, "STAT bytes_read "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no bytes_read in memcached's stats")
	return 0
}

// unitCounts is a bucket's units so far: read and write units (as
// /metrics and STAT throttle give them) and the engine's total charged.
type unitCounts struct{ read, write, engine uint64 }

func (u unitCounts) minus(o unitCounts) unitCounts {
	return unitCounts{u.read - o.read, u.write - o.write, u.engine - o.engine}
}

// waitHistogram returns bucket's kvthrottle_throttle_wait_seconds (how
// long its held commands were held), or nil if it has none.
func waitHistogram(t testing.TB, p *testProxy, bucket string) *dto.Histogram {
	t.Helper()
	mfs, err := p.Metrics().Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvthrottle_throttle_wait_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == bucket {
				return m.GetHistogram()
			}
		}
	}
	return nil
}
