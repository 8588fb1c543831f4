package proxy

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// Writes too large for memcached (toolarge.go; issue 28, rule 4), checked
// against a real memcached with a small item size limit.

// smallItems are memcached's flags for a 1 KiB item size limit (its
// smallest; the slab chunk must be below it).
var smallItems = []string{"-I", "1k", "-o", "slab_chunk_max=512"}

// startSmallItems starts a proxy in front of a memcached of 1 KiB items,
// waits until it knows that limit, and returns it with a second memcached
// of 1 KiB items to compare with.
func startSmallItems(t *testing.T) (*testProxy, *testmc.Server) {
	t.Helper()
	direct := testmc.Start(t, smallItems...)
	p := startProxyTo(t, testmc.Start(t, smallItems...), testConfig{throttle: `capacity = "unlimited"`})
	eventually(t, time.Minute, "memcached's item size known", func() bool { return p.pool.ItemSizeMax() == 1024 })
	return p, direct
}

// tooLargeValue is a value no key makes fit in 1 KiB items.
var tooLargeValue = strings.Repeat("y", 2000)

// TestTooLargeTextMatchesMemcached: every text and meta write memcached
// refuses as too large, sent through the proxy and to memcached directly,
// each after a small value is set under its key and followed by a get of
// the key and an mn in the same write: the replies are byte for byte
// memcached's (the refusal, silent with noreply; ms's in every mode and
// with q), the key holds what memcached holds after (gone after set and
// every ms, kept after add, replace, append, prepend and cas), and the
// client stays in step. The proxy's memcached never reads the values.
func TestTooLargeTextMatchesMemcached(t *testing.T) {
	t.Parallel()
	p, direct := startSmallItems(t)
	via, to := dialText(t, p.Addr), dialText(t, direct.Addr)
	v := tooLargeValue
	cases := []string{
		"set K 0 0 2000", "set K 5 0 2000 noreply", "add K 0 0 2000", "add K 0 0 2000 noreply",
		"replace K 0 0 2000", "append K 0 0 2000", "prepend K 0 0 2000 noreply",
		"cas K 0 0 2000 1", "cas K 0 0 2000 0", "cas K 0 0 2000 77 noreply",
		"ms K 2000", "ms K 2000 q", "ms K 2000 MS T0", "ms K 2000 ME", "ms K 2000 MA q", "ms K 2000 MP",
		"ms K 2000 MR O123 k", "ms K 2000 I", "ms K 2000 C1 F3", "ms K 2000 q O5 k T10 I",
		"ms B64 2000 b", "ms B64 2000 b q MS",
	}
	for i, c := range cases {
		key := fmt.Sprintf("tl%02d", i)
		b64 := "dGw" + strconv.Itoa(i%10) // base64 of "tl" and a digit
		line := strings.NewReplacer("K", key, "B64", b64).Replace(c)
		getKey := key
		if strings.Contains(c, "B64") {
			getKey = "tl" + strconv.Itoa(i%10)
		}
		in := fmt.Sprintf("set %s 0 0 3\r\nold\r\n%s\r\n%s\r\nget %s\r\nmn\r\n", getKey, line, v, getKey)
		before := bytesRead(t, p.MC.Addr)
		got, want := textDo(t, via, in, "MN\r\n"), textDo(t, to, in, "MN\r\n")
		if got != want {
			t.Errorf("%s: through the proxy\n%q\nmemcached\n%q", line, got, want)
		}
		if read := bytesRead(t, p.MC.Addr) - before; read >= len(v) {
			t.Errorf("%s: the proxy's memcached read %d bytes: the value went to it", line, read)
		}
	}
}

// binFrame is a binary request: op on key with extras, value and cas.
func binFrame(op mc.Opcode, key, value string, extras []byte, cas uint64, opaque uint32) []byte {
	h := mc.Header{Magic: mc.MagicRequest, Opcode: op, Opaque: opaque, CAS: cas}
	return mc.AppendFrame(nil, h, nil, extras, []byte(key), []byte(value))
}

// binExchange writes in on a new connection to addr and reads the answers
// up to the NOOP's (opaque 0x99); each answer's CAS is zeroed (the two
// servers number items alike, but the test does not rely on it).
func binExchange(t *testing.T, addr string, in []byte) []byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(clientPatience))
	if _, err := c.Write(in); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var out []byte
	for {
		var hdr [mc.HeaderLen]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			t.Fatalf("after %x: %v", out, err)
		}
		h, _ := mc.ParseHeader(hdr[:])
		body := make([]byte, h.BodyLen)
		if _, err := io.ReadFull(r, body); err != nil {
			t.Fatal(err)
		}
		clear(hdr[16:24])
		out = append(append(out, hdr[:]...), body...)
		if h.Opcode == mc.OpNoop && h.Opaque == 0x99 {
			return out
		}
	}
}

// TestTooLargeBinaryMatchesMemcached: the binary SET family, quiet opcodes
// and CAS included, with a value memcached refuses as too large, each after
// a SET of a small value under its key and followed by a GETK and a NOOP:
// the proxy's answers are byte for byte memcached's (status 0x0003 "Too
// large.", quiet opcodes too), the key holds what memcached holds after
// (gone after SET and SETQ, kept after the others), and the proxy's
// memcached never reads the values.
func TestTooLargeBinaryMatchesMemcached(t *testing.T) {
	t.Parallel()
	p, direct := startSmallItems(t)
	ex := make([]byte, 8)
	binary.BigEndian.PutUint32(ex, 7) // flags
	ops := []mc.Opcode{mc.OpSet, mc.OpSetQ, mc.OpAdd, mc.OpAddQ, mc.OpReplace, mc.OpReplaceQ,
		mc.OpAppend, mc.OpAppendQ, mc.OpPrepend, mc.OpPrependQ}
	for i, op := range ops {
		for _, cas := range []uint64{0, 12345} {
			key := fmt.Sprintf("bl%02d-%d", i, cas)
			extras := ex
			if op == mc.OpAppend || op == mc.OpAppendQ || op == mc.OpPrepend || op == mc.OpPrependQ {
				extras = nil
			}
			var in []byte
			in = append(in, binFrame(mc.OpSet, key, "old", ex, 0, 1)...)
			in = append(in, binFrame(op, key, tooLargeValue, extras, cas, 2)...)
			in = append(in, binFrame(mc.OpGetK, key, "", nil, 0, 3)...)
			in = append(in, binFrame(mc.OpNoop, "", "", nil, 0, 0x99)...)
			before := bytesRead(t, p.MC.Addr)
			got, want := binExchange(t, p.Addr, in), binExchange(t, direct.Addr, in)
			if !bytes.Equal(got, want) {
				t.Errorf("%s cas %d: through the proxy\n%x\nmemcached\n%x", op, cas, got, want)
			}
			if read := bytesRead(t, p.MC.Addr) - before; read >= len(tooLargeValue) {
				t.Errorf("%s cas %d: the proxy's memcached read %d bytes: the value went to it", op, cas, read)
			}
		}
	}
}

// TestTooLargeMetaSetBilledOneUnit: the shape of issue 28, a meta ms of 5
// MB (over memcached's default 1 MiB items) from a bucket hard-limited to
// 500 units/s, on the engine's fake clock. It is refused at once as
// memcached refuses it and costs the bucket 1 unit, not the 1,281 units
// of its bytes (244% of a second's limit); its bytes are dropped no
// faster than the bucket's 500 write units a second with one burst (100
// ms) of room: at every step of the clock the bytes dropped are within a
// unit of that bound, the session is held while the gauge has no room,
// and the mn after the value is answered once the last byte is dropped.
func TestTooLargeMetaSetBilledOneUnit(t *testing.T) {
	t.Parallel()
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`,
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 500\n"}, clock)
	eventually(t, time.Minute, "memcached's item size known", func() bool { return p.pool.ItemSizeMax() == 1<<20 })
	ft := &fakeTime{t: t, p: p, clock: clock}
	const size = 5 << 20
	const rate, burst = 500 * 4096, 500 * 4096 / 10 // bytes a second, bytes of a burst
	tc := dialText(t, p.Addr)
	_ = tc.c.SetDeadline(time.Now().Add(time.Minute))
	before := bucketUnits(t, p, "default")
	in := append(append([]byte(fmt.Sprintf("ms big %d T0\r\n", size)), strings.Repeat("v", size)...), "\r\nmn\r\n"...)
	go func() { _, _ = tc.c.Write(in) }() // ends with the test's connection at the latest
	if got := tc.line(t); got != "SERVER_ERROR object too large for cache\r\n" {
		t.Fatalf("5 MB ms: %q, want memcached's refusal", got)
	}
	if got := bucketUnits(t, p, "default").minus(before); got != (unitCounts{0, 1, 1}) {
		t.Fatalf("5 MB ms refused: billed %+v, want 1 write unit", got)
	}
	total := size + 2 // the data block and its "\r\n"
	var elapsed time.Duration
	for step := 0; ; step++ {
		left := ft.discarding(tc.c.LocalAddr())
		dropped := total - left
		most := int(int64(rate)*int64(elapsed)/int64(time.Second)) + burst + 1
		if dropped > most || dropped < most-2*4096 && left > 0 {
			t.Fatalf("after %v: %d bytes dropped, want %d at most and within 2 units of it", elapsed, dropped, most)
		}
		if left == 0 {
			break
		}
		if step > 100 {
			t.Fatalf("after %v: %d bytes still to drop", elapsed, left)
		}
		clock.Advance(100 * time.Millisecond)
		elapsed += 100 * time.Millisecond
	}
	if got := tc.line(t); got != "MN\r\n" {
		t.Fatalf("after the value: %q, want MN", got)
	}
	if got := bucketUnits(t, p, "default").minus(before); got != (unitCounts{0, 1, 1}) {
		t.Fatalf("after the value was dropped: billed %+v, want 1 write unit", got)
	}
}

// discarding waits until the proxy is settled at the clock's reading with
// the session of the client at addr either held or done dropping a
// refused value (not waiting for more of it from the client), and returns
// the bytes it still has to drop.
func (ft *fakeTime) discarding(addr net.Addr) int {
	ft.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var poll backoff
	for {
		// Settled first: then no wake-up is due, and a held session stays
		// as it is until the clock moves.
		_, ok := settled(ft.t, ft.p)
		left, ready := -1, false
		onLoop(ft.t, ft.p, func(lp *loop) {
			if s := sessionOf(lp, addr); s != nil {
				left, ready = s.skip, s.isHeld() || s.skip == 0
			}
		})
		if ok && ready || ready && left == 0 {
			return left
		}
		if time.Now().After(deadline) {
			ft.t.Fatalf("at %v the session did not settle: %d bytes left to drop", ft.clock.Now(), left)
		}
		poll.wait()
	}
}

// TestTooLargeOverTLS: a TLS client of a bucket hard-limited to 500
// units/s sets a key, then writes 300 KB under it (too large for 1 KiB
// items) and reads it back in the same write: it gets memcached's
// refusal, the key is gone, and the commands after the value are answered
// in step (the value is dropped paced from the TLS session's buffer).
func TestTooLargeOverTLS(t *testing.T) {
	t.Parallel()
	s := &tlsSetup{ca: testcerts.NewCA(t, "kvthrottle test CA"), dir: t.TempDir()}
	s.certFile, s.keyFile = s.ca.Server(t).Write(t, s.dir, "server")
	tc := testConfig{throttle: `capacity = "unlimited"`, tail: "[[bucket]]\nname = \"default\"\nhard_limit = 500\n" +
		fmt.Sprintf("\n[tls]\nlisten = %q\ncert_file = %q\nkey_file = %q\n", testmc.FreeAddr(t), s.certFile, s.keyFile)}
	s.p = startProxyTo(t, testmc.Start(t, smallItems...), tc)
	eventually(t, time.Minute, "memcached's item size known", func() bool { return s.p.pool.ItemSizeMax() == 1024 })
	c, err := s.dialTLS(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	tc2 := &textConn{c: c, r: bufio.NewReader(c)}
	for _, size := range []int{2000, 300 << 10} {
		in := fmt.Sprintf("set tk 0 0 3\r\nold\r\nset tk 0 0 %d\r\n%s\r\nget tk\r\nmn\r\n", size, strings.Repeat("z", size))
		go func() { _, _ = io.WriteString(c, in) }()
		var out strings.Builder
		for !strings.HasSuffix(out.String(), "MN\r\n") {
			l, err := tc2.r.ReadString('\n')
			out.WriteString(l)
			if err != nil {
				t.Fatalf("%d bytes over TLS: %v after %q", size, err, out.String())
			}
		}
		if want := "STORED\r\nSERVER_ERROR object too large for cache\r\nEND\r\nMN\r\n"; out.String() != want {
			t.Errorf("%d bytes over TLS: %q, want %q", size, out.String(), want)
		}
	}
}
