package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// Answers that real clients must be able to read: refused STAT groups,
// text-protocol clients, bad magic, upstream timeouts; and FLUSH and
// VERSION, which no tenant may use to load the shared server unmetered.

// TestStatRefusedGroups: a STAT group of memcached's a tenant may not see
// is answered in a shape every binary client reads to its end: an empty
// group, as the text side's END, or, for the groups memcached answers with
// one frame (reset, detail), one KeyEnoent frame with the reason. A group
// memcached does not know gets memcached's answer, KeyEnoent "Not found".
// Either way the next command's response is the next frame.
func TestStatRefusedGroups(t *testing.T) {
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	c := dial(t, p.Addr)
	for _, group := range []string{"slabs", "items", "settings", "sizes"} {
		kv, err := c.Stats(group)
		if err != nil || len(kv) != 0 {
			t.Fatalf("STAT %s: %v %q, want an empty group", group, err, kv)
		}
	}
	for _, group := range []string{"nosuchgroup", "malloc", "conns"} {
		r, err := c.Do(mcclient.Request{Opcode: mc.OpStat, Key: []byte(group)})
		if err != nil || r.Status() != mc.StatusKeyEnoent || string(r.Value) != "Not found" {
			t.Fatalf("STAT %s: %v %+v, want memcached's KeyEnoent \"Not found\"", group, err, r)
		}
	}
	for _, group := range []string{"reset", "detail on", "detail dump"} {
		stat := c.Send(mcclient.Request{Opcode: mc.OpStat, Key: []byte(group)})
		noop := c.Send(mcclient.Request{Opcode: mc.OpNoop})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		r, err := c.Read()
		if err != nil || r.Opaque != stat || r.Status() != mc.StatusKeyEnoent || len(r.Key) != 0 ||
			string(r.Value) != "STAT "+group+" needs the admin privilege" {
			t.Fatalf("STAT %s: %v %+v, want one KeyEnoent frame with the reason", group, err, r)
		}
		if r, err := c.Read(); err != nil || r.Opaque != noop || r.Opcode != mc.OpNoop {
			t.Fatalf("after STAT %s: %v %+v, want the NOOP's response", group, err, r)
		}
	}
	// The general group is still the tenant's own.
	if kv, err := c.Stats(""); err != nil || len(kv) == 0 {
		t.Fatalf("STAT: %v %q", err, kv)
	}
	// Admins still get memcached's groups, and memcached's own answer to a
	// group it does not know.
	a := login(t, p.Addr, "admin")
	if kv, err := a.Stats("settings"); err != nil || len(kv) < 10 {
		t.Fatalf("admin STAT settings: %v, %d stats", err, len(kv))
	}
	if r, err := a.Do(mcclient.Request{Opcode: mc.OpStat, Key: []byte("nosuchgroup")}); err != nil || r.Status() != mc.StatusKeyEnoent {
		t.Fatalf("admin STAT nosuchgroup: %v %+v, want memcached's KeyEnoent", err, r)
	}
	if r, err := a.Do(mcclient.Request{Opcode: mc.OpNoop}); err != nil || r.Opcode != mc.OpNoop {
		t.Fatalf("admin NOOP after STAT nosuchgroup: %v %+v", err, r)
	}
}

// readAll reads what the proxy sends until it closes the connection; it
// fails the test if the connection is still open after clientPatience (a
// liveness bound: the proxy closes it after the answer, not on a timer).
func readAll(t *testing.T, c net.Conn) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(clientPatience))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("after %q: %v (want the connection closed after the answer)", b, err)
	}
	return b
}

// TestTextClientServed: a connection whose first byte is no binary magic
// speaks the text protocol and is served (it used to get a SERVER_ERROR
// line and be closed).
func TestTextClientServed(t *testing.T) {
	p := startProxy(t, testConfig{})
	for in, want := range map[string]string{
		"get foo\r\n": "END\r\n",
		"get " + strings.Repeat("k", 200) + "\r\n": "END\r\n",
		"set a 0 0 1\r\nx\r\n":                     "STORED\r\n",
		"bogus\r\n":                                "ERROR\r\n",
		// 245 bytes and the bucket's "default:" exceed memcached's 250.
		"get k " + strings.Repeat("k", 245) + "\r\n": "CLIENT_ERROR bad command line format\r\n",
	} {
		c := rawDial(t, p.Addr)
		if _, err := c.Write([]byte(in)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(want))
		_ = c.SetReadDeadline(time.Now().Add(clientPatience))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != want {
			t.Errorf("after %q: %q (%v), want %q", in, buf, err, want)
		}
	}
}

// TestBadMagicEinvalAtOnce: a response magic from a client, or bytes that
// are no request after binary requests, get Einval at once (without
// waiting for a whole header or the body the header announces), then the
// connection closes.
func TestBadMagicEinvalAtOnce(t *testing.T) {
	p := startProxy(t, testConfig{})
	noop := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpNoop, Opaque: 5}, nil, nil, nil, nil)
	respHdr := make([]byte, mc.HeaderLen)
	(&mc.Header{Magic: mc.MagicResponse, Opcode: mc.OpGet, BodyLen: 1000, Opaque: 77}).Put(respHdr)
	for name, tc := range map[string]struct {
		in    []byte
		first []byte // expected before the Einval
		op    mc.Opcode
	}{
		"response magic, body announced": {in: respHdr, op: mc.OpGet},
		"alt response magic alone":       {in: []byte{0x18}},
		"text after a request":           {in: append(append([]byte{}, noop...), "get foo\r\n"...), first: noop, op: 'e'},
		"garbage after a request":        {in: append(append([]byte{}, noop...), 0x42), first: noop},
	} {
		t.Run(name, func(t *testing.T) {
			c := rawDial(t, p.Addr)
			if _, err := c.Write(tc.in); err != nil {
				t.Fatal(err)
			}
			out := readAll(t, c)
			if tc.first != nil {
				h, err := mc.ParseHeader(out)
				if err != nil || h.Opcode != mc.OpNoop || h.Opaque != 5 {
					t.Fatalf("first response %x: %v, want the NOOP's", out, err)
				}
				out = out[mc.HeaderLen:]
			}
			f, n, err := mc.Decode(out, 0)
			if err != nil || n != len(out) || f.Magic != mc.MagicResponse || f.Status() != mc.StatusEinval ||
				f.Opcode != tc.op || len(f.Value()) == 0 {
				t.Fatalf("got %x (%v), want exactly one Einval response with a reason", out, err)
			}
		})
	}
}

// TestTimedOutCommandMayHaveRun: a command that reached memcached and timed
// out gets Etmpfail saying it may have run (a write may have been applied).
func TestTimedOutCommandMayHaveRun(t *testing.T) {
	up := silentUpstream(t)
	p := startProxyTo(t, &testmc.Server{Addr: up}, testConfig{upstream: `timeout = "200ms"`})
	c := dial(t, p.Addr)
	r, err := c.Set([]byte("k"), []byte("v"))
	if err != nil || r.Status() != mc.StatusEtmpfail || string(r.Value) != "upstream timed out; the command may have run" {
		t.Fatalf("SET to a silent server: %v %+v (%q)", err, r, r.Value)
	}
}

// TestFlushMetered: a FLUSH costs its bucket one write unit and is
// admitted like a write: refused EWouldThrottle in non-blocking mode, held
// otherwise, when the bucket is at its hard limit. On the fake clock, at
// 2 units/s and no burst: the first FLUSH goes, the second is refused with
// the exact wait (half a second), and a blocking one is held (not answered
// while the clock stands still) until the clock reaches that half second.
func TestFlushMetered(t *testing.T) {
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: "capacity = \"unlimited\"\nburst_ms = 0",
		tail: "[[bucket]]\nname = \"default\"\nflush_enabled = true\nhard_limit = 2\n", loops: 1}, clock)
	ft := &fakeTime{t: t, p: p, clock: clock}
	nb := dial(t, p.Addr)
	hello(t, nb, mc.FeatureNonBlockingThrottlingMode)
	if r, err := nb.Do(mcclient.Request{Opcode: mc.OpFlush}); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("first FLUSH: %s %q", r.Status(), r.Value)
	}
	r, err := nb.Do(mcclient.Request{Opcode: mc.OpFlush})
	if want := `{"next_tick_us":500000}`; status(t, r, err) != mc.StatusEWouldThrottle || string(r.Value) != want {
		t.Fatalf("second FLUSH at 2 units/s, the clock standing still: %s %q; want EWouldThrottle %s", r.Status(), r.Value, want)
	}
	// A blocking connection waits for the budget instead.
	c := dial(t, p.Addr)
	c.Send(mcclient.Request{Opcode: mc.OpFlush})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	ft.settle(1, nil)
	ft.step(499*time.Millisecond, 1, nil)
	ft.step(time.Millisecond, 0, nil)
	if r, err := c.Read(); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("blocking FLUSH at its turn: %s %q", r.Status(), r.Value)
	}
	st := p.Engine().Bucket("default").Stats()
	if st.Held != 1 || st.Rejected != 1 || st.Commands != 2 || st.Units != 2 {
		t.Fatalf("engine: held %d, rejected %d, commands %d, units %d; want 1, 1, 2, 2", st.Held, st.Rejected, st.Commands, st.Units)
	}
	kv, err := c.Stats("throttle")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range kv {
		if p[0] == "bucket:default:write_units_total" {
			found = true
			if p[1] != "2" {
				t.Fatalf("write_units_total %s, want 2", p[1])
			}
		}
	}
	if !found {
		t.Fatal("STAT throttle has no bucket:default:write_units_total")
	}
}

// TestFlushesShareStateWrites: FLUSHes that arrive while the state file is
// being written share the next write (one epoch step, one fsync), and each
// is answered only once the write it depends on is done.
func TestFlushesShareStateWrites(t *testing.T) {
	p := startProxy(t, testConfig{})
	const n = 8
	conns := make([]*mcclient.Client, n)
	for i := range conns {
		conns[i] = dial(t, p.Addr)
	}
	queue := func() (pending int, running bool) {
		q := &p.flushes
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.pending), q.running
	}
	// Block state writes, as a slow disk would.
	p.adminMu.Lock()
	locked := true
	defer func() {
		if locked {
			p.adminMu.Unlock()
		}
	}()
	send := func(c *mcclient.Client) {
		c.Send(mcclient.Request{Opcode: mc.OpFlush})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	send(conns[0])
	eventually(t, time.Minute, "the first FLUSH's write to start", func() bool {
		pending, running := queue()
		return running && pending == 0
	})
	for _, c := range conns[1:] {
		send(c)
	}
	eventually(t, time.Minute, "the other FLUSHes to queue", func() bool {
		pending, _ := queue()
		return pending == n-1
	})
	// Nobody is answered before the write is done.
	_ = conns[0].Conn().SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := conns[0].Conn().Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read before the state file write: %v, want nothing", err)
	}
	p.adminMu.Unlock()
	locked = false
	for i, c := range conns {
		if r, err := c.Read(); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("FLUSH %d: %v %+v", i, err, r)
		}
	}
	st, err := bucketcfg.LoadState(p.StatePath)
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Epochs["default"]; e != 2 {
		t.Fatalf("epoch %d after %d FLUSHes in two state writes, want 2", e, n)
	}
}

// TestVersionAnsweredLocally: VERSION, unmetered and allowed before
// authentication, is answered by the proxy with memcached's version (as
// its health probe read it), so a flood of it never reaches memcached.
func TestVersionAnsweredLocally(t *testing.T) {
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`})
	direct := dial(t, p.MC.Addr)
	r, err := direct.Do(mcclient.Request{Opcode: mc.OpVersion})
	if status(t, r, err) != mc.StatusSuccess {
		t.Fatal(r.Status())
	}
	want := r.Value
	eventually(t, time.Minute, "the health probe to read the version", func() bool {
		return p.pool.Version() != nil
	})
	bytesRead := func() int { return memcachedStat(t, p.MC.Addr, "bytes_read") }
	before := bytesRead()
	c := dial(t, p.Addr) // never authenticates
	// Batches of 10: a connection that has not authenticated may leave
	// only a few answers unread (TestPreAuthOutputBounded).
	const n, batch = 1000, 10
	for i := 0; i < n; i += batch {
		for j := 0; j < batch; j++ {
			c.Send(mcclient.Request{Opcode: mc.OpVersion})
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < batch; j++ {
			r, err := c.Read()
			if err != nil || r.Status() != mc.StatusSuccess || !bytes.Equal(r.Value, want) {
				t.Fatalf("VERSION %d: %v %+v, want %q", i+j, err, r, want)
			}
		}
	}
	if d := bytesRead() - before; d > n*mc.HeaderLen/10 {
		t.Fatalf("memcached read %d bytes during %d VERSIONs through the proxy: they were forwarded", d, n)
	}
}
