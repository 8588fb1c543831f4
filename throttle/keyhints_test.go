package throttle

import "testing"

// A read of a key the bucket has a hint for is billed the hint when it is
// below the ceiling, and the ceiling otherwise; writes only raise a hint,
// APPEND forgets it, a new epoch empties the table, and a key whose hash
// shares the entry's index but not its tag is billed the ceiling.
func TestKeyHintBills(t *testing.T) {
	e, _ := newEngine(t, Unlimited, 0)
	b := addBucket(t, e, "a", 0, Unlimited)
	rc := b.ReadCost()
	rc.Surprise(256, 1<<20) // one large value: the ceiling is class 256
	h := HashKey([]byte("k"))
	other := h ^ 1<<40 // the same entry, another tag
	steps := []struct {
		what string
		do   func()
		key  KeyHash
		want int64
	}{
		{"unknown key", func() {}, h, 256},
		{"a read recorded", func() { rc.Record(h, 3) }, h, 3},
		{"another key in the same entry", func() {}, other, 256},
		{"a smaller write", func() { rc.RecordWrite(h, 2) }, h, 3},
		{"a larger write", func() { rc.RecordWrite(h, 10) }, h, 10},
		{"a smaller read", func() { rc.Record(h, 1) }, h, 1},
		{"a read above the ceiling", func() { rc.Record(h, 300) }, h, 256},
		{"a read beyond the table's units", func() { rc.Record(h, hintMaxUnits+1) }, h, 256},
		{"a write recorded", func() { rc.RecordWrite(h, 5) }, h, 5},
		{"an append", func() { rc.Forget(h) }, h, 256},
		{"no key", func() {}, 0, 256},
		{"a read again", func() { rc.Record(h, 4) }, h, 4},
		{"the other key recorded", func() { rc.Record(other, 7) }, h, 256},
		{"a new epoch", func() { rc.Record(h, 4); rc.Restore(2, 256) }, h, 256},
	}
	for _, st := range steps {
		st.do()
		if got := rc.Bill(st.key); got != st.want {
			t.Fatalf("%s: billed %d, want %d", st.what, got, st.want)
		}
	}
}

// AdmitCost bills a read its key's hint (Grant.ReadBill), a read without
// a key the ceiling, through the bucket and through a lease.
func TestAdmitCostBillsKeyHint(t *testing.T) {
	e, _ := newEngine(t, Unlimited, 0)
	b := addBucket(t, e, "a", 0, Unlimited)
	rc := b.ReadCost()
	rc.Surprise(256, 1<<20)
	h := HashKey([]byte("k"))
	rc.Record(h, 3)
	l := b.NewLease()
	for _, c := range []struct {
		key  KeyHash
		want int64
	}{{h, 3}, {0, 256}, {HashKey([]byte("unknown")), 256}} {
		g, _ := b.AdmitCost(nil, Blocking, Cost{Read: true, Key: c.key})
		if got := g.ReadBill(); got != c.want {
			t.Errorf("bucket: key %x billed %d, want %d", c.key, got, c.want)
		}
		b.Settle(g, c.want)
		g, _ = l.AdmitCost(nil, Blocking, Cost{Read: true, Key: c.key})
		if got := g.ReadBill(); got != c.want {
			t.Errorf("lease: key %x billed %d, want %d", c.key, got, c.want)
		}
		l.Settle(g, c.want)
	}
}

// HashKey and the billing of a read allocate nothing.
func TestKeyHintAllocs(t *testing.T) {
	e, _ := newEngine(t, Unlimited, 0)
	rc := addBucket(t, e, "a", 0, Unlimited).ReadCost()
	key := []byte("some-key")
	rc.Record(HashKey(key), 2)
	if n := testing.AllocsPerRun(100, func() {
		h := HashKey(key)
		rc.Record(h, rc.Bill(h))
	}); n != 0 {
		t.Fatalf("%v allocations per read", n)
	}
}
