package throttle

import (
	"errors"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
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

// SetShareWeight replaces the weight in fair mode's split (fleet mode sets
// it from the store's shares) without changing Weight; 0 goes back to it.
func TestShareWeight(t *testing.T) {
	testmc.SkipUnderRace(t) // one goroutine drives the engine
	got := func(share int) map[string]float64 {
		cfg := fairSim(4000)
		cfg.span = 3 * time.Second
		bs := []*simBucket{{name: "a", hard: Unlimited, conns: 2}, {name: "b", hard: Unlimited, conns: 2}}
		return simulateWith(t, cfg, bs, func(e *Engine) {
			if err := e.Bucket("a").SetShareWeight(share); err != nil {
				t.Fatal(err)
			}
		})
	}
	r := got(3)
	shareWithin(t, "a (share weight 3)", r["a"], 3000, 0.02)
	shareWithin(t, "b", r["b"], 1000, 0.02)
	r = got(0)
	shareWithin(t, "a (share weight 0: its weight, 1)", r["a"], 2000, 0.02)

	e, _ := New(Config{Capacity: 1000})
	b, _ := e.AddBucket("b", 0, Unlimited)
	_ = b.SetWeight(5)
	if err := b.SetShareWeight(MaxWeight + 1); !errors.Is(err, ErrInvalidWeight) {
		t.Errorf("SetShareWeight(MaxWeight+1): %v", err)
	}
	if err := b.SetShareWeight(-1); !errors.Is(err, ErrInvalidWeight) {
		t.Errorf("SetShareWeight(-1): %v", err)
	}
	if err := b.SetShareWeight(7); err != nil || b.Weight() != 5 || b.ShareWeight() != 7 {
		t.Errorf("SetShareWeight(7): %v, weight %d, share weight %d", err, b.Weight(), b.ShareWeight())
	}
}
