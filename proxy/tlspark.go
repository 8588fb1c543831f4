package proxy

import (
	"net"
	"time"

	"github.com/rs/zerolog"
)

// The front's times (handshake starts and timeouts, parking, the sweep,
// the failure window) are readings of the engine's clock (Server.throttle),
// so that a test on a fake clock decides when each of them comes.
//
// Connections beyond a source's handshake bound wait their turn instead of
// being closed, as long as the source's handshakes succeed: an application
// that opens a pool of 64 TLS connections at once from one host must get
// all 64, not the first tlsMaxHandshakesPerSource. A waiting ("parked")
// connection holds its socket and a few bytes, no goroutine and no
// handshake slot; it is handed the slot and the source's place of the next
// of the source's handshakes to end. What a handshake costs stays bounded
// as before (tlsMaxHandshakesPerSource running per source, tlsMaxHandshakes
// in all, handshakeCPUs computing).
//
// What tells a source whose handshakes are not completing (an attacker
// holding its slots) from a healthy pool beside a neighbour that probes
// the port: only what clients that spoke did. A connection that closes or
// times out before sending anything (a TCP health check, a port scan, a
// silent connection) is no failed handshake; one that sent its hello and
// then failed (a bad certificate, a protocol error, its timeout) is. So:
//
//   - a source is failing while, within its current tlsFailMemory window,
//     at least tlsFailMin of its handshakes failed after the client spoke
//     and they outnumber those that completed: a lone failure, or
//     failures among completions, condemn nothing. A failing source parks
//     nothing (its connections beyond the bound are closed at once), and
//     its connections waiting when it became failing are closed too;
//   - a handshake of a source with parked connections whose client has sent
//     nothing for tlsSilentGrace is ended to give its slot to a parked
//     connection whose client has sent its hello (hasSpoken): silent
//     connections cannot keep a pool from the same address waiting;
//   - a source none of whose handshakes has ended (completed, failed, or
//     been ended for a waiting client) or stepped (hsEntry.stepped: read
//     from its client, or ended a turn of computing) for tlsParkPatience
//     (silent connections only, a flood of slow handshakes) has its
//     parked connections closed, as the bound closed them before; a
//     healthy pool whose handshakes queue for the cpu slots on a busy
//     machine steps, and waits;
//   - at most tlsMaxParkedPerSource per source and tlsMaxParked in all wait,
//     each at most tlsHandshakeTimeout from its accept.
const (
	tlsParkPatience       = 2 * time.Second
	tlsSilentGrace        = 2 * time.Second
	tlsFailMemory         = 10 * time.Second
	tlsFailMin            = 3
	tlsMaxParkedPerSource = 256
	tlsMaxParked          = 1024
	tlsParkSweep          = 250 * time.Millisecond
	tlsMaxRecordedSources = 4096
)

// hsResult is how a handshake ended, as its source's record counts it.
type hsResult uint8

const (
	hsCompleted hsResult = iota // the connection is established
	hsFailed                    // the client spoke, then the handshake failed
	hsDropped                   // ended before the client spoke, by eviction or shutdown: not the source's failure
)

// hsOutcomes counts a source's completed and failed handshakes in the
// window of tlsFailMemory that began at since.
type hsOutcomes struct {
	since     time.Duration
	completed int
	failed    int
}

// failing tells whether the counts condemn their source (see above).
func (o *hsOutcomes) failing() bool {
	return o.failed >= tlsFailMin && o.failed > o.completed
}

// parkedConn is a connection waiting for its source's turn.
type parkedConn struct {
	c  net.Conn
	at time.Duration // accepted (a reading of the engine's clock)
}

// parkedSrc is a source's parked connections, oldest first, and the last
// time it showed progress: a handshake of its ended, or its first
// connection was parked.
type parkedSrc struct {
	conns    []parkedConn
	progress time.Duration
}

// park makes c, from src at its handshake bound, wait for one of src's
// handshakes to end; false when src may not park (it failed lately, or
// holds its share of parked connections): the caller closes c.
func (f *tlsFront) park(c net.Conn, src string, now time.Duration) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.failingLocked(src, now) || f.nParked >= tlsMaxParked {
		return false
	}
	ps := f.parked[src]
	if ps == nil {
		ps = &parkedSrc{progress: now}
		f.parked[src] = ps
	}
	if len(ps.conns) >= tlsMaxParkedPerSource {
		return false
	}
	ps.conns = append(ps.conns, parkedConn{c: c, at: now})
	f.nParked++
	if f.parkTimer == nil {
		f.parkTimer = f.srv.throttle.AfterFunc(tlsParkSweep, f.sweepParked)
	}
	return true
}

// handshakeEnded forgets e, a handshake that has ended as res says,
// and returns the next parked connection of e's source with the entry that
// takes e's place (and its slot), or nil: then e's place is free and the
// caller gives its slot back.
func (f *tlsFront) handshakeEnded(e *hsEntry, res hsResult, now time.Duration) (net.Conn, *hsEntry) {
	e.cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	ps := f.parked[e.src]
	if ps != nil {
		ps.progress = now
	}
	if f.recordLocked(e.src, res, now) && ps != nil {
		// A failing source's waiting connections are closed, as the
		// bound closes its new ones.
		for _, p := range ps.conns {
			_ = p.c.Close()
		}
		f.nParked -= len(ps.conns)
		delete(f.parked, e.src)
		ps = nil
	}
	for ps != nil && len(ps.conns) > 0 && !f.closed {
		p := ps.conns[0]
		ps.conns[0] = parkedConn{}
		ps.conns = ps.conns[1:]
		f.nParked--
		if len(ps.conns) == 0 {
			delete(f.parked, e.src)
		}
		if now-p.at >= tlsHandshakeTimeout {
			_ = p.c.Close()
			continue
		}
		next := &hsEntry{src: e.src, start: now, conn: p.c}
		next.ctx, next.cancel = f.until(p.at + tlsHandshakeTimeout)
		list := f.active[e.src]
		for i, x := range list {
			if x == e {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		f.active[e.src] = append(list, next)
		return p.c, next
	}
	f.releaseSourceLocked(e)
	return nil, nil
}

// recordLocked counts a handshake of src that ended as res, and reports
// whether src is failing now. The record of a source is dropped once its
// window has passed; when tlsMaxRecordedSources sources have one, a new
// source goes unrecorded (it is not failing: its connections park, which
// the bounds on parking keep cheap). Under f.mu.
func (f *tlsFront) recordLocked(src string, res hsResult, now time.Duration) bool {
	if res == hsDropped {
		return false
	}
	o := f.outcomes[src]
	if o != nil && now-o.since >= tlsFailMemory {
		*o = hsOutcomes{since: now}
	}
	if o == nil {
		if len(f.outcomes) >= tlsMaxRecordedSources {
			f.forgetOutcomes(now)
		}
		if len(f.outcomes) >= tlsMaxRecordedSources {
			return false
		}
		o = &hsOutcomes{since: now}
		f.outcomes[src] = o
	}
	if res == hsCompleted {
		o.completed++
	} else {
		o.failed++
	}
	return o.failing()
}

// failingLocked tells whether src's handshakes are failing (see above).
// Under f.mu.
func (f *tlsFront) failingLocked(src string, now time.Duration) bool {
	o := f.outcomes[src]
	return o != nil && now-o.since < tlsFailMemory && o.failing()
}

// forgetOutcomes drops the records whose window has passed. Under f.mu.
func (f *tlsFront) forgetOutcomes(now time.Duration) {
	for k, o := range f.outcomes {
		if now-o.since >= tlsFailMemory {
			delete(f.outcomes, k)
		}
	}
}

// evictSilentLocked ends the handshakes of src whose client has sent
// nothing for tlsSilentGrace, oldest first, one for each of ps's parked
// connections whose client has sent its hello: each ending hands its slot
// to the next parked connection (handshakeEnded). It reports whether it
// ended any. Under f.mu.
func (f *tlsFront) evictSilentLocked(src string, ps *parkedSrc, now time.Duration) bool {
	var silent []*hsEntry
	for _, e := range f.active[src] {
		if !e.evicted.Load() && now-e.start >= tlsSilentGrace && !e.spoke() {
			silent = append(silent, e)
		}
	}
	if len(silent) == 0 {
		return false
	}
	ready := 0
	for _, p := range ps.conns {
		if ready == len(silent) {
			break
		}
		if hasSpoken(p.c) {
			ready++
		}
	}
	for _, e := range silent[:ready] {
		e.evicted.Store(true)
		e.cancel()
	}
	if ready > 0 {
		f.evicted.Add(uint64(ready))
		f.logEvicted.event(&f.srv.log, zerolog.InfoLevel).Str("source", src).Int("ended", ready).
			Msg("tls: ending silent handshakes of a source whose clients wait with their hello sent")
	}
	return ready > 0
}

// sweepParked closes the parked connections of sources that made no
// progress for tlsParkPatience, and those parked past the handshake
// timeout; it runs every tlsParkSweep while any connection is parked
// (its timer is the front's: stop ends it).
func (f *tlsFront) sweepParked() {
	now := f.srv.throttle.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parkTimer = nil
	if f.closed {
		return
	}
	f.forgetOutcomes(now)
	for src, ps := range f.parked {
		if f.evictSilentLocked(src, ps, now) {
			ps.progress = now // the queue moves: the slots go to clients that spoke
		}
		for _, e := range f.active[src] {
			ps.progress = max(ps.progress, time.Duration(e.stepped.Load()))
		}
		stalled := now-ps.progress >= tlsParkPatience
		kept := ps.conns[:0]
		for _, p := range ps.conns {
			if stalled || now-p.at >= tlsHandshakeTimeout {
				_ = p.c.Close()
				f.nParked--
				continue
			}
			kept = append(kept, p)
		}
		clear(ps.conns[len(kept):])
		ps.conns = kept
		if len(kept) == 0 {
			delete(f.parked, src)
		}
		if stalled {
			f.logRefused.event(&f.srv.log, zerolog.WarnLevel).Str("source", src).Int("per_source_limit", tlsMaxHandshakesPerSource).
				Msg("tls: handshakes from one source at their limit and not completing; closing the connections waiting")
		}
	}
	if f.nParked > 0 {
		f.parkTimer = f.srv.throttle.AfterFunc(tlsParkSweep, f.sweepParked)
	}
}

// closeParked closes every parked connection and stops the sweep; from
// stop, under f.mu.
func (f *tlsFront) closeParked() {
	if f.parkTimer != nil {
		f.parkTimer.Stop()
		f.parkTimer = nil
	}
	for src, ps := range f.parked {
		for _, p := range ps.conns {
			_ = p.c.Close()
		}
		delete(f.parked, src)
	}
	f.nParked = 0
}
