package proxy

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// throttle.max_hold: a command whose wait would pass it is answered
// Etmpfail with {"next_tick_us":N} at once, instead of being held past its
// client's timeout (dalli's multi-get silently returned 55 of 100 keys
// when the bucket was held past its 1 s timeout). The connection goes on
// working, and the refusal counts as rejected. On the fake clock: the
// refusals come with the clock standing still (a held command would not
// be answered before the test moves it), N is the exact wait, and a
// command whose wait fits max_hold is held until the clock reaches its
// turn, not refused.
func TestMaxHoldAnswersEtmpfail(t *testing.T) {
	t.Parallel()
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{
		throttle: "capacity = \"unlimited\"\nburst_ms = 0\nmax_hold = \"300ms\"",
		tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 10\n",
		loops:    1,
	}, clock)
	c := dial(t, p.Addr)
	// A 10-unit SET takes a second of the limit; the commands behind it
	// would wait that long, past max_hold: they are refused at once.
	big := make([]byte, 10*4096-10)
	if r, err := c.Set([]byte("big"), big); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("SET of 10 units: %v %+v", err, r)
	}
	for i := 0; i < 3; i++ {
		r, err := c.Get([]byte("big")) // held, it would never be answered: the clock stands still
		if err != nil {
			t.Fatalf("GET %d behind a second of debt, the clock standing still: %v (held instead of refused?)", i, err)
		}
		if want := `{"next_tick_us":1000000}`; r.Status() != mc.StatusEtmpfail || string(r.Value) != want {
			t.Fatalf("GET behind a second of debt: %v %q, want Etmpfail with %s", r.Status(), r.Value, want)
		}
	}
	b := p.Engine().Bucket("default")
	st0 := b.Stats()
	if st0.Rejected != 3 {
		t.Errorf("rejected counter %d, want 3", st0.Rejected)
	}
	// 900 ms later a 1-unit SET waits 100 ms, within max_hold: held (not
	// answered while the clock stands still), then stored when the clock
	// reaches its turn.
	clock.Advance(900 * time.Millisecond)
	c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte("k"), Value: []byte("v")})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	ft := &fakeTime{t: t, p: p, clock: clock}
	ft.settle(1, nil)
	if st := b.Stats(); st.Held != st0.Held+1 || st.Rejected != 3 {
		t.Fatalf("a SET whose wait fits max_hold: held %d times more, rejected %d; want it held once, no new refusal", st.Held-st0.Held, st.Rejected)
	}
	ft.step(99*time.Millisecond, 1, nil)
	ft.step(time.Millisecond, 0, nil)
	if r, err := c.Read(); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("the held SET at its turn: %v %+v, want it stored", err, r)
	}
}

// Without max_hold, the same pipeline is held, not refused.
func TestNoMaxHoldHolds(t *testing.T) {
	p := startProxy(t, testConfig{
		throttle: "capacity = \"unlimited\"\nburst_ms = 0",
		tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 20\n",
	})
	c := dial(t, p.Addr)
	for i := 0; i < 5; i++ {
		c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte("k"), Value: []byte("v")})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		r, err := c.Read()
		if err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("response %d: %v %+v, want every SET stored", i, err, r)
		}
	}
	if st := p.Engine().Bucket("default").Stats(); st.Rejected != 0 || st.Held == 0 {
		t.Errorf("held %d, rejected %d: want held, none rejected", st.Held, st.Rejected)
	}
}
