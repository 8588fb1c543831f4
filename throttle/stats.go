package throttle

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of a bucket's counters.
type Stats struct {
	Reserved, HardLimit Limit
	Commands            uint64  // commands admitted
	Units               uint64  // units charged (the first of each command when admitted)
	Held                uint64  // commands held at least once (Blocking mode)
	Rejected            uint64  // NonBlocking refusals
	Waiting             int     // places currently in the FIFO line
	UnitsPerSecond      float64 // units charged per second over the last 1.0 to 1.07 s
}

// Stats returns the bucket's counters. It is cheap and safe to call from
// any goroutine; the fields are read one by one, not as one atomic snapshot.
func (b *Bucket) Stats() Stats {
	l := b.lim.Load()
	waiting := int64(b.tail.Load() - b.served.Load())
	commands := b.commands.Load()
	return Stats{
		Reserved:       l.reserved,
		HardLimit:      l.hard,
		Commands:       commands,
		Units:          commands + b.extra.Load(),
		Held:           b.held.Load(),
		Rejected:       b.rejected.Load(),
		Waiting:        int(max(waiting, 0)),
		UnitsPerSecond: b.perSecond(b.e.now()),
	}
}

// The window holds, for each of the last numSlots slots of 2^26 ns
// (67.1 ms), the bucket's units total (commands+extra) when the slot began:
// the first admission of a slot stores it, so admissions pay one atomic
// load, not a write. Each entry packs the slot number (low 24 bits, in the
// top bits) and the total (low 40 bits, compared modulo 2^40).
const (
	slotShift = 26
	numSlots  = 16
	unitBits  = 40
	unitMask  = 1<<unitBits - 1
	tagMask   = 1<<(64-unitBits) - 1
)

type window [numSlots]atomic.Uint64

// snapshot records the units total at the start of now's slot, once.
func (b *Bucket) snapshot(now int64) {
	s := now >> slotShift
	old := b.slot.Load()
	if s <= old || !b.slot.CompareAndSwap(old, s) {
		return
	}
	total := b.commands.Load() + b.extra.Load()
	b.window[s%numSlots].Store(uint64(s)&tagMask<<unitBits | total&unitMask)
}

// perSecond returns the units charged per second from the start of the
// slot numSlots-1 slots before now's, to now.
func (b *Bucket) perSecond(now int64) float64 {
	cur := now >> slotShift
	from := max(cur-(numSlots-1), 0)
	total := b.commands.Load() + b.extra.Load()
	// The oldest snapshot in range: slots without one saw no admission.
	for s := from; s <= cur; s++ {
		if v := b.window[s%numSlots].Load(); v>>unitBits == uint64(s)&tagMask {
			units := (total - v) & unitMask
			return float64(units) * float64(time.Second) / float64(max(now-from<<slotShift, 1))
		}
	}
	return 0
}
