package proxy

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// A binary tenant and a text tenant, on one bucket and on two (DESIGN.md
// sections 4 and 12): the same bytes cost the same units whichever protocol
// carries them, a bucket's limit is one budget for both, its keys one
// namespace, and two buckets stay apart whatever their clients speak.

// TestCrossProtoUnitsEqual: the same command on the same bytes costs the
// same read and write units from a text client as from a binary client:
// set as SET; get (whose reply carries the key) as GETK, a miss as one
// read unit; a multi-key get as its keys' GETKQs; delete, incr and touch
// as DELETE, INCREMENT and TOUCH. Key and value sizes straddle the 4 KB
// unit: 10-byte keys with values of 0, 1, 4086 (4096 with the key), 4087,
// 4096, 5000 and 100 KB bytes, and each cost is also checked against
// ceil((key+value)/4096).
func TestCrossProtoUnitsEqual(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`})
	bin := dial(t, p.Addr)
	txt := dialText(t, p.Addr)
	units := func(n int) uint64 { return uint64(max(1, (n+4095)/4096)) }
	// measure runs do and returns the units it cost the default bucket.
	measure := func(do func()) unitCounts {
		t.Helper()
		before := bucketUnits(t, p, "default")
		do()
		return bucketUnits(t, p, "default").minus(before)
	}
	check := func(what string, b, x, want unitCounts) {
		t.Helper()
		if x != b {
			t.Errorf("%s: text cost %+v, binary %+v", what, x, b)
		}
		if b != want {
			t.Errorf("%s: binary cost %+v, want %+v", what, b, want)
		}
	}
	binOK := func(r *mcclient.Response, err error) {
		t.Helper()
		if err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("binary: %v %+v", err, r)
		}
	}
	for _, size := range []int{0, 1, 4086, 4087, 4096, 5000, 100 << 10} {
		bk, tk := fmt.Sprintf("bin-%06d", size), fmt.Sprintf("txt-%06d", size) // 10 bytes each
		val := bytes.Repeat([]byte{'v'}, size)
		w := units(len(bk) + size)

		b := measure(func() { binOK(bin.Set([]byte(bk), val)) })
		x := measure(func() {
			textDo(t, txt, fmt.Sprintf("set %s 0 0 %d\r\n%s\r\n", tk, size, val), "STORED\r\n")
		})
		check(fmt.Sprintf("set of %d+%d bytes", len(bk), size), b, x, unitCounts{0, w, w})

		b = measure(func() {
			r, err := bin.Do(mcclient.Request{Opcode: mc.OpGetK, Key: []byte(bk)})
			binOK(r, err)
			if len(r.Value) != size {
				t.Fatalf("GETK %s: %d bytes", bk, len(r.Value))
			}
		})
		x = measure(func() {
			if got := textDo(t, txt, "get "+tk+"\r\n", "END\r\n"); len(got) < size {
				t.Fatalf("get %s: %q", tk, got)
			}
		})
		check(fmt.Sprintf("get of %d+%d bytes", len(bk), size), b, x, unitCounts{w, 0, w})
	}

	// A miss, and a multi-key get (two hits of 4087 and 100 KB, a miss).
	b := measure(func() {
		r, err := bin.Do(mcclient.Request{Opcode: mc.OpGetK, Key: []byte("bin-missing")})
		if err != nil || r.Status() != mc.StatusKeyEnoent {
			t.Fatalf("GETK miss: %v %+v", err, r)
		}
	})
	x := measure(func() { textDo(t, txt, "get txt-missing\r\n", "END\r\n") })
	check("get of a missing key", b, x, unitCounts{1, 0, 1})
	b = measure(func() {
		for _, k := range []string{"bin-004087", "bin-102400", "bin-missin"} {
			bin.Send(mcclient.Request{Opcode: mc.OpGetKQ, Key: []byte(k)})
		}
		bin.Send(mcclient.Request{Opcode: mc.OpNoop})
		if err := bin.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			r, err := bin.Read()
			if err != nil {
				t.Fatal(err)
			}
			if r.Opcode == mc.OpNoop {
				break
			}
		}
	})
	x = measure(func() { textDo(t, txt, "get txt-004087 txt-102400 txt-missin\r\n", "END\r\n") })
	mw := units(10+4087) + units(10+100<<10) + 1
	check("get of three keys", b, x, unitCounts{mw, 0, mw})

	// Other writes: one unit each for a 10-byte key.
	binOK(bin.Set([]byte("bin-count1"), []byte("5")))
	textDo(t, txt, "set txt-count1 0 0 1\r\n5\r\n", "STORED\r\n")
	b = measure(func() { binOK(bin.Incr([]byte("bin-count1"), 3, 0)) })
	x = measure(func() { textDo(t, txt, "incr txt-count1 3\r\n", "8\r\n") })
	check("incr", b, x, unitCounts{0, 1, 1})
	b = measure(func() {
		binOK(bin.Do(mcclient.Request{Opcode: mc.OpTouch, Extras: []byte{0, 0, 0, 100}, Key: []byte("bin-count1")}))
	})
	x = measure(func() { textDo(t, txt, "touch txt-count1 100\r\n", "TOUCHED\r\n") })
	check("touch", b, x, unitCounts{1, 0, 1})
	b = measure(func() { binOK(bin.Delete([]byte("bin-count1"))) })
	x = measure(func() { textDo(t, txt, "delete txt-count1\r\n", "DELETED\r\n") })
	check("delete", b, x, unitCounts{0, 1, 1})

	// STAT throttle, read by the text client, shows the same totals.
	st := bucketUnits(t, p, "default")
	got := textDo(t, txt, "stats throttle\r\n", "END\r\n")
	for _, want := range []string{
		"STAT bucket:default:read_units_total " + strconv.FormatUint(st.read, 10) + "\r\n",
		"STAT bucket:default:write_units_total " + strconv.FormatUint(st.write, 10) + "\r\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("stats throttle: no %q in\n%s", want, got)
		}
	}
}

// crossTail is tenantTail with hard limit on bob's and alice's buckets
// and a [[listener]] at each of the addresses given, bound to its bucket.
func crossTail(t *testing.T, hardLimit int, listeners map[string]string) string {
	t.Helper()
	tail := strings.Replace(tenantTail(t), "name = \"bob\"\n", fmt.Sprintf("name = \"bob\"\nhard_limit = %d\n", hardLimit), 1)
	tail = strings.Replace(tail, "name = \"alice\"\n", fmt.Sprintf("name = \"alice\"\nhard_limit = %d\n", hardLimit), 1)
	for addr, bucket := range listeners {
		tail += fmt.Sprintf("[[listener]]\nlisten = %q\nbucket = %q\n", addr, bucket)
	}
	return tail
}

// spendText pipelines n 1-unit sets on tc, waits until the bucket holds
// one of them, and returns how many were admitted (and answered STORED)
// before it. The rest stay held while the clock stands still.
func spendText(t *testing.T, p *testProxy, tc *textConn, bucket, key string, n int) int {
	t.Helper()
	tb := p.Engine().Bucket(bucket)
	before := tb.Stats()
	_ = tc.c.SetDeadline(time.Now().Add(clientPatience))
	if _, err := io.WriteString(tc.c, strings.Repeat("set "+key+" 0 0 1\r\nv\r\n", n)); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, bucket+" to hold a text set", func() bool { return tb.Stats().Held > before.Held })
	admitted := int(tb.Stats().Commands - before.Commands)
	for i := 0; i < admitted; i++ {
		if line, err := tc.r.ReadString('\n'); line != "STORED\r\n" {
			t.Fatalf("text set %d of %d admitted: %q %v", i+1, admitted, line, err)
		}
	}
	if admitted >= n {
		t.Fatalf("all %d text sets admitted with the clock standing still", n)
	}
	return admitted
}

// TestCrossProtoSharedBucket: a binary client (SASL, bob) and a text
// client (a [[listener]] bound to bob's bucket) share one namespace and
// one hard limit. With the engine's clock standing still a bucket admits
// one burst of its limit: the binary client alone gets n SETs; after the
// budget refills, 5 binary SETs leave the text client exactly n-5, and
// then the binary client is refused too; a text command waits (held, not
// failed) while the binary client has spent the budget, and runs when it
// refills.
func TestCrossProtoSharedBucket(t *testing.T) {
	t.Parallel()
	clock := throttle.NewFakeClock(time.Hour)
	l := testmc.FreeAddr(t)
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, tail: crossTail(t, 100, map[string]string{l: "bob"})}, clock)
	bin := login(t, p.Addr, "bob")
	txt := dialText(t, l)

	// One namespace: each reads what the other wrote.
	if r, err := bin.Set([]byte("from-bin"), []byte("binary value")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("binary set: %v %+v", err, r)
	}
	if got := textDo(t, txt, "get from-bin\r\n", "END\r\n"); got != "VALUE from-bin 0 12\r\nbinary value\r\nEND\r\n" {
		t.Errorf("text get of the binary client's key: %q", got)
	}
	textDo(t, txt, "set from-text 7 0 10\r\ntext value\r\n", "STORED\r\n")
	if r, err := bin.Get([]byte("from-text")); err != nil || string(r.Value) != "text value" || !bytes.Equal(r.Extras, []byte{0, 0, 0, 7}) {
		t.Errorf("binary get of the text client's key: %v %+v", err, r)
	}

	// The limit: one budget for both protocols.
	hello(t, bin, mc.FeatureNonBlockingThrottlingMode)
	clock.Advance(10 * time.Second)
	n := spendBinary(t, bin, "b")
	t.Logf("one burst of bob's budget: %d SETs", n)
	if n <= 5 {
		t.Fatalf("only %d SETs in one burst", n)
	}
	tb := p.Engine().Bucket("bob")
	held := tb.Stats().Held
	if _, err := io.WriteString(txt.c, "set t 0 0 1\r\nx\r\n"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the text set to be held", func() bool { return tb.Stats().Held > held })
	clock.Advance(time.Second)
	if line := txt.line(t); line != "STORED\r\n" {
		t.Fatalf("held text set after the budget refilled: %q", line)
	}

	clock.Advance(10 * time.Second)
	for i := 0; i < 5; i++ {
		if r, err := bin.Set([]byte("b"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("binary SET %d after the refill: %v %+v", i, err, r)
		}
	}
	if m := spendText(t, p, txt, "bob", "t", 3*n); m != n-5 {
		t.Errorf("after 5 binary SETs the text client got %d sets of the burst, want %d (= %d - 5)", m, n-5, n)
	}
	if r, err := bin.Set([]byte("b"), []byte("v")); err != nil || r.Status() != mc.StatusEWouldThrottle {
		t.Errorf("binary SET once the text client spent the budget: %v %+v, want EWouldThrottle", err, r)
	}
}

// TestCrossProtoTwoBuckets: a text tenant (a [[listener]] bound to alice's
// bucket, which allows flush) and a binary tenant (SASL, bob) do not see
// each other's keys, the text tenant's flush_all leaves bob's keys alone,
// and each one's spent budget holds only itself.
func TestCrossProtoTwoBuckets(t *testing.T) {
	t.Parallel()
	clock := throttle.NewFakeClock(time.Hour)
	l := testmc.FreeAddr(t)
	p := startProxyClock(t, testConfig{throttle: `capacity = "unlimited"`, tail: crossTail(t, 100, map[string]string{l: "alice"})}, clock)
	bin := login(t, p.Addr, "bob")
	txt := dialText(t, l)
	binGet := func(key string) (mc.Status, string) {
		t.Helper()
		r, err := bin.Get([]byte(key))
		if err != nil {
			t.Fatal(err)
		}
		return r.Status(), string(r.Value)
	}

	if r, err := bin.Set([]byte("k"), []byte("bob's")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("binary set: %v %+v", err, r)
	}
	if got := textDo(t, txt, "get k\r\n", "END\r\n"); got != "END\r\n" {
		t.Errorf("alice (text) reads bob's key: %q", got)
	}
	textDo(t, txt, "set k 0 0 7\r\nalice's\r\nset only-alice 0 0 1\r\na\r\n", "STORED\r\n")
	textDo(t, txt, "", "STORED\r\n")
	if st, v := binGet("k"); st != mc.StatusSuccess || v != "bob's" {
		t.Errorf("bob's key after alice's text set of the same key: %v %q", st, v)
	}
	if st, _ := binGet("only-alice"); st != mc.StatusKeyEnoent {
		t.Errorf("bob (binary) reads alice's key: %v", st)
	}
	if got := textDo(t, txt, "get k only-alice\r\n", "END\r\n"); got != "VALUE k 0 7\r\nalice's\r\nVALUE only-alice 0 1\r\na\r\nEND\r\n" {
		t.Errorf("alice reads %q", got)
	}
	if got := textDo(t, txt, "flush_all\r\n", "OK\r\n"); got != "OK\r\n" {
		t.Fatalf("flush_all: %q", got)
	}
	if got := textDo(t, txt, "get k only-alice\r\n", "END\r\n"); got != "END\r\n" {
		t.Errorf("alice's keys after her flush_all: %q", got)
	}
	if st, v := binGet("k"); st != mc.StatusSuccess || v != "bob's" {
		t.Errorf("bob's key after alice's flush_all: %v %q", st, v)
	}
	if r, err := bin.Do(mcclient.Request{Opcode: mc.OpFlush}); err != nil || r.Status() != mc.StatusEaccess {
		t.Errorf("bob's FLUSH (not enabled on his bucket): %v %+v, want Eaccess", err, r)
	}

	// Budgets: bob spends his; alice is not held for it. Alice spends
	// hers and stays held; bob, refilled, runs meanwhile.
	hello(t, bin, mc.FeatureNonBlockingThrottlingMode)
	clock.Advance(10 * time.Second)
	n := spendBinary(t, bin, "b")
	if n <= 5 {
		t.Fatalf("only %d SETs in one burst", n)
	}
	if m := spendText(t, p, txt, "alice", "a", 3*n); m != n {
		t.Errorf("alice got %d sets of her burst after bob spent his, want %d as bob", m, n)
	}
	alice := p.Engine().Bucket("alice")
	spent := alice.Stats().Commands
	clock.Advance(10 * time.Second)
	// Alice's held sets take her refilled burst and she is held again.
	eventually(t, 30*time.Second, "alice's held sets to take her refilled burst", func() bool {
		st := alice.Stats()
		return st.Commands == spent+uint64(n) && st.Waiting == 1
	})
	for i := 0; i < 5; i++ {
		if r, err := bin.Set([]byte("b"), []byte("v")); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("bob's SET %d while alice is held: %v %+v", i, err, r)
		}
	}
	if st := alice.Stats(); st.Waiting != 1 || st.Commands != spent+uint64(n) {
		t.Errorf("alice: %d sessions held, %d commands since her budget was spent; want her text client still held after %d", st.Waiting, st.Commands-spent, n)
	}
}
