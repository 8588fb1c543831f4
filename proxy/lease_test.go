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
// stock goes back to the free pool once unused for throttle.LeaseTTL, on
// the engine's clock (a fake one here, so that the stock is seen before it
// expires).
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
	// The stock goes back on the engine's clock, from the loop's own
	// timer (nothing else runs on the loop, and the real-time tick does
	// not expire leases): kept while unused for less than LeaseTTL, gone
	// within LeaseTTL and one expiry period (leaseEvery).
	ft := &fakeTime{t: t, p: p, clock: clock}
	ft.step(throttle.LeaseTTL-time.Nanosecond, 0, nil)
	if _, units := stock(); units <= 0 {
		t.Fatalf("the stock went back after %v unused, before LeaseTTL", throttle.LeaseTTL-time.Nanosecond)
	}
	ft.step(leaseEvery+time.Nanosecond, 0, nil)
	if _, units := stock(); units != 0 {
		t.Fatalf("the loop's lease still holds %d units %v after its last use", units, throttle.LeaseTTL+leaseEvery)
	}
	if got := p.Engine().Bucket("default").Stats().Commands; got != n {
		t.Errorf("bucket statistics count %d commands after the stock went back; want %d", got, n)
	}
}
