package throttle

import (
	"errors"
	"testing"
)

func TestBucketWeightAndFreePoolMode(t *testing.T) {
	e, err := New(Config{Capacity: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if e.FreePoolMode() != FreePoolFCFS {
		t.Fatalf("default mode %v", e.FreePoolMode())
	}
	b, err := e.AddBucket("b", 0, Unlimited)
	if err != nil {
		t.Fatal(err)
	}
	if b.Weight() != DefaultWeight {
		t.Fatalf("new bucket weight %d, want %d", b.Weight(), DefaultWeight)
	}
	for _, w := range []int{1, 7, MaxWeight} {
		if err := b.SetWeight(w); err != nil || b.Weight() != w {
			t.Fatalf("SetWeight(%d): %v, weight %d", w, err, b.Weight())
		}
	}
	for _, w := range []int{0, -1, MaxWeight + 1} {
		if err := b.SetWeight(w); !errors.Is(err, ErrInvalidWeight) || b.Weight() != MaxWeight {
			t.Fatalf("SetWeight(%d): %v, weight %d", w, err, b.Weight())
		}
	}
	if err := e.SetFreePoolMode(FreePoolFair); err != nil || e.FreePoolMode() != FreePoolFair || e.FreePoolMode().String() != "fair" {
		t.Fatalf("SetFreePoolMode(fair): %v, mode %v", err, e.FreePoolMode())
	}
	if err := e.SetFreePoolMode(FreePoolMode(9)); !errors.Is(err, ErrInvalidFreePoolMode) || e.FreePoolMode() != FreePoolFair {
		t.Fatalf("SetFreePoolMode(9): %v, mode %v", err, e.FreePoolMode())
	}
	if _, err := New(Config{Capacity: 1, FreePool: FreePoolMode(2)}); !errors.Is(err, ErrInvalidFreePoolMode) {
		t.Fatalf("New with mode 2: %v", err)
	}
	if e2, err := New(Config{Capacity: 1, FreePool: FreePoolFair}); err != nil || e2.FreePoolMode() != FreePoolFair {
		t.Fatalf("New with fair: %v", err)
	}
	if FreePoolFCFS.String() != "fcfs" || FreePoolMode(5).String() != "FreePoolMode(5)" {
		t.Fatal("String")
	}
}
