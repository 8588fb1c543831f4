package proxy

import (
	"slices"
	"time"
)

// A correct login is not refused because its source (its user at its
// address) has maxQueuedAuthPerSource other credentials queued, such as a
// flood of guesses at that user from a shared address: past those, a
// source's checks wait "over" them. Checks over count towards neither
// their address's bound (maxQueuedAuthPerAddr) nor the total
// (maxQueuedAuth): each source counts its first maxQueuedAuthPerSource
// there, as before; when one of those is served, its oldest check over
// takes its place in the counts. An unknown user's checks (decoys) never
// wait over.
//
// What bounds the checks over is the connections waiting for them: a
// login whose connection closes leaves its check (authFlights.leave), and
// a check no login waits for is withdrawn, never run (withdraw). The
// unauthenticated connections of an address are bounded
// (unauthSourceLimit) and closed at auth_timeout, so its guesses cannot
// fill a source's maxWaitingAuthPerSource with connections it can hold;
// should they (a larger max_connections), a new login displaces the
// oldest check one login waits for (admit), and is refused with Etmpfail
// only when there is none, or past maxWaitingAuth.
//
// When the worker serves a source, it takes the check most logins wait
// for (authFlight.waiting), the oldest of those: a pool presenting one
// password over many connections goes before guesses presenting one each,
// so it waits at most for the source's next turn, unless a guess that
// more connections than the pool's wait on comes at each turn (the
// documented limit: the two look alike). The source's penalty pacing is
// unchanged: it is served once per turn, whichever check.
const (
	// maxWaitingAuthPerSource bounds one source's checks, over or not:
	// more than one address holds connections at the default
	// max_connections (2 x 1125).
	maxWaitingAuthPerSource = 4096
	// maxWaitingAuth bounds the checks over, all sources together.
	maxWaitingAuth = 16384
)

// turn is the earliest reading at which a check of source src (an
// authPair) from addr may start: the end of its penalty, or of its
// address's; 0 while the proxy drains.
func (q *authQueue) turn(src, addr string) time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.hurry || q.stopped {
		return 0
	}
	var nb time.Duration
	if as := q.sources[src]; as != nil {
		nb = as.notBefore
	}
	return q.addrNotBefore(nb, addr)
}

// admit is push for a login's check: when src's checks fill
// maxWaitingAuthPerSource, their oldest that one login waits for is
// displaced to make room (displace) and returned, for its login to be
// refused Etmpfail as a check that came too late would have been. A flood
// of guesses, one per connection, thus cannot keep a pool (or any check
// with two logins waiting) out, and the guesses' own order is kept.
func (q *authQueue) admit(src string, j *authJob, now time.Duration) (ok bool, displaced *authJob) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if as := q.sources[src]; as != nil && !j.decoy && !q.stopped && len(as.jobs) >= maxWaitingAuthPerSource {
		displaced = q.displace(as, now)
	}
	return q.pushLocked(src, j, now), displaced
}

// withdraw takes j out of the queue, unless the worker has taken it: no
// login waits for its answer any more (authFlights.leave). A check
// withdrawn never runs, so it costs its source nothing.
func (q *authQueue) withdraw(j *authJob, now time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	as := j.src
	if as == nil || q.stopped {
		return
	}
	k := slices.Index(as.jobs, j)
	if k < 0 {
		return
	}
	q.remove(as, k)
	q.uncount(j, now)
	if len(as.jobs) > 0 {
		return
	}
	if i := slices.Index(q.order, as); i >= 0 {
		q.order = slices.Delete(q.order, i, i+1)
	}
	q.emptied(as, now)
}

// overRoom reports whether j may wait over source as's first
// maxQueuedAuthPerSource checks. Under q.mu.
func (q *authQueue) overRoom(as *authSrc, j *authJob) bool {
	return !j.decoy && len(as.jobs) < maxWaitingAuthPerSource && q.over < maxWaitingAuth
}

// waiters is how many logins wait for j's answer (1 without a flight).
func (j *authJob) waiters() int32 {
	if j.flight == nil {
		return 1
	}
	return j.flight.waiting.Load()
}

// take removes and returns the check of as to serve next: the one most
// logins wait for, the oldest of those. Under q.mu; as has a check.
func (q *authQueue) take(as *authSrc) *authJob {
	k, most := 0, int32(-1)
	for i, j := range as.jobs {
		if w := j.waiters(); w > most {
			k, most = i, w
		}
	}
	return q.remove(as, k)
}

// remove takes check k out of as's queue and returns it. When it was
// counted in the bounds and as has checks over, the oldest of those is
// counted in its place. Under q.mu.
func (q *authQueue) remove(as *authSrc, k int) *authJob {
	j := as.jobs[k]
	as.jobs = slices.Delete(as.jobs, k, k+1)
	if j.over {
		as.over--
		q.over--
		return j
	}
	if as.over == 0 {
		return j
	}
	for _, p := range as.jobs {
		if p.over {
			p.over = false
			as.over--
			q.over--
			q.n++
			if p.addr != "" {
				q.addr(p.addr).n++
			}
			break
		}
	}
	return j
}

// displace makes room in as, whose checks fill maxWaitingAuthPerSource,
// for a new one: it takes out and returns its oldest check that one
// login waits for (a guess, in a flood of them), to be refused Etmpfail;
// nil when every check has more. Under q.mu.
func (q *authQueue) displace(as *authSrc, now time.Duration) *authJob {
	for k, j := range as.jobs {
		if j.waiters() == 1 && !j.decoy {
			q.remove(as, k)
			q.uncount(j, now)
			return j
		}
	}
	return nil
}

// uncount takes j, just served, out of the bounds it counted in: the
// total and its address's (forgotten once it has nothing left to
// remember). Under q.mu.
func (q *authQueue) uncount(j *authJob, now time.Duration) {
	if j.decoy || j.over {
		return
	}
	q.n--
	a := q.addrs[j.addr]
	if a == nil || j.addr == "" {
		return
	}
	if a.n--; a.n == 0 {
		a.prune(now)
		if len(a.failing) == 0 && now >= a.notBefore {
			delete(q.addrs, j.addr)
		}
	}
}
