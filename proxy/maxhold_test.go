package proxy

import (
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// throttle.max_hold: a command whose wait would pass it is answered
// Etmpfail with {"next_tick_us":N} at once, instead of being held past its
// client's timeout (dalli's multi-get silently returned 55 of 100 keys
// when the bucket was held past its 1 s timeout). The connection goes on
// working, and the refusal counts as rejected.
func TestMaxHoldAnswersEtmpfail(t *testing.T) {
	p := startProxy(t, testConfig{
		throttle: "capacity = \"unlimited\"\nburst_ms = 0\nmax_hold = \"300ms\"",
		tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 10\n",
	})
	c := dial(t, p.Addr)
	// A 10-unit SET takes a second of the limit; the commands behind it
	// would wait about that long, past max_hold: they are refused at
	// once, while a command whose wait fits is held and runs.
	big := make([]byte, 10*4096-10)
	if r, err := c.Set([]byte("big"), big); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("SET of 10 units: %v %+v", err, r)
	}
	start := time.Now()
	refused := 0
	for i := 0; i < 3; i++ {
		r, err := c.Get([]byte("big"))
		if err != nil {
			t.Fatal(err)
		}
		if r.Status() != mc.StatusEtmpfail || !strings.HasPrefix(string(r.Value), `{"next_tick_us":`) {
			t.Fatalf("GET behind a second of debt: %v %q, want Etmpfail with {\"next_tick_us\":N}", r.Status(), r.Value)
		}
		refused++
	}
	if elapsed := time.Since(start); elapsed > 150*time.Millisecond {
		t.Errorf("three refusals took %v: a refused command must be answered at once", elapsed)
	}
	if st := p.Engine().Bucket("default").Stats(); st.Rejected != uint64(refused) {
		t.Errorf("rejected counter %d, want %d", st.Rejected, refused)
	}
	// The connection still works once the bucket has room again; a wait
	// within max_hold is held, not refused.
	eventually(t, 5*time.Second, "a SET to succeed after the refusals", func() bool {
		r, err := c.Set([]byte("k"), []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		return r.Status() == mc.StatusSuccess
	})
	r, err := c.Set([]byte("k"), []byte("v")) // 100 ms behind the last one
	if err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("a SET whose wait fits max_hold: %v %+v, want it held and stored", err, r)
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
