package proxy

import (
	"container/list"
	"crypto/sha256"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// Credentials that failed their check are remembered, so that presenting
// them again costs no bcrypt and slows nobody (docs/operations.md,
// "Password guessing"): after a password is changed, an application's old
// instances retrying the old one, or a client stuck on a typo, take no
// worker time and no room in the check queue, and do not put their user
// at their address under a new penalty. Such a login is refused as a wrong
// password is (counted, logged, its connection's refusal pacing applied),
// no earlier than its source's next check could start plus the worker's
// last bcrypt run: it is answered no sooner than a new guess would be, so
// it tells a client nothing a check would not (an unknown user's
// credentials are remembered as well, and answered the same way). Nor do
// the guesses after it: presented from another source than the one whose
// check failed, it puts its source under the penalty a failed check would
// have, so that a guesser cannot learn, from the pace of its next
// guesses, which passwords someone else tried (an old one, after a
// rotation); old instances of one source retrying are not penalised anew.
//
// A credential is its flight key (authFlights.credKey: a keyed MAC of the
// user and password, never the password), remembered with the user as
// configured when its check failed: it is no longer known wrong once that
// user's password_hash changes (or the user appears), nor failedCredTTL
// after the failure. At most maxFailedCreds are kept, the oldest failure
// going first.
const (
	maxFailedCreds = 4096
	failedCredTTL  = 5 * time.Minute
)

// failedCred is one credential whose check failed.
type failedCred struct {
	cred [sha256.Size]byte
	who  *bucketcfg.User // the user its check failed against; nil: no such user
	at   time.Duration   // when it failed (engine clock)
	src  string          // the source (authPair) of the login whose check failed
}

// failedCreds is the credentials known wrong, oldest failure first. Not
// safe for concurrent use: authFlights guards it with its mutex, so that a
// login of a credential either joins the check in flight or finds it
// known wrong once that check has failed.
type failedCreds struct {
	m     map[[sha256.Size]byte]*list.Element // of *failedCred
	order list.List
}

// has reports whether cred is known wrong for who (the user as configured
// now; nil: no such user) at now; an entry that no longer applies is
// forgotten.
func (b *failedCreds) has(cred [sha256.Size]byte, who *bucketcfg.User, now time.Duration) bool {
	return b.failure(cred, who, now) != nil
}

// failure is cred's failure when cred is known wrong for who at now (see
// has), nil otherwise.
func (b *failedCreds) failure(cred [sha256.Size]byte, who *bucketcfg.User, now time.Duration) *failedCred {
	e := b.m[cred]
	if e == nil {
		return nil
	}
	fc := e.Value.(*failedCred)
	if now >= fc.at && now-fc.at < failedCredTTL && fc.who.SamePasswordHash(who) {
		return fc
	}
	delete(b.m, cred)
	b.order.Remove(e)
	return nil
}

// add remembers that cred failed its check against who at now, for a
// login of source src.
func (b *failedCreds) add(cred [sha256.Size]byte, who *bucketcfg.User, now time.Duration, src string) {
	if b.m == nil {
		b.m = make(map[[sha256.Size]byte]*list.Element)
	}
	if e := b.m[cred]; e != nil {
		fc := e.Value.(*failedCred)
		fc.who, fc.at, fc.src = who, now, src
		b.order.MoveToBack(e)
		return
	}
	b.m[cred] = b.order.PushBack(&failedCred{cred: cred, who: who, at: now, src: src})
	if b.order.Len() > maxFailedCreds {
		oldest := b.order.Front()
		delete(b.m, oldest.Value.(*failedCred).cred)
		b.order.Remove(oldest)
	}
}

// wrong reports whether user's password is known wrong for who (user as
// configured now; nil: none) at now, and the source whose check found it
// so.
func (f *authFlights) wrong(user, pass string, who *bucketcfg.User, now time.Duration) (bool, string) {
	cred := f.credKey(user, pass)
	f.mu.Lock()
	defer f.mu.Unlock()
	if fc := f.bad.failure(cred, who, now); fc != nil {
		return true, fc.src
	}
	return false, ""
}

// failed remembers that the check of j (queued by join, j.cfg set by the
// worker) failed at now. Call it before answering the check's logins.
func (f *authFlights) failed(j *authJob, now time.Duration) {
	if j.flight == nil || j.cfg == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	src := ""
	if j.src != nil {
		src = j.src.key
	}
	f.bad.add(j.cred, j.cfg.User(j.user), now, src)
}

// refuseWrong refuses c, a PLAIN login of user from source src (of address
// addr) whose credentials are known wrong, found so by a check of source
// by ("": unknown), as a failed check: no earlier than src's next check
// may start, plus the worker's last bcrypt run; when by is not src, src
// is then under the penalty of that check's failure.
func (s *session) refuseWrong(c *offLoopCall, user, src, addr, by string, now time.Duration) {
	srv := s.lp.srv
	took := time.Duration(srv.bcryptTook.Load())
	wait := max(srv.authQ.turn(src, addr)-now, 0) + took
	if by != src {
		srv.authQ.failedWithout(src, addr, took, now+wait)
	}
	s.refuseAuthAfter(c, user, binary.StatusAuthError, authFailedReason, wait)
}
