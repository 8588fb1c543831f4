package proxy

// APPEND reservations (throttle/readcost_append.go) on every path one can
// take through the proxy, each checked for a leak of the bytes in flight
// (ReadCost.InFlight) and for what it leaves in the bucket's records
// (LargestValue, KeyBound).

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// appendDown sends an APPEND of v to key while memcached is stopped and
// reports whether the proxy answered it as never sent (Etmpfail "upstream
// unavailable", not "... may have run").
func appendDown(t *testing.T, w *mcclient.Client, key string, v []byte) bool {
	t.Helper()
	r, err := w.Do(mcclient.Request{Opcode: mc.OpAppend, Key: []byte(key), Value: v})
	if err != nil {
		t.Fatal(err)
	}
	if r.Status() != mc.StatusEtmpfail {
		t.Fatalf("APPEND to %s with memcached stopped: %v %q", key, r.Status(), r.Value)
	}
	return !bytes.Contains(r.Value, []byte("may have run"))
}

// upstreamDown waits until the proxy answers through w that memcached is
// unavailable, not that a command may have run: a GET, which leaves the
// APPEND records alone, probes.
func upstreamDown(t *testing.T, w *mcclient.Client) {
	t.Helper()
	eventually(t, time.Minute, "the proxy answering upstream unavailable", func() bool {
		r, err := w.Get([]byte("probe"))
		if err != nil {
			t.Fatal(err)
		}
		return r.Status() == mc.StatusEtmpfail && !bytes.Contains(r.Value, []byte("may have run"))
	})
}

// appendsWhileDown starts a proxy (largeKeyProxy) whose bucket holds s (10
// bytes), stops its memcached, and sends n APPENDs of 4,000 bytes to
// key(0..n-1), each answered "upstream unavailable"; nothing is then in
// flight.
func appendsWhileDown(t *testing.T, n int, key func(int) string) (*testProxy, *mcclient.Client, *throttle.ReadCost) {
	t.Helper()
	p, w, rc := largeKeyProxy(t, "")
	setValue(t, w, "s", 10)
	p.MC.Stop()
	upstreamDown(t, w)
	v := bytes.Repeat([]byte("v"), 4000)
	for i := 0; i < n; i++ {
		if !appendDown(t, w, key(i), v) {
			t.Fatal("an APPEND was answered as may have run after the proxy answered upstream unavailable")
		}
	}
	if f := rc.InFlight(); f != 0 {
		t.Fatalf("%d bytes in flight after every APPEND was answered", f)
	}
	return p, w, rc
}

// An APPEND the proxy never sends (its upstream is down: answered
// Etmpfail "upstream unavailable" at once by upstream.Conn.ready, or
// failed while still unsent in the connection's buffer) stored nothing,
// and must leave nothing behind, as a NOT_STORED does. finishAppend folds
// every APPEND memcached did not answer as if it may have stored (it did
// before upstream.MayHaveRun): each attempt during an outage added its
// bytes to its key's base for good (until a FLUSH), and the next attempt
// raised the key's class to that plus its own bytes.
func TestAppendNeverSentLeavesNothing(t *testing.T) {
	t.Parallel()
	_, _, rc := appendsWhileDown(t, 60, func(int) string { return "s" })
	// s holds 10 bytes; one attempt's bound is 4,010 bytes (class 2).
	if b := rc.KeyBound([]byte("s")); b > 2 {
		t.Errorf("60 APPENDs of 4,000 bytes to s (10 bytes) never reached memcached, yet s is billed %d units per read (want 2: one attempt's bound)", b)
	}
}

// The same with keys that do not stay listed: once the list of large keys
// is full, the bytes of APPENDs never sent add up in the bucket's largest
// value, and every read of the bucket is billed for them until a FLUSH.
// 64 attempts to 64 keys fill the list; 60 more to other keys, each of
// 4,000 bytes, all answered "upstream unavailable".
func TestAppendsNeverSentLeaveTheBucketSmall(t *testing.T) {
	t.Parallel()
	p, w, rc := appendsWhileDown(t, 124, func(i int) string { return fmt.Sprintf("list%d", i) })
	p.MC.Restart(t)
	eventually(t, time.Minute, "memcached back", func() bool {
		r, err := w.Set([]byte("t"), []byte("x"))
		return err == nil && r.Status() == mc.StatusSuccess
	})
	t.Logf("memcached back (empty): %d keys listed, largest value %d bytes, ceiling %d", rc.Listed(), rc.LargestValue(), rc.Ceiling())
	if lv := rc.LargestValue(); lv > 10 {
		t.Errorf("124 APPENDs never reached memcached, yet the bucket's largest value is %d bytes (10 stored); a read of any key is billed %d units",
			lv, rc.KeyBound([]byte("t")))
	}
}

// Quiet and meta spellings leave exact records and nothing in flight:
// binary APPENDQ (success silent; NOT_STORED answered), PREPENDQ, text
// append with noreply (NOT_STORED dropped), meta ms MA with q (NS shown,
// HD hidden), ms MA N0 (NS on memcached 1.6.18), ms MP. a (1,000 bytes,
// not listed) gets 100 + 10 bytes: the largest value is 1,110; the
// NOT_STOREDs leave nothing.
func TestQuietAndMetaAppendsLeaveExactRecords(t *testing.T) {
	t.Parallel()
	p, w, rc := largeKeyProxy(t, "")
	setValue(t, w, "a", 1000)
	big := bytes.Repeat([]byte("v"), 4000)
	w.Send(mcclient.Request{Opcode: mc.OpAppendQ, Key: []byte("a"), Value: bytes.Repeat([]byte("x"), 100)})
	w.Send(mcclient.Request{Opcode: mc.OpAppendQ, Key: []byte("m1"), Value: big})
	w.Send(mcclient.Request{Opcode: mc.OpPrependQ, Key: []byte("m1"), Value: big})
	w.Send(mcclient.Request{Opcode: mc.OpNoop})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []mc.Status{mc.StatusNotStored, mc.StatusNotStored, mc.StatusSuccess} {
		r, err := w.Read()
		if err != nil || r.Status() != want {
			t.Fatalf("answer %d: %v %v, want %v", i, r, err, want)
		}
	}
	tc := dialText(t, p.Addr)
	textDo(t, tc, fmt.Sprintf("append m2 0 0 4000 noreply\r\n%s\r\nprepend m2 0 0 4000 noreply\r\n%s\r\nmn\r\n", big, big), "MN\r\n")
	if got := textDo(t, tc, fmt.Sprintf("ms m3 4000 MA q\r\n%s\r\nmn\r\n", big), "MN\r\n"); got != "NS\r\nMN\r\n" {
		t.Fatalf("ms MA q to a missing key: %q", got)
	}
	// (memcached 1.6.18 does not vivify on append: NS)
	if got := textDo(t, tc, "ms m4 5 MA N0 q\r\nhello\r\nms a 10 MP q\r\n0123456789\r\nmn\r\n", "MN\r\n"); got != "NS\r\nMN\r\n" {
		t.Fatalf("ms MA N0 q, ms MP q: %q", got)
	}
	if got := textDo(t, tc, "mg a s\r\n", "HD s1110\r\n"); got != "HD s1110\r\n" {
		t.Fatalf("sizes: %q", got)
	}
	if f := rc.InFlight(); f != 0 {
		t.Fatalf("%d bytes in flight after every APPEND was answered", f)
	}
	if lv := rc.LargestValue(); lv != 1110 {
		t.Fatalf("largest value %d bytes, want 1,110 (%d keys listed, ceiling %d)", lv, rc.Listed(), rc.Ceiling())
	}
	if b := rc.KeyBound([]byte("a")); b != 1 {
		t.Fatalf("a (1,110 bytes) billed %d per read, want 1", b)
	}
}

// A write waiting for its raise (reads billed under the old class still
// in flight: memcached frozen with a GET of k unanswered) holds nothing in
// flight: it has not gone (its raise stays); its client leaves. An APPEND
// sent and never answered (memcached killed) folds its bytes (it may have
// run) and leaves nothing in flight either.
func TestAppendWaitingForItsRaiseThenGoneLeavesNothing(t *testing.T) {
	t.Parallel()
	p, w, rc := largeKeyProxy(t, "")
	setValue(t, w, "k", 100)
	thaw := p.MC.Freeze(t)
	defer thaw()
	q := dial(t, p.Addr) // an APPEND of a key that needs no raise: goes, unanswered
	q.Send(mcclient.Request{Opcode: mc.OpAppendQ, Key: []byte("j"), Value: []byte("y")})
	if err := q.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the APPENDQ gone", func() bool { return rc.InFlight() == 1 })
	g := dial(t, p.Addr)
	g.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("k")})
	if err := g.Flush(); err != nil {
		t.Fatal(err)
	}
	a := dial(t, p.Addr)
	a.Send(mcclient.Request{Opcode: mc.OpAppend, Key: []byte("k"), Value: bytes.Repeat([]byte("x"), 40_000)})
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the APPEND's raise (k listed at class 16)", func() bool { return rc.KeyBound([]byte("k")) == 16 })
	// (its attempt reserves, raises and releases on the loop: wait for the
	// release, which never comes if a waiting APPEND holds its bytes)
	eventually(t, time.Minute, "1 byte in flight (the APPENDQ's) with an APPEND waiting for its raise", func() bool { return rc.InFlight() == 1 })
	a.Close()
	p.MC.Stop()
	eventually(t, time.Minute, "the unanswered APPENDQ completed", func() bool { return rc.InFlight() == 0 })
	if _, err := g.Read(); err != nil {
		t.Fatal(err)
	}
	t.Logf("largest value %d, k billed %d, ceiling %d", rc.LargestValue(), rc.KeyBound([]byte("k")), rc.Ceiling())
}

// APPENDs held by their bucket's hard limit have not gone, and hold
// nothing in flight while they are held: an unthrottled connection's
// 1-byte APPEND to small (1,000 bytes) beside 20 of bob's APPENDs of 20,000
// bytes held leaves small billed 1 unit per read. (When held APPENDs kept
// their reservations, it was listed at the class of 401,001 bytes, 128
// units, until a FLUSH.)
func TestHeldAppendsLeaveOtherKeysSmall(t *testing.T) {
	t.Parallel()
	_, p, admin, tb := limitedTenant(t, "bob")
	rc := tb.ReadCost()
	setValue(t, admin, "small", 1000)
	bob := login(t, p.Addr, "bob")
	setValue(t, bob, "x", 36_000) // 9 units: bob's burst spent
	v := bytes.Repeat([]byte("a"), 20_000)
	var held []*mcclient.Client
	for i := 0; i < 20; i++ {
		n := tb.Stats().Held
		h := login(t, p.Addr, "bob")
		h.Send(mcclient.Request{Opcode: mc.OpAppend, Key: []byte(fmt.Sprintf("h%d", i)), Value: v})
		if err := h.Flush(); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the APPEND held", func() bool { return tb.Stats().Held > n })
		held = append(held, h)
	}
	eventually(t, time.Minute, "nothing in flight with 20 APPENDs held (none went)", func() bool { return rc.InFlight() == 0 })
	appendThroughProxy(t, admin, "small", []byte("y"))
	for _, h := range held {
		h.Close()
	}
	eventually(t, time.Minute, "the held APPENDs' bytes released", func() bool { return rc.InFlight() == 0 })
	if b := rc.KeyBound([]byte("small")); b > 1 {
		t.Errorf("small holds 1,001 bytes, written through the proxy only, and is billed %d units per read until a FLUSH: the bytes of 20 APPENDs held by the throttle (none went)", b)
	}
}

// A FLUSH while an APPEND is held (holding nothing in flight: it has not
// gone): its re-try reserves in the new epoch, and its NOT_STORED (the key
// is gone) leaves nothing; an APPENDQ of one bucket
// pipelined with a SELECT of another and an APPEND there leave both
// buckets' records as they were.
func TestAppendAcrossFlushAndSelectLeavesNothing(t *testing.T) {
	t.Parallel()
	clk, p, admin, tb := limitedTenant(t, "alice")
	rc := tb.ReadCost()
	setValue(t, admin, "k", 10)
	alice := login(t, p.Addr, "alice")
	setValue(t, alice, "x", 36_000) // the burst spent
	n := tb.Stats().Held
	alice.Send(mcclient.Request{Opcode: mc.OpAppend, Key: []byte("k"), Value: bytes.Repeat([]byte("a"), 5000)})
	if err := alice.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the APPEND held", func() bool { return tb.Stats().Held > n })
	eventually(t, time.Minute, "nothing in flight with the APPEND held", func() bool { return rc.InFlight() == 0 })
	if r, err := admin.Do(mcclient.Request{Opcode: mc.OpFlush}); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	clk.Advance(time.Second)
	r, err := alice.Read()
	if err != nil || r.Status() != mc.StatusNotStored {
		t.Fatalf("the held APPEND after the FLUSH: %v %v, want NOT_STORED", r, err)
	}
	if f, lv := rc.InFlight(), rc.LargestValue(); f != 0 || lv != 0 {
		t.Fatalf("after the FLUSH and the APPEND's NOT_STORED: %d in flight, largest value %d; want 0, 0", f, lv)
	}
	bobRC := p.Engine().Bucket("bob").ReadCost()
	admin.Send(mcclient.Request{Opcode: mc.OpAppendQ, Key: []byte("m"), Value: bytes.Repeat([]byte("b"), 6000)})
	admin.Send(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("bob")})
	admin.Send(mcclient.Request{Opcode: mc.OpAppend, Key: []byte("m"), Value: bytes.Repeat([]byte("c"), 7000)})
	if err := admin.Flush(); err != nil {
		t.Fatal(err)
	}
	for i, want := range []mc.Status{mc.StatusNotStored, mc.StatusSuccess, mc.StatusNotStored} {
		if r, err := admin.Read(); err != nil || r.Status() != want {
			t.Fatalf("answer %d: %v %v, want %v", i, r, err, want)
		}
	}
	if f, g := rc.InFlight(), bobRC.InFlight(); f != 0 || g != 0 {
		t.Fatalf("in flight: alice %d, bob %d", f, g)
	}
	if lv, lb := rc.LargestValue(), bobRC.LargestValue(); lv != 0 || lb > 0 {
		t.Fatalf("largest values: alice %d, bob %d; want 0, 0 (nothing stored)", lv, lb)
	}
}

// An APPEND written upstream and never answered (memcached frozen, then
// killed: Etmpfail "... may have run") may have stored its bytes, and they
// stay on its key's base (finishAppend with noStore false): with
// upstream.MayHaveRun reporting false for every reason (the unsound way),
// this fails, and every other APPEND test passes.
func TestAppendLostUpstreamFoldsItsBytes(t *testing.T) {
	t.Parallel()
	p, w, rc := largeKeyProxy(t, "")
	setValue(t, w, "k", 100)
	thaw := p.MC.Freeze(t)
	defer thaw()
	w.Send(mcclient.Request{Opcode: mc.OpAppend, Key: []byte("k"), Value: bytes.Repeat([]byte("x"), 3000)})
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "the APPEND in flight", func() bool { return rc.InFlight() == 3000 })
	p.MC.Stop()
	r, err := w.Read()
	if err != nil {
		t.Fatal(err)
	}
	if r.Status() != mc.StatusEtmpfail || !bytes.Contains(r.Value, []byte("may have run")) {
		t.Fatalf("the APPEND with memcached killed: %v %q, want Etmpfail ... may have run", r.Status(), r.Value)
	}
	if f := rc.InFlight(); f != 0 {
		t.Fatalf("%d bytes in flight after the APPEND failed", f)
	}
	if lv := rc.LargestValue(); lv < 3100 {
		t.Errorf("an APPEND of 3,000 bytes to k (100 bytes) may have run, yet the largest value is %d bytes: the next APPEND to k starts below what k may hold", lv)
	}
}
