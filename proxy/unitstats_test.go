package proxy

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A command's units reach its bucket's counters (kvthrottle_units_total,
// STAT read_units_total and write_units_total) before its client has the
// answer, although the loops count them in their lanes and add them once
// per pass: here with memcached stopped, so that every SET and GET fails
// at once, inside the pass that read it (a failed command is billed one
// unit).
func TestUnitsCountedWhenAnswered(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`, loops: 1, upstream: `timeout = "200ms"`})
	c := dial(t, p.Addr)
	// The 200 ms upstream timeout is short enough for the 300 timeouts
	// below; on a loaded machine a warm-up SET may meet it too, so it is
	// re-tried (a liveness bound, not a figure).
	eventually(t, 20*time.Second, "a warm-up SET answered", func() bool {
		r, err := c.Set([]byte("warm"), []byte("v"))
		return status(t, r, err) == mc.StatusSuccess
	})
	p.MC.Stop()
	failed, lateW, lateR := 0, 0, 0
	deadline := time.Now().Add(5 * time.Second)
	for failed < 300 && time.Now().Before(deadline) {
		before := bucketUnits(t, p, "default")
		r, err := c.Set([]byte("k"), []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		after := bucketUnits(t, p, "default")
		if r.Status() == mc.StatusEtmpfail {
			failed++
			if after.write == before.write {
				lateW++
			}
		}
		r, err = c.Get([]byte("k"))
		if err != nil {
			t.Fatal(err)
		}
		if r.Status() == mc.StatusEtmpfail && bucketUnits(t, p, "default").read == after.read {
			lateR++
		}
	}
	if failed == 0 {
		t.Fatal("no command failed with memcached stopped")
	}
	if lateW+lateR > 0 {
		t.Errorf("of %d failed SETs and GETs, %d SETs and %d GETs were answered before their units were counted", failed, lateW, lateR)
	}
}

// A STAT throttle pipelined behind a SET counts the SET, whose answer
// comes first: read_units_total + write_units_total stay equal to
// units_total within one reply.
func TestPipelinedSetThenStat(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`, loops: 1})
	c := dial(t, p.Addr)
	// The 200 ms upstream timeout is short enough for the 300 timeouts
	// below; on a loaded machine a warm-up SET may meet it too, so it is
	// re-tried (a liveness bound, not a figure).
	eventually(t, 20*time.Second, "a warm-up SET answered", func() bool {
		r, err := c.Set([]byte("warm"), []byte("v"))
		return status(t, r, err) == mc.StatusSuccess
	})
	for round := 0; round < 20; round++ {
		c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte("k"), Value: []byte("v")})
		c.Send(mcclient.Request{Opcode: mc.OpStat, Key: []byte("throttle")})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if r, err := c.Read(); err != nil || r.Opcode != mc.OpSet || r.Status() != mc.StatusSuccess {
			t.Fatalf("SET: %v %v", err, r)
		}
		stats := map[string]uint64{}
		for {
			r, err := c.Read()
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Key) == 0 {
				break
			}
			if v, err := strconv.ParseUint(string(r.Value), 10, 64); err == nil {
				stats[string(r.Key)] = v
			}
		}
		const pre = "bucket:default:"
		read, write, total := stats[pre+"read_units_total"], stats[pre+"write_units_total"], stats[pre+"units_total"]
		if want := uint64(round + 2); write != want || read+write != total {
			t.Fatalf("round %d: STAT after the SET's answer: read %d + write %d units, units_total %d; want %d write units and the sum equal to the total", round, read, write, total, want)
		}
	}
}
