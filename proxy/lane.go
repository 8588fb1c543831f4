package proxy

import (
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
	"github.com/kvthrottle/kvthrottle/upstream"
)

// maxReadsInFlight bounds the expected response bytes of one bucket's
// reads in flight upstream from one loop (one read always may run while
// the bucket has none). memcached answers a connection in order: with
// upstream.conns_per_bucket off, every session of a loop, whatever its
// bucket, shares the loop's connection to a server, and this is how much
// of one tenant's responses can stand ahead of a neighbour's, however many
// connections the tenant opens. With it on (the default) each lane has
// its own connections (lane.group) and the bound keeps a tenant from
// holding more than its share of the loop's time and memory.
// 1 MiB is a millisecond or two of what a loop moves, and more than the
// bandwidth-delay product of a 10 Gb/s link with a 0.5 ms round trip, so a
// tenant keeps its connection busy. Measured with four connections
// pipelining 1 MB GETs against a neighbour's small GETs (2 cores, memcached
// on loopback): at 4 MiB the neighbour's p99 was 52-55 ms, at 1 MiB 19-27
// ms, and the heavy tenant's throughput did not fall.
const maxReadsInFlight = 1 << 20

// maxLaneReads bounds the number of a bucket's reads in flight upstream
// from one loop, whatever their expected size, when the bucket shares the
// loop's upstream connections with other buckets (upstream.conns_per_bucket
// = false). The size a read is expected to bring is learned from earlier
// ones, and a tenant can make it small (many small reads) before asking for
// large values at once: on a shared connection memcached answers in order,
// so this bounds what such a burst puts ahead of a neighbour's answer to
// maxLaneReads items (throttle.max_item_bytes each at most). 32 still lets
// a multi-get of 32 keys go out in one batch.
//
// A lane with connections of its own (the default) has no such count
// bound: nothing of its stands ahead of a neighbour's answer, and a burst
// of large responses costs the neighbours the same CPU while it streams as
// a tenant steadily reading large values does (measured, 1 loop, a
// neighbour's small GETs every millisecond against four connections
// bursting 256 GETs of 1 MB after 100 small ones: p99 15.0 ms and p99.9
// 24.1 ms without the bound, 14.5 and 23.6 ms with 32; on a shared
// connection the neighbour's worst wait was 887 ms without it, 115 ms with
// it). What such a burst can make the proxy hold is bounded per connection
// (maxResponseBytes) and in all (proxy.max_unsent_bytes); the reads in
// flight are bounded per connection by maxPending and per upstream
// connection by upstream.max_inflight; their units are the bucket's own
// overdraft; and once the answers of connections that went away (or were
// closed for not reading) pass maxResponseBytes, the bucket's upstream
// connections on the loop are closed, so that memcached stops sending
// answers nobody will read (orphan.go). Bounding them by count would cap pipelining clients instead:
// 32 reads per loop let memcaslap's 10-key multi-gets from 32 connections
// reach 0.21x of memcached's rate.
const maxLaneReads = 32

// lane is one bucket's reads in flight upstream from one loop (its
// readWindow: their expected response bytes, bounded by maxReadsInFlight,
// and the sessions waiting for room in it); and, with upstream.conns_per_bucket, the
// bucket's own upstream connections on the loop, so that memcached never
// queues its responses ahead of another bucket's. Waiting sessions go first come, first served:
// while one waits, no other session of the bucket starts a read, so a
// session whose reads are large is not starved by others whose small reads
// keep fitting. Only its loop touches it.
type lane struct {
	readWindow                 // the bucket's reads in flight from the loop (readwindow.go)
	group      *upstream.Group // the bucket's upstream connections (conns_per_bucket), or nil: the loop's shared ones
	used       time.Duration   // loop clock when a request last went to group
	// lease is the loop's stock of the bucket's units (throttle.Lease):
	// the bucket's sessions on the loop are admitted and settled through
	// it, so that most admissions write only the loop's memory.
	lease   *throttle.Lease
	touched bool // in loop.touched: its lease was used in this pass
	// Units billed through the lease (stats: bucket.readUnits and
	// writeUnits) not yet added to the bucket's counters (settleLeases).
	readUnits, writeUnits uint64
	cmds                  [nCmdStats]uint64 // likewise, the bucket's command counters (cmdstats.go)
	b                     *bucket

	// Answers of connections that went away (orphan.go).
	orphansOut  int  // reads in flight on group for closed sessions
	orphanBytes int  // bytes of their answers read since orphansOut was last 0
	aborting    bool // in loop.aborts: group to be aborted
}

// lane returns the loop's lane of b, creating it.
func (lp *loop) lane(b *bucket) *lane {
	l := lp.lanes[b]
	if l == nil {
		l = &lane{lease: b.tb.NewLease(), b: b}
		if lp.srv.opts.connsPerBucket {
			l.group = lp.pool.NewGroup()
		}
		lp.lanes[b] = l
	}
	return l
}

// groupIdle is how long a bucket's upstream connections on a loop may go
// unused before they are closed (they reopen at its next request), so the
// connections to memcached follow the buckets in use, not every bucket
// ever used. A variable for tests.
var groupIdle = 30 * time.Second

// dropIdleLanes forgets the lanes of removed buckets once they are empty,
// and closes the upstream connections of lanes unused for groupIdle;
// connections retire (each closes once its requests in flight, writes
// included, are answered). On the loop, from its tick.
func (lp *loop) dropIdleLanes() {
	for b, l := range lp.lanes {
		switch {
		case b.gone.Load() && l.reads == 0 && l.waiting == 0:
			if l.group != nil {
				l.group.Close()
			}
			l.lease.Return()
			l.addUnits()
			delete(lp.lanes, b)
		case l.group != nil && l.group.Conns() > 0 && lp.now-l.used >= groupIdle && !l.group.Busy():
			l.group.Close()
			l.group = lp.pool.NewGroup()
		}
	}
}

// lane returns the lane of the session's bucket on its loop (s.bkt not nil).
func (s *session) lane() *lane {
	if s.ln == nil {
		s.ln = s.lp.lane(s.bkt)
	}
	return s.ln
}

// group returns the upstream connections a request of the session in
// bucket b goes to: b's lane's on the loop when b is the session's bucket
// and has its own (upstream.conns_per_bucket), else nil (the loop's
// shared ones). A session has one bucket at a time, and its responses
// leave in request order whatever connection answers first (its slot
// queue), so a bucket change mid-pipeline keeps the client's order.
// Called as a request is forwarded: it marks the lane's connections used
// now (lane.used, which dropIdleLanes reads).
func (s *session) group(b *bucket) *upstream.Group {
	if b == nil || b != s.bkt {
		return nil
	}
	l := s.lane()
	l.used = s.lp.now
	return l.group
}

// leaseEvery is how often a loop gives back the stocks of its lanes'
// leases that went unused (throttle.Lease.Expire): after a pass, and,
// while a lease holds stock, from the loop's wake timer. While a stock
// waits to go back, it delays the bucket's callers on other loops by at
// most its units at the bucket's rate: two chunks, half a millisecond of
// the rate (throttle, "Leases").
const leaseEvery = time.Millisecond

// expireLeases gives back the lease stocks that are no longer the loop's
// to use, and adds the leases' counters to their buckets', at most every
// leaseEvery of the engine's clock; while a lease still holds stock it
// arms the loop's wake timer to come back (leaseDue). Everything here runs
// at readings of the engine's clock that the loop's own passes and timer
// choose, never at the real-time tick: with a test's fake clock the stocks
// go back at the same readings on every run. On the loop.
func (lp *loop) expireLeases() {
	if len(lp.lanes) == 0 {
		lp.leaseDue = 0
		return
	}
	now := lp.srv.throttle.Now()
	if now-lp.leasesAt < leaseEvery {
		// Ran lately (after a pass). leaseDue, when set, is never before
		// the next run may be: a full run sets it to leasesAt+leaseEvery,
		// and settleLeases never asks for an earlier one.
		return
	}
	lp.leasesAt, lp.leaseDue = now, 0
	for _, l := range lp.lanes {
		l.lease.Expire()
		if l.lease.Holding() {
			lp.leaseDue = now + leaseEvery
		}
	}
	lp.arm()
}

// expireLeasesAt makes sure expireLeases runs by engine time at. On the
// loop.
func (lp *loop) expireLeasesAt(at time.Duration) {
	if lp.leaseDue == 0 || at < lp.leaseDue {
		lp.leaseDue = at
		lp.arm()
	}
}

// settleLeases brings the buckets of the leases used in this pass up to
// date (throttle.Lease.Expire: their counters, and stocks no longer
// theirs; the lanes' unit counts): before any answer is written
// (flushClients, session.flush) and before a STAT reply reads them, so
// that a client that has an answer sees its commands in the bucket's
// statistics. A few shared writes per bucket and pass, not per command.
// On the loop.
func (lp *loop) settleLeases() {
	for i, l := range lp.touched {
		l.touched = false
		l.lease.Expire()
		l.addUnits()
		lp.touched[i] = nil
		if l.lease.Holding() {
			lp.expireLeasesAt(max(lp.leasesAt+leaseEvery, lp.srv.throttle.Now()))
		}
	}
	lp.touched = lp.touched[:0]
}

// addUnits adds the units billed through the lane's lease since the last
// call, and the commands counted on the lane, to its bucket's counters.
func (l *lane) addUnits() {
	if l.readUnits > 0 {
		l.b.readUnits.Add(l.readUnits)
		l.readUnits = 0
	}
	if l.writeUnits > 0 {
		l.b.writeUnits.Add(l.writeUnits)
		l.writeUnits = 0
	}
	l.addCmds()
}

// touch marks the lane's lease used in this pass (settleLeases).
func (lp *loop) touch(l *lane) {
	if !l.touched {
		l.touched = true
		lp.touched = append(lp.touched, l)
	}
}

// admit is AdmitCost for a command of the session in bucket b: through
// the loop's lease of b when b is the session's bucket (the usual case),
// else through b itself. It returns the lane whose lease the grant must be
// settled with (nil: the bucket).
func (s *session) admit(b *bucket, c throttle.Cost) (throttle.Grant, time.Duration, *lane) {
	if b == s.bkt {
		l := s.lane()
		s.lp.touch(l)
		g, wait := l.lease.AdmitCost(&s.waiter, s.mode(), c)
		return g, wait, l
	}
	g, wait := b.tb.AdmitCost(&s.waiter, s.mode(), c)
	return g, wait, nil
}
