package proxy

import (
	"crypto/sha256"
	"net/netip"
	"sync"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// Bounds on the password checks waiting for the auth worker. Past one,
// SASL AUTH gets Etmpfail at once instead of queueing: bcrypt is slow on
// purpose, and a flood of attempts must not delay real logins for minutes.
// They count distinct credentials, not connections: logins that present
// the same credentials share one check (authflight.go), so that a pool of
// connections opened at once costs one check. In the proxy a queue
// "source" is a user at an address (authPair): what one address's failures
// slow down is its guesses at that user, not its other users' logins.
const (
	// maxQueuedAuth bounds the checks waiting, all sources together.
	maxQueuedAuth = 64
	// maxQueuedAuthPerSource bounds the checks of one source (see
	// authPair: distinct credentials of one user from one address) that
	// count towards its address's and the total bound; more wait apart,
	// up to maxWaitingAuthPerSource (authwait.go).
	maxQueuedAuthPerSource = 8
	// maxQueuedAuthPerAddr bounds one address's (see authSource), all its
	// users together, so that one address cannot fill the queue by
	// naming many users.
	maxQueuedAuthPerAddr = 16
	// maxFailingUsersPerAddr: when more than this many users of one
	// address are under a failure penalty at once, the address is
	// guessing across user names, and its logins for every user wait as
	// one source's do (the penalty of its latest failure). Below it, a
	// wrong password costs only its own user's logins from that address.
	maxFailingUsersPerAddr = 4
	// failedAuthShare caps the share of the worker's time that one
	// source's failed checks may use, at 1/failedAuthShare: after a failed
	// check that took d, the source's next check waits (failedAuthShare-1)
	// times d, at most maxFailedAuthPenalty (then the share is a little
	// higher: about 3% at bcrypt cost 10, one wrong password every 2 s,
	// which also slows online guessing from one place). Even a lone source
	// may not use an idle worker past that: a bcrypt run takes a core from
	// the event loops for its whole duration, and with one source flooding
	// at a tenth of a core the tenants' GET p99 still rose 1.6-3x (measured
	// on 2 cores, TestAuthFloodSparesKnownUsersAndTenants); at 2%, 0.6-1.6x.
	// Correct passwords cost the source nothing.
	failedAuthShare = 50
	// maxFailedAuthPenalty caps the wait after one failed check, so that
	// a client that mistyped its password can retry within a client's
	// usual timeout even with costly hashes (cost 11 and up).
	maxFailedAuthPenalty = 2 * time.Second
	// maxAuthSources bounds the sources remembered (queued checks or a
	// pending penalty); past it, penalties that are over are forgotten.
	maxAuthSources = 4096
)

// authJob is one password check: a SASL AUTH that missed the cache.
type authJob struct {
	user, pass string
	cfg        *bucketcfg.Config // the configuration checked against (set by the worker)
	src        *authSrc          // set by push
	flight     *authFlight       // the logins waiting for this check (nil in unit tests)
	addr       string            // the address, for its bounds; "": none (unit tests)
	// decoy: the user had no password_hash when the login was queued (an
	// unknown name): the check runs no bcrypt (authdecoy.go), and counts
	// neither towards its address's nor the total bound.
	decoy bool
	// charge, when set by the check, is the worker time its failure is
	// charged (a decoy's), in place of the time it took.
	charge time.Duration
	// took, set by the check, is how long its bcrypt run took (0: none
	// ran), which its failure is charged.
	took time.Duration
	// cred is its flight key (set by authFlights.join); who, the user as
	// configured when the login came (nil: none), at the engine's reading
	// then: a credential known wrong for who is not queued (authbad.go).
	cred [sha256.Size]byte
	who  *bucketcfg.User
	at   time.Duration
	// over: queued past its source's first maxQueuedAuthPerSource, it
	// counts towards neither its address's nor the total bound (authwait.go).
	over bool
}

// authQueue holds the password checks waiting for the Server's one auth
// worker, so that bcrypt never takes more than one core, nor runs on an
// event loop. Checks are grouped by source and served round robin between
// sources (within one, the check most logins wait for first, then the
// oldest: authwait.go), so one source's checks delay another's by at most
// one bcrypt run each; a source counts at most maxQueuedAuthPerSource
// waiting towards the bounds, all sources together maxQueuedAuth, and a
// source whose checks fail is served at most 1/failedAuthShare of the time. A connection has at
// most one check waiting (its session dispatches nothing meanwhile). Safe
// for concurrent use.
//
// Its times (penalties, turns, the worker's waits) are readings of clock,
// the engine's (Server.throttle): on a fake clock a test decides when a
// penalty ends.
type authQueue struct {
	clock   throttle.Clock
	mu      sync.Mutex
	sources map[string]*authSrc
	addrs   map[string]*authAddr // addresses with checks queued or users under penalty
	order   []*authSrc           // sources with waiting checks, next served first
	n       int                  // waiting checks, but those over (authJob.over) and decoys
	over    int                  // waiting checks over their source's first maxQueuedAuthPerSource
	hurry   bool                 // the proxy drains: penalties no longer apply
	stopped bool
	wake    chan struct{}
}

// authSrc is one source's waiting checks, oldest first, and the time its
// next check may start (after failures).
type authSrc struct {
	key       string
	addr      string // its address ("": none)
	jobs      []*authJob
	over      int // jobs over its first maxQueuedAuthPerSource (authJob.over)
	notBefore time.Duration
	// noCache: until then, a login of this source uses the password cache
	// only when it is not penalised (see fresh).
	noCache time.Duration
	decoy   bool // an unknown user's: its failures count not towards its address's
}

// authAddr is one address's checks queued (all its users), and its users
// under a failure penalty, by source key, with the penalty's end.
type authAddr struct {
	n         int
	failing   map[string]time.Duration
	notBefore time.Duration // set while more than maxFailingUsersPerAddr fail
}

func newAuthQueue(clock throttle.Clock) *authQueue {
	return &authQueue{clock: clock, sources: make(map[string]*authSrc), addrs: make(map[string]*authAddr), wake: make(chan struct{}, 1)}
}

// authPair is the queue's source for a login of user from address addr
// (an authSource).
func authPair(addr, user string) string { return addr + "\x00" + user }

// notBefore is when as's next check may start: its own penalty, or its
// address's while the address guesses across users. Under q.mu.
func (q *authQueue) notBefore(as *authSrc) time.Duration {
	return q.addrNotBefore(as.notBefore, as.addr)
}

// addrNotBefore is the later of nb and the penalty of address addr. Under
// q.mu.
func (q *authQueue) addrNotBefore(nb time.Duration, addr string) time.Duration {
	if a := q.addrs[addr]; a != nil && addr != "" && a.notBefore > nb {
		return a.notBefore
	}
	return nb
}

// penalised reports whether a login of source src (an authPair) from addr
// must wait for its turn now: a recent failure of that user from that
// address, or of the address across users. Such a login may not use the
// password cache nor join another source's check at once: a correct
// guess would otherwise be told apart from a wrong one without waiting.
func (q *authQueue) penalised(src, addr string, now time.Duration) bool {
	return now < q.turn(src, addr)
}

// authSource is the queue's fairness key for a client address ("ip:port"):
// the IPv4 address, or the /64 of an IPv6 address (one host usually holds
// a whole /64). An unparsable address is its own source.
func authSource(remote string) string {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return remote
	}
	a := ap.Addr().Unmap()
	if a.Is4() {
		return a.String()
	}
	p, err := a.Prefix(64)
	if err != nil {
		return a.String()
	}
	return p.String()
}

// push queues j for source src; false when a bound is reached or the
// worker has stopped (j is then not queued). Past src's first
// maxQueuedAuthPerSource checks, j waits over them (authwait.go).
func (q *authQueue) push(src string, j *authJob, now time.Duration) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.pushLocked(src, j, now)
}

// pushLocked is push under q.mu.
func (q *authQueue) pushLocked(src string, j *authJob, now time.Duration) bool {
	as := q.sources[src]
	over := as != nil && len(as.jobs)-as.over >= maxQueuedAuthPerSource
	if q.stopped || (over && !q.overRoom(as, j)) || (!over && !j.decoy && q.n >= maxQueuedAuth) {
		return false
	}
	if as == nil {
		if len(q.sources) >= maxAuthSources {
			q.forget(now)
			if len(q.sources) >= maxAuthSources {
				return false
			}
		}
		as = &authSrc{key: src}
		q.sources[src] = as
	}
	as.decoy = j.decoy
	if j.addr != "" {
		as.addr = j.addr
	}
	if !over && j.addr != "" && !j.decoy {
		a := q.addr(j.addr)
		if a.n >= maxQueuedAuthPerAddr {
			return false
		}
		a.n++
	}
	if len(as.jobs) == 0 {
		q.order = append(q.order, as)
	}
	j.src = as
	as.jobs = append(as.jobs, j)
	switch {
	case over:
		j.over = true
		as.over++
		q.over++
	case !j.decoy:
		q.n++
	}
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// addr returns address a's entry, made if need be (after forgetting what
// is over, when maxAuthSources addresses are remembered: those left have
// checks queued or users under penalty, which other bounds limit). Under
// q.mu.
func (q *authQueue) addr(a string) *authAddr {
	e := q.addrs[a]
	if e == nil {
		if len(q.addrs) >= maxAuthSources {
			q.forget(q.clock.Now())
		}
		e = &authAddr{}
		q.addrs[a] = e
	}
	return e
}

// forget drops the sources with nothing queued whose penalty is over, and
// the addresses with nothing left to remember.
func (q *authQueue) forget(now time.Duration) {
	for k, as := range q.sources {
		if len(as.jobs) == 0 && now >= as.notBefore && now >= as.noCache {
			delete(q.sources, k)
		}
	}
	for k, a := range q.addrs {
		a.prune(now)
		if a.n == 0 && len(a.failing) == 0 && now >= a.notBefore {
			delete(q.addrs, k)
		}
	}
}

// prune forgets the users whose penalty is over.
func (a *authAddr) prune(now time.Duration) {
	for k, end := range a.failing {
		if now >= end {
			delete(a.failing, k)
		}
	}
}

// userFailed records that source key of the address failed, penalised
// until nb; past maxFailingUsersPerAddr users failing at once, the whole
// address waits until nb. Under q.mu.
func (q *authQueue) userFailed(addr, key string, nb, now time.Duration) {
	if addr == "" {
		return
	}
	a := q.addr(addr)
	if a.failing == nil {
		a.failing = make(map[string]time.Duration)
	}
	a.prune(now)
	if nb > a.failing[key] {
		a.failing[key] = nb
	}
	if len(a.failing) > maxFailingUsersPerAddr && nb > a.notBefore {
		a.notBefore = nb
	}
}

// pop takes the next check: of the first source in round-robin order that
// may be served at now, the one most logins wait for, the oldest of those
// (authwait.go). When checks wait but none may start
// yet, it returns nil and how long until one may; nil and 0 when none
// waits.
func (q *authQueue) pop(now time.Duration) (*authJob, time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var wait time.Duration
	for i, as := range q.order {
		if d := q.notBefore(as) - now; d > 0 && !q.hurry {
			if wait == 0 || d < wait {
				wait = d
			}
			continue
		}
		q.order = append(q.order[:i], q.order[i+1:]...)
		j := q.take(as)
		if len(as.jobs) > 0 {
			q.order = append(q.order, as) // its next check waits for the others'
		} else {
			q.emptied(as, now)
		}
		q.uncount(j, now)
		return j, 0
	}
	return nil, wait
}

// emptied forgets as, out of q.order with no check left, once nothing of
// it is left to remember at now (failed brings it back if need be). Under
// q.mu.
func (q *authQueue) emptied(as *authSrc, now time.Duration) {
	as.jobs = nil
	if now >= as.notBefore && now >= as.noCache && q.sources[as.key] == as {
		delete(q.sources, as.key)
	}
}

// drain makes the worker take every queued check at once, penalties or
// not: the proxy drains, and checks are answered without bcrypt.
func (q *authQueue) drain() {
	q.mu.Lock()
	q.hurry = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// failed records that a check of src failed after using took of the
// worker (its bcrypt run): src's next check may not start before end (a
// reading of q.clock) plus took*(failedAuthShare-1), at most
// maxFailedAuthPenalty.
func (q *authQueue) failed(src *authSrc, took time.Duration, end time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopped {
		return
	}
	if cur := q.sources[src.key]; cur != nil {
		src = cur // forgotten while its check ran, and back since
	} else {
		q.sources[src.key] = src
	}
	nb := end + min(took*(failedAuthShare-1), maxFailedAuthPenalty)
	if nb > src.notBefore {
		src.notBefore = nb
	}
	if !src.decoy {
		q.userFailed(src.addr, src.key, nb, end)
	}
}

// failedWithout records a failure of source src (of address addr) that ran
// no check, as a failed check that took took and ended at end (see
// failed); with maxAuthSources remembered and none to forget, nothing.
func (q *authQueue) failedWithout(src, addr string, took, end time.Duration) {
	q.mu.Lock()
	as := q.source(src, addr, q.clock.Now())
	q.mu.Unlock()
	if as != nil {
		q.failed(as, took, end)
	}
}

// refused records that check j was refused (failed): it took j.took of
// the worker and ended now or, for a decoy, is charged as the bcrypt run
// it stands for, ending j.charge from now.
func (q *authQueue) refused(j *authJob) {
	took, end := j.took, q.clock.Now()
	if j.charge > 0 {
		took, end = j.charge, end+j.charge
	}
	q.failed(j.src, took, end)
}

// start runs the worker: it hands the queued checks to check, one at a
// time, until the returned stop function is called. When the credentials
// are refused, check calls refused before it answers any login waiting
// for the check: that counts against the source's share (the job's took,
// or its charge) and puts the source under its penalty before its client,
// told of the refusal, can try again.
// stop waits for the worker to end (after the check it is running, if
// any), refuses further pushes, and hands the checks still queued to drop.
// Call start once, and stop once.
func (q *authQueue) start(check func(j *authJob, refused func()), drop func(*authJob)) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		var timer throttle.Timer // wakes the worker when a penalty ends
		defer func() {
			if timer != nil {
				timer.Stop()
			}
		}()
		wake := func() {
			select {
			case q.wake <- struct{}{}:
			default:
			}
		}
		for {
			now := q.clock.Now()
			j, wait := q.pop(now)
			if j == nil && wait > 0 && testHookAuthQueueIdle != nil {
				testHookAuthQueueIdle(wait)
			}
			if j == nil {
				// At the reading the penalty ends, not after a delay from
				// now: a clock moved since now would wake it late.
				switch {
				case wait <= 0:
				case timer == nil:
					timer = throttle.AtFunc(q.clock, now+wait, wake)
				default:
					throttle.ResetAt(q.clock, timer, now+wait)
				}
				select {
				case <-quit:
					return
				case <-q.wake:
				}
				continue
			}
			check(j, func() { q.refused(j) })
			select {
			case <-quit:
				return
			default:
			}
		}
	}()
	return func() {
		close(quit)
		<-done
		q.mu.Lock()
		q.stopped = true
		var left []*authJob
		for _, as := range q.order {
			left = append(left, as.jobs...)
		}
		q.order, q.sources, q.addrs, q.n, q.over = nil, nil, nil, 0, 0
		q.mu.Unlock()
		for _, j := range left {
			drop(j)
		}
	}
}

// scramTurn returns how long a SCRAM proof from source src must wait
// before it is checked: 0 unless src's failed authentications (wrong
// passwords, wrong proofs) put it under a penalty; then until the penalty
// ends, and the proofs from src already waiting have had their turn, each
// counted as a failure (its turn takes maxFailedAuthPenalty whatever its
// outcome), so that one source guesses no faster with SCRAM, whose check
// costs the proxy nothing, than with PLAIN. false: maxQueuedAuthPerSource
// turns are taken already (refuse the proof with Etmpfail).
func (q *authQueue) scramTurn(src string, now time.Duration) (time.Duration, bool) {
	return q.scramTurnFrom(src, "", now)
}

// scramTurnFrom is scramTurn for source src of address addr (authPair),
// whose proofs also wait while the address guesses across users; a turn
// taken then is taken from the address's too.
func (q *authQueue) scramTurnFrom(src, addr string, now time.Duration) (time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	as := q.sources[src]
	var nb time.Duration
	if as != nil {
		nb = as.notBefore
	}
	nb = q.addrNotBefore(nb, addr)
	if q.hurry || q.stopped || now >= nb {
		return 0, true
	}
	wait := nb - now
	if wait > maxQueuedAuthPerSource*maxFailedAuthPenalty {
		return 0, false
	}
	if as == nil {
		if as = q.source(src, addr, now); as == nil {
			return wait, true
		}
	}
	as.notBefore = nb + maxFailedAuthPenalty
	if a := q.addrs[addr]; addr != "" && a != nil && now < a.notBefore {
		a.notBefore = as.notBefore // the address's next turn comes after this one
	}
	return wait, true
}

// source returns src's entry, made (for address addr) if need be; nil
// when maxAuthSources are remembered and none can be forgotten. Under q.mu.
func (q *authQueue) source(src, addr string, now time.Duration) *authSrc {
	as := q.sources[src]
	if as != nil {
		return as
	}
	if len(q.sources) >= maxAuthSources {
		q.forget(now)
		if len(q.sources) >= maxAuthSources {
			return nil
		}
	}
	as = &authSrc{key: src, addr: addr}
	q.sources[src] = as
	return as
}

// scramFailed records a wrong SCRAM proof from source src as a failed
// check: src's next check (PLAIN or SCRAM) waits maxFailedAuthPenalty.
// With maxAuthSources remembered and none to forget, it records nothing.
func (q *authQueue) scramFailed(src string, now time.Duration) { q.scramFailedFrom(src, "", now) }

// scramFailedFrom is scramFailed for source src of address addr
// (authPair): it counts towards the address's users under penalty.
func (q *authQueue) scramFailedFrom(src, addr string, now time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.stopped {
		return
	}
	as := q.source(src, addr, now)
	if as == nil {
		return
	}
	nb := now + maxFailedAuthPenalty
	if nb > as.notBefore {
		as.notBefore = nb
	}
	q.userFailed(addr, src, nb, now)
}

// testHookAuthQueueIdle, when set (by tests, before the worker starts),
// runs on the worker when it finds nothing due and a penalty ending wait
// after its reading, before it arms its wake-up.
var testHookAuthQueueIdle func(wait time.Duration)
