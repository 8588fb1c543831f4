package proxy

import (
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
)

// A flood of wrong passwords from one address must not lock that
// address's other users out (docs/operations.md, "Password guessing"). Two
// rules keep the flood's cost on the credentials that fail:
//
//   - A login of a user with no failure, and no login waiting for a check,
//     at its address (fresh) uses the password cache and shares checks in
//     flight even while the address as a whole is penalised for failing on
//     many users: its answer says nothing about the credentials that
//     failed. Its first cache miss closes that way for the source until its
//     check succeeds or maxFailedAuthPenalty has passed (missed), so that
//     the cache is not a free oracle for guesses at one user.
//   - A login naming no user with a password_hash (an unknown name) is a
//     decoy check: it takes its turn in the queue as any check (its
//     source's penalty, its address's), but runs no bcrypt and is answered
//     as late as a bcrypt run would be (the worker's last one), its failure
//     charged as that run to its own source. It counts neither towards its
//     address's nor the total bound, nor towards its address's users under
//     penalty: a flood of made-up names takes no bcrypt, no queue room and
//     no turn from the address's real users.

// fresh reports whether source src (an authPair) has no failure penalty,
// no check queued and no cache miss pending: its logins may use the
// password cache even while its address is penalised.
func (q *authQueue) fresh(src string, now time.Duration) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	as := q.sources[src]
	return as == nil || (len(as.jobs) == 0 && now >= as.notBefore && now >= as.noCache)
}

// missed records that a login of src (of address addr) missed the password
// cache while its address was penalised: src's logins may not use the cache
// again before its check succeeds (verified) or maxFailedAuthPenalty has
// passed. With maxAuthSources remembered and none to forget, it records
// nothing (the login's check is then refused too: push finds no room).
func (q *authQueue) missed(src, addr string, now time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if as := q.source(src, addr, now); as != nil && now+maxFailedAuthPenalty > as.noCache {
		as.noCache = now + maxFailedAuthPenalty
	}
}

// verified records that a check of src succeeded: its cache misses no
// longer keep it from the cache.
func (q *authQueue) verified(src *authSrc) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if cur := q.sources[src.key]; cur != nil {
		cur.noCache = 0
	}
}

// isDecoy reports whether a PLAIN login of user under cfg needs no bcrypt:
// no such user, or one without password_hash (its check always fails).
func isDecoy(cfg *bucketcfg.Config, user string) bool {
	u := cfg.User(user)
	return u == nil || !u.HasPassword()
}

// decoyCheck answers decoy check j (j.cfg set) without bcrypt when the
// worker has timed one: it fails (refused, before the answer), charged and
// answered as late as the last bcrypt run. false: run the real check (the
// user exists by now, or no bcrypt has been timed yet: this one times it).
func (srv *Server) decoyCheck(j *authJob, refused func()) bool {
	d := time.Duration(srv.bcryptTook.Load())
	if !j.decoy || d <= 0 || !isDecoy(j.cfg, j.user) {
		return false
	}
	j.charge = d
	refused()
	srv.authAnswer(j, nil, bucketcfg.ErrAuthFailed)
	return true
}
