package proxy

import (
	"context"
	"net"
	"time"

	"github.com/rs/zerolog"
)

// Connections beyond a source's handshake bound wait their turn instead of
// being closed, as long as the source's handshakes succeed: an application
// that opens a pool of 64 TLS connections at once from one host must get
// all 64, not the first tlsMaxHandshakesPerSource. A waiting ("parked")
// connection holds its socket and a few bytes, no goroutine and no
// handshake slot; it is handed the slot and the source's place of the next
// of the source's handshakes to end. What a handshake costs stays bounded
// as before (tlsMaxHandshakesPerSource running per source, tlsMaxHandshakes
// in all, handshakeCPUs computing). A source parks connections only while
// it is healthy:
//
//   - a source none of whose handshakes has completed for tlsParkPatience
//     (silent connections, a flood of slow handshakes) has its parked
//     connections closed, as the bound closed them before;
//   - a source whose handshake failed less than tlsFailMemory ago parks
//     nothing: its connections beyond the bound are closed at once, and
//     those waiting when the handshake failed too;
//   - at most tlsMaxParkedPerSource per source and tlsMaxParked in all wait,
//     each at most tlsHandshakeTimeout from its accept.
const (
	tlsParkPatience       = 2 * time.Second
	tlsFailMemory         = 10 * time.Second
	tlsMaxParkedPerSource = 256
	tlsMaxParked          = 1024
	tlsParkSweep          = 250 * time.Millisecond
	tlsMaxFailedSources   = 4096
)

// parkedConn is a connection waiting for its source's turn.
type parkedConn struct {
	c  net.Conn
	at time.Time // accepted
}

// parkedSrc is a source's parked connections, oldest first, and the last
// time it showed progress: a handshake of its completed, or its first
// connection was parked.
type parkedSrc struct {
	conns    []parkedConn
	progress time.Time
}

// park makes c, from src at its handshake bound, wait for one of src's
// handshakes to end; false when src may not park (it failed lately, or
// holds its share of parked connections): the caller closes c.
func (f *tlsFront) park(c net.Conn, src string, now time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || now.Sub(f.failedAt[src]) < tlsFailMemory || f.nParked >= tlsMaxParked {
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
		f.parkTimer = time.AfterFunc(tlsParkSweep, f.sweepParked)
	}
	return true
}

// handshakeEnded forgets e, a handshake that has ended (ok: it completed),
// and returns the next parked connection of e's source with the entry that
// takes e's place (and its slot), or nil: then e's place is free and the
// caller gives its slot back.
func (f *tlsFront) handshakeEnded(e *hsEntry, ok bool, now time.Time) (net.Conn, *hsEntry) {
	e.cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	ps := f.parked[e.src]
	if ok && ps != nil {
		ps.progress = now
	}
	if !ok {
		if len(f.failedAt) >= tlsMaxFailedSources {
			f.forgetFailures(now)
		}
		if len(f.failedAt) < tlsMaxFailedSources {
			f.failedAt[e.src] = now
		}
		// A failing source's waiting connections are closed, as the
		// bound closes its new ones.
		if ps != nil {
			for _, p := range ps.conns {
				_ = p.c.Close()
			}
			f.nParked -= len(ps.conns)
			delete(f.parked, e.src)
			ps = nil
		}
	}
	for ps != nil && len(ps.conns) > 0 && !f.closed {
		p := ps.conns[0]
		ps.conns[0] = parkedConn{}
		ps.conns = ps.conns[1:]
		f.nParked--
		if len(ps.conns) == 0 {
			delete(f.parked, e.src)
		}
		if now.Sub(p.at) >= tlsHandshakeTimeout {
			_ = p.c.Close()
			continue
		}
		next := &hsEntry{src: e.src}
		next.ctx, next.cancel = context.WithDeadline(f.ctx, p.at.Add(tlsHandshakeTimeout))
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

// forgetFailures drops the failures older than tlsFailMemory. Under f.mu.
func (f *tlsFront) forgetFailures(now time.Time) {
	for k, at := range f.failedAt {
		if now.Sub(at) >= tlsFailMemory {
			delete(f.failedAt, k)
		}
	}
}

// sweepParked closes the parked connections of sources that made no
// progress for tlsParkPatience, and those parked past the handshake
// timeout; it runs every tlsParkSweep while any connection is parked
// (its timer is the front's: stop ends it).
func (f *tlsFront) sweepParked() {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.parkTimer = nil
	if f.closed {
		return
	}
	f.forgetFailures(now)
	for src, ps := range f.parked {
		stalled := now.Sub(ps.progress) >= tlsParkPatience
		kept := ps.conns[:0]
		for _, p := range ps.conns {
			if stalled || now.Sub(p.at) >= tlsHandshakeTimeout {
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
		f.parkTimer = time.AfterFunc(tlsParkSweep, f.sweepParked)
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
