package fleet

// Load that moves (issue 29): clients behind a load balancer move between
// instances, and a share waiting for the period to move with them leaves
// the limit unused. An instance therefore calls the store early, at a tick
// (a twentieth of a period), when one of its buckets' load moved:
//
//   - arrived: callers are held (or non-blocking callers refused) in a
//     bucket whose last report did not ask for all it can get;
//   - left: a bucket whose last report asked for all it can get has nobody
//     held and used less than nine tenths of what it used the tick before
//     (or nothing): it reports only the idle headroom, releasing its share;
//   - cut: callers are held in a bucket whose hard share the store cut to
//     by more than a fifth of what it computed for it, because other live
//     instances still held the rest: it asks again, to take what they
//     released since.
//
// A call that failed is made again at the next tick, for retryFor periods
// after the last good call (a reply lost after the store lowered this
// instance's share would otherwise leave it on the higher one while the
// others, calling early, take the difference). At most earlyPerPeriod
// early calls (retries included) are made between two periodic ones: the
// store sees at most 1+earlyPerPeriod calls per instance per period, and
// none early once a lost store's last good call is retryFor periods old,
// so the loss policy's timings (lossAfter, capPeriods) are unchanged. The
// periodic calls keep their phase.
//
// Worst case: an early call adds nothing beyond the limit. The store
// clamps every share so that the live instances' shares never add up to
// more than the limit, whenever and however often they call, and an
// instance lowers its own share (the release) before another can take it;
// there is no borrowing or debt. The bounds of the package documentation
// (one engine burst per instance, a lost reply, an admin change) are the
// only ways past the limit, as before; the retry shortens the lost reply's
// from up to a period to about a tick while the store answers.
// TestSimLoadThatMoves asserts the shares' sum and every 1 s window at
// most the limit at every 10 ms step, TestSimLoadThatMovesLostReplies the
// windows with lost replies. What it changes is how soon a share follows the
// load: within one or two ticks (the instance that lost the load releases
// at its first tick after the move, the one that got it asks at its first
// tick and, cut, again at the next) instead of one or two periods.

// minWeight is the weight a bucket whose load left reports: the store's
// lowest. What nobody asks for is split by weight, so this instance keeps
// next to none of it, and the instance the load moved to finds it free.
const minWeight = 0.001

// earlyPerPeriod bounds the early calls between two periodic ones.
const earlyPerPeriod = samplesPerPeriod / 4

// retryFor is how long after its last good call an instance still calls
// again at its next tick after a failed call (within earlyPerPeriod): a
// reply lost after the store lowered a share leaves the instance on the
// higher one, while the others, calling early, take the difference within
// ticks. Below lossAfter: the loss policy's timings are not touched.
const retryFor = 2

// moveTrack is what an instance knows of one bucket for early calls: its
// last report and reply, and its usage at the last two samples.
type moveTrack struct {
	saturated bool   // the last good report asked for all it can get
	cut       bool   // the last good reply cut its hard share (see above)
	units     uint64 // units at the last sample
	rejected  uint64 // refusals at the last sample
	tick      uint64 // units used between the last two samples
	prevTick  uint64 // units used between the two samples before
	refused   bool   // refusals rose between the last two samples
	waiting   int    // callers held at the last sample
	seen      int    // samples taken of it (0, 1, 2+)
}

// left reports whether a saturated bucket's load left: nobody held and its
// usage over the last tick fell (see the file's comment).
func (t *moveTrack) left() bool {
	return t.saturated && t.seen >= 2 && t.waiting == 0 && !t.refused &&
		(t.tick == 0 || t.tick*10 < t.prevTick*9)
}

// arrived reports whether callers wait in a bucket whose last report did
// not ask for all it can get.
func (t *moveTrack) arrived() bool {
	return !t.saturated && (t.waiting > 0 || t.refused)
}

// track records one sample of usage for the early calls.
func (f *Fleet) track(usage []Usage) {
	if f.moves == nil {
		f.moves = make(map[string]*moveTrack)
	}
	for _, u := range usage {
		t := f.moves[u.Name]
		if t == nil {
			t = &moveTrack{}
			f.moves[u.Name] = t
		}
		if t.seen > 0 && u.Units >= t.units {
			t.prevTick, t.tick = t.tick, u.Units-t.units
		} else {
			t.prevTick, t.tick = 0, 0
		}
		t.refused = t.seen > 0 && u.Rejected > t.rejected
		t.units, t.rejected, t.waiting = u.Units, u.Rejected, u.Waiting
		t.seen++
	}
}

// earlyDue reports whether a bucket's load moved since the last call so
// that the instance should call the store now, before its period.
func (f *Fleet) earlyDue() bool {
	switch {
	case f.early >= earlyPerPeriod:
		return false
	case f.retry:
		return f.clock.Now()-f.lastOK < retryFor*f.cfg.Period
	case !f.grants.Load().storeUp:
		return false
	}
	for _, u := range f.buf {
		t := f.moves[u.Name]
		if t == nil {
			continue
		}
		if t.arrived() || t.left() || (t.saturated && t.cut && (t.waiting > 0 || t.refused)) {
			return true
		}
	}
	return false
}

// moved adjusts a bucket's demand for this report by its latest sample:
// held callers in a bucket not reported saturated make it saturated now
// (the mean over the period would say so only later), and a load that
// left makes it want only the idle headroom (its rate over the period
// would keep the share it no longer uses).
func (f *Fleet) moved(name string, d bucketWant) bucketWant {
	t := f.moves[name]
	switch {
	case t == nil:
	case t.left():
		return bucketWant{cap: headroom, weight: minWeight}
	case t.arrived() && d.cap >= 0:
		return bucketWant{cap: -1, weight: float64(max(1, t.waiting))}
	case !t.saturated && d.cap < 0 && t.waiting == 0 && !t.refused:
		// Callers were held over the period, before the last report
		// released the share (the load left): nobody is held now.
		return demand(0, 0, false)
	}
	return d
}

// reported records a good call's report and reply for the early calls.
func (f *Fleet) reported(req *syncRequest, rep *syncReply) {
	for _, b := range req.buckets {
		if t := f.moves[b.name]; t != nil {
			t.saturated, t.cut = b.cap < 0, false
		}
	}
	for _, b := range rep.buckets {
		if t := f.moves[b.name]; t != nil {
			t.cut = b.cut
		}
	}
}
