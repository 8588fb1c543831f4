package proxy

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// A bucket's commands on a loop are admitted through the loop's lease of
// its units (throttle.Lease): after a pipeline of SETs the lane holds the
// rest of a chunk drawn from the free pool, the bucket's statistics count
// every command exactly as soon as the client has its answers, and the
// stock goes back to the free pool once unused for throttle.LeaseTTL (at
// the loop's next tick here: nothing else runs on the loop). The engine's
// clock is a fake one, so that the stock is seen before it expires.
func TestLoopLeaseAdmits(t *testing.T) {
	t.Parallel()
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: "capacity = 10000000", loops: 1}, clock)
	c := dial(t, p.Addr)
	const n = 50
	for i := range n {
		c.Send(mcclient.Request{Opcode: mc.OpSet, Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte("v"), Extras: mcclient.SetExtras(0, 0)})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if r, err := c.Read(); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("SET %d: %v %v", i, err, r)
		}
	}
	if got := p.Engine().Bucket("default").Stats().Commands; got != n {
		t.Errorf("bucket statistics count %d commands once the client has its %d answers", got, n)
	}
	stock := func() (d throttle.Domain, units int64) {
		onLoop(t, p, func(lp *loop) {
			if s := sessionOf(lp, c.Conn().LocalAddr()); s != nil && s.bkt != nil {
				d, units = s.lane().lease.Stock()
			}
		})
		return
	}
	if d, units := stock(); d != throttle.FreePool || units <= 0 {
		t.Fatalf("after %d SETs the loop's lease holds %d units (%s); want a stock drawn from the free pool", n, units, d)
	}
	clock.Advance(throttle.LeaseTTL)
	eventually(t, 5*time.Second, "the unused stock to go back", func() bool {
		_, units := stock()
		return units == 0
	})
	if got := p.Engine().Bucket("default").Stats().Commands; got != n {
		t.Errorf("bucket statistics count %d commands after the stock went back; want %d", got, n)
	}
}
