package proxy

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// TestMemcapable runs libmemcached's conformance suites, binary and
// ascii, through the proxy: each must pass every test, as against
// memcached.
func TestMemcapable(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{})
	runMemccapable(t, p.Addr, "-b", 27)
	runMemccapable(t, p.Addr, "-a", 17)
}

// TestGetKQBatch pipelines 1000 GETKQ for keys of which half exist, then a
// NOOP: exactly the hits come back, in order, then the NOOP.
func TestGetKQBatch(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{})
	c := dial(t, p.Addr)
	for i := 0; i < 1000; i += 2 {
		c.Send(mcclient.Request{Opcode: mc.OpSetQ, Extras: mcclient.SetExtras(0, 0), Key: []byte(fmt.Sprintf("kq-%d", i)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	if r, err := c.Do(mcclient.Request{Opcode: mc.OpNoop}); err != nil || r.Opcode != mc.OpNoop {
		t.Fatalf("NOOP after SETQ batch: %+v %v", r, err)
	}
	var ops []uint32
	for i := 0; i < 1000; i++ {
		ops = append(ops, c.Send(mcclient.Request{Opcode: mc.OpGetKQ, Key: []byte(fmt.Sprintf("kq-%d", i))}))
	}
	noop := c.Send(mcclient.Request{Opcode: mc.OpNoop})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 1000; i += 2 {
		r, err := c.Read()
		if err != nil {
			t.Fatalf("hit %d: %v", i, err)
		}
		want := fmt.Sprintf("kq-%d", i)
		if r.Opcode != mc.OpGetKQ || r.Status() != mc.StatusSuccess || string(r.Key) != want || string(r.Value) != "v"+want[3:] || r.Opaque != ops[i] {
			t.Fatalf("response %d: op %s status %s key %q value %q opaque %d (want %d)", i/2, r.Opcode, r.Status(), r.Key, r.Value, r.Opaque, ops[i])
		}
	}
	r, err := c.Read()
	if err != nil || r.Opcode != mc.OpNoop || r.Opaque != noop {
		t.Fatalf("after the hits: %+v %v, want the NOOP", r, err)
	}
}

// TestConcurrentClientsNoCrossTalk runs 100 clients doing 1000 mixed
// commands each; every client reads back exactly its own values.
//
// Under -race each client does 250: the 100 clients are in flight together
// from their first commands on, 250 take each client through every kind of
// command (i%4) and every value length (i%200), and the race detector
// watches the loops' shared paths on every command. The 1000 run without
// -race in make test's upstream-TLS pass.
func TestConcurrentClientsNoCrossTalk(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{loops: 2})
	const clients = 100
	ops := testmc.UnderRace(1000, 250)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for ci := 0; ci < clients; ci++ {
		wg.Add(1)
		go func(ci int) {
			defer wg.Done()
			errs <- runMixed(p.Addr, ci, ops)
		}(ci)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// TestDisconnectInFlight closes clients with requests in flight: later
// clients work and no goroutine is left behind.
func TestDisconnectInFlight(t *testing.T) {
	p := startProxy(t, testConfig{})
	warm := dial(t, p.Addr)
	if _, err := warm.Set([]byte("warm"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	base := goroutinesOutside("connbridge.")
	for i := 0; i < 50; i++ {
		c, err := mcclient.Dial(p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 200; j++ {
			c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte(fmt.Sprintf("d%d", j)), Value: bytes.Repeat([]byte("v"), 1000)})
			c.Send(mcclient.Request{Opcode: mc.OpGetQ, Key: []byte(fmt.Sprintf("missing%d", j))})
		}
		_ = c.Flush()
		c.Close()
	}
	eventually(t, 30*time.Second, "in-flight commands to drain", func() bool { return p.inflight() == 0 })
	eventually(t, 30*time.Second, "connections to close", func() bool { return p.Connections() == 1 })
	c := dial(t, p.Addr)
	for i := 0; i < 100; i++ {
		key := []byte(fmt.Sprintf("after%d", i))
		if r, err := c.Set(key, key); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("set after disconnects: %v %v", err, r)
		}
		if r, err := c.Get(key); err != nil || !bytes.Equal(r.Value, key) {
			t.Fatalf("get after disconnects: %v %v", err, r)
		}
	}
	// Not counted: the bridges of upstream TLS connections
	// (KVTHROTTLE_TEST_UPSTREAM_TLS=1), which the pool opens as load grows
	// and keeps.
	eventually(t, 30*time.Second, "goroutines back to baseline", func() bool { return goroutinesOutside("connbridge.") <= base+1 })
}

// TestInvalidFrames: a bad magic and a body over the limit get Einval, then
// the connection closes; other clients are unaffected.
func TestInvalidFrames(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{proxy: "max_frame_bytes = 1048576"})
	good := dial(t, p.Addr)

	huge := make([]byte, mc.HeaderLen)
	h := mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpSet, BodyLen: 1<<32 - 1, Opaque: 77}
	h.Put(huge)
	for name, raw := range map[string][]byte{
		"4GiB body":      huge,
		"response magic": mc.AppendFrame(nil, mc.Header{Magic: mc.MagicResponse, Opcode: mc.OpGet, Opaque: 77}, nil, nil, []byte("k"), nil),
		"bad lengths": func() []byte {
			b := make([]byte, 40)
			(&mc.Header{Magic: mc.MagicRequest, KeyLen: 30, BodyLen: 16, Opaque: 77}).Put(b)
			return b
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			c := dial(t, p.Addr)
			c.WriteRaw(raw)
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			r, err := c.Read()
			if err != nil {
				t.Fatalf("no Einval response: %v", err)
			}
			if r.Status() != mc.StatusEinval || r.Opaque != 77 || len(r.Value) == 0 {
				t.Fatalf("got status %s opaque %d reason %q, want Einval with a reason", r.Status(), r.Opaque, r.Value)
			}
			if err := closedWithin(c.Conn(), clientPatience); err != nil {
				t.Fatalf("after an invalid frame: %v", err)
			}
		})
	}
	if r, err := good.Set([]byte("still"), []byte("works")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("well-formed client after garbage: %v %v", err, r)
	}
}

// TestQuietAndLocalOrdering: local responses (NOOP, unknown opcodes) keep
// their place among forwarded ones.
func TestQuietAndLocalOrdering(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{})
	c := dial(t, p.Addr)
	a := c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte("o1"), Value: []byte("1")})
	b := c.Send(mcclient.Request{Opcode: 0xee})
	d := c.Send(mcclient.Request{Opcode: mc.OpGetQ, Key: []byte("o1")})
	e := c.Send(mcclient.Request{Opcode: mc.OpGetQ, Key: []byte("nope")})
	f := c.Send(mcclient.Request{Opcode: mc.OpNoop})
	_ = e
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		op     uint32
		status mc.Status
	}{{a, mc.StatusSuccess}, {b, mc.StatusUnknownCommand}, {d, mc.StatusSuccess}, {f, mc.StatusSuccess}}
	for i, w := range want {
		r, err := c.Read()
		if err != nil || r.Opaque != w.op || r.Status() != w.status {
			t.Fatalf("response %d: %+v %v, want opaque %d status %s", i, r, err, w.op, w.status)
		}
	}
}

// TestFlexibleFramingRequest: a request with magic 0x08 and framing extras
// is accepted; the response uses the classic magic (no feature that needs
// 0x18 was negotiated).
func TestFlexibleFramingRequest(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{})
	c := dial(t, p.Addr)
	fe := mc.AppendFrameInfo(nil, 0x01, []byte{0x01}) // a durability-like entry
	if r, err := c.Do(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte("flex"), Value: []byte("v1"), FramingExtras: fe}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("flexible SET: %v %+v", err, r)
	}
	r, err := c.Do(mcclient.Request{Opcode: mc.OpGetK, Key: []byte("flex"), FramingExtras: fe})
	if err != nil || r.Status() != mc.StatusSuccess || string(r.Value) != "v1" || string(r.Key) != "flex" {
		t.Fatalf("flexible GETK: %v %+v", err, r)
	}
	if r.Magic != mc.MagicResponse {
		t.Fatalf("response magic 0x%02x, want 0x81", uint8(r.Magic))
	}
}

// TestMaxFrameBytes: proxy.max_frame_bytes counts the whole frame, header
// included: a frame of exactly that size is forwarded, one byte more gets
// Einval and a close.
func TestMaxFrameBytes(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	p := startProxy(t, testConfig{proxy: fmt.Sprintf("max_frame_bytes = %d", limit)})
	frameOf := func(size int) mcclient.Request {
		key := []byte("frame-size")
		return mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: key,
			Value: bytes.Repeat([]byte("v"), size-mc.HeaderLen-8-len(key))}
	}
	c := dial(t, p.Addr)
	if r, err := c.Do(frameOf(limit)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("frame of exactly max_frame_bytes: %v %+v", err, r)
	}
	if r, err := c.Do(frameOf(limit + 1)); err != nil || r.Status() != mc.StatusEinval {
		t.Fatalf("frame one byte over: %v %+v, want Einval", err, r)
	}
	if err := closedWithin(c.Conn(), clientPatience); err != nil {
		t.Fatalf("after an oversized frame: %v", err)
	}
}
