package proxy

import (
	"bytes"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// Pacing of failed SASL AUTHs, per connection: the n-th refusal (wrong
// credentials, a malformed or unsupported request, or Etmpfail because the
// check queue is full) is answered after authFailDelay(n) (0, 100 ms,
// 200 ms, 400 ms, 800 ms, ... at most maxAuthFailDelay), and the
// maxAuthFailures-th closes the connection once answered. Failures are
// counted over the connection's life, successes do not reset them. The
// delay holds only that connection (it dispatches nothing meanwhile); the
// event loop goes on (a timer hands the answer back: offLoopCall.after).
const (
	maxAuthFailures   = 5
	authFailDelayBase = 100 * time.Millisecond
	maxAuthFailDelay  = time.Second
)

// authFailDelay is the delay before the answer to a connection's n-th
// failed SASL AUTH (n >= 1).
func authFailDelay(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	d := authFailDelayBase
	for i := 2; i < n && d < maxAuthFailDelay; i++ {
		d *= 2
	}
	return min(d, maxAuthFailDelay)
}

// The value of the proxy's PLAIN success answer (never changed).
var authenticated = []byte("Authenticated")

// errAuthUnavailable is a password check not run: the proxy is stopping.
var errAuthUnavailable = errors.New("authentication unavailable: the proxy is stopping")

// saslAuth handles SASL_AUTH. A SCRAM mechanism starts a conversation
// (scram.go). With PLAIN, where proxy.plain_auth allows it on the
// connection (else AuthError with the reason, before any bcrypt), a
// password verified recently (Server.authCache) logs in at once, on the
// loop, unless the user's logins from this address are under a failure
// penalty. Otherwise the login waits for a check of its credentials
// (authflight.go): one already in flight for the same user and password,
// or a new one, queued for the Server's single auth worker (bcrypt, tens
// of milliseconds); the session dispatches nothing else until it is
// answered, so later commands see the new identity. Any refusal logs the
// session out (as memcached does) and is paced by refuseAuth. A new SASL
// AUTH ends a SCRAM conversation in progress.
func (s *session) saslAuth(r *request) {
	s.scram = nil
	s.authMech = authMechOther
	if h, ok := scramMech(r.key); ok {
		s.authMech = authMechSCRAMSHA256
		if h == bucketcfg.SCRAMSHA512 {
			s.authMech = authMechSCRAMSHA512
		}
		s.scramStart(r, h)
		return
	}
	if string(r.key) != mechPlain {
		s.refuseAuthNow(r, binary.StatusAuthError, "unsupported SASL mechanism; use SCRAM-SHA512, SCRAM-SHA256 or PLAIN")
		return
	}
	s.authMech = authMechPlain
	if _, ok := s.codec.(*textCodec); ok {
		s.authMech = authMechText
	}
	authz, user, pass, ok := parsePlain(r.value)
	if !ok {
		s.refuseAuthNow(r, binary.StatusAuthError, "malformed PLAIN credentials")
		return
	}
	if authz != "" && authz != user {
		// Acting as another user (SASL authorization identity) is not
		// supported: silently ignoring it would grant the authcid's rights
		// to a client that asked for someone else's.
		s.refuseAuthNow(r, binary.StatusAuthError, "PLAIN authzid must be empty or equal to the user name; acting as another user is not supported")
		return
	}
	s.plainLogin(r, user, pass)
}

// plainLogin handles a well-formed PLAIN login of user with password pass
// (see saslAuth). Credentials that failed a check not long ago are refused
// without one (authbad.go).
func (s *session) plainLogin(r *request, user, pass string) {
	srv := s.lp.srv
	ten := srv.ten.Load()
	if p := ten.cfg.Proxy.PlainAuth; !s.plainAllowed(p) {
		s.refuseAuth(s.offLoop(r), user, binary.StatusAuthError, plainRefusal(p))
		return
	}
	addr := authSource(s.remote)
	src := authPair(addr, user)
	now := srv.throttle.Now()
	who := ten.cfg.User(user)
	if bad, by := srv.flights.wrong(user, pass, who, now); bad {
		s.refuseWrong(s.offLoop(r), user, src, addr, by, now)
		return
	}
	penalised := srv.authQ.penalised(src, addr, now)
	// A user with no failure here may use the cache while only its
	// address is penalised (authdecoy.go); a miss then closes the cache to
	// it until its check is answered.
	bypass := penalised && srv.authQ.fresh(src, now)
	if !penalised || bypass {
		if u := srv.authCache.Lookup(ten.cfg, user, pass); u != nil {
			s.login(ten, u)
			s.authSucceeded()
			s.localValue(r, binary.StatusSuccess, authenticated)
			return
		}
		if bypass {
			srv.authQ.missed(src, addr, now)
		}
	}
	c := s.offLoop(r)
	j := &authJob{user: user, pass: pass, addr: addr, decoy: isDecoy(ten.cfg, user), who: who, at: now}
	var displaced *authJob
	push := func(j *authJob) (ok bool) { ok, displaced = srv.authQ.admit(src, j, now); return ok }
	res, fl := joinFull, (*authFlight)(nil)
	handed := c.handOff(func() bool { res, fl = srv.flights.join(c, j, src, penalised, push); return res == joined })
	if displaced != nil {
		srv.authAnswerLogins(displaced, nil, errAuthDisplaced)
	}
	if !handed {
		if res == joinWrong { // known wrong since the check above
			s.refuseWrong(c, user, src, addr, "", now)
			return
		}
		s.refuseAuth(c, user, binary.StatusEtmpfail, authBusyReason)
		return
	}
	s.check = checkWait{fl: fl, c: c, penalised: penalised}
}

// checkWait is the password check a session's login waits for (its
// flight), the login's call in it, and whether the login's user at its
// address was under a failure penalty (the session may then be evicted:
// evictRank).
type checkWait struct {
	fl        *authFlight
	c         *offLoopCall
	penalised bool
}

// checking reports whether the session waits for a password check
// (waitingOffLoop, the check queued for or on the auth worker).
func (s *session) checking() bool { return s.check.fl != nil }

// leaveCheck takes the login of a session that has closed out of the
// check it waits for, if any (authFlights.leave), ending its call there:
// a connection gone counts as waiting no more, and a check no login waits
// for is withdrawn from the queue, not run. On the loop, from close.
func (s *session) leaveCheck() {
	w := s.check
	if w.fl == nil {
		return
	}
	s.check = checkWait{}
	srv := s.lp.srv
	found, empty := srv.flights.leave(w.fl, w.c)
	if !found {
		return // the answer is on its way: back ends the call
	}
	w.c.answer(nil)
	srv.jobs.done() // what back would have done
	if empty {
		srv.authQ.withdraw(w.fl.job, srv.throttle.Now())
	}
}

// authBusyReason is the reason given with Etmpfail when a login's check
// cannot wait.
const authBusyReason = "too many authentications in progress; retry"

// errAuthDisplaced is a check taken out of its full queue for a newer one
// (authQueue.admit): its logins get Etmpfail.
var errAuthDisplaced = errors.New(authBusyReason)

// checkAuth runs one queued password check on the auth worker, against
// the configuration in force when it starts, and answers every login
// waiting for it; wrong credentials are remembered (authbad.go) and
// reported to refused first (see authQueue.start), so the penalty is in
// force by the answer and later logins presenting them find them known. Credentials
// verified meanwhile (by another check, or before a penalty made their
// login wait its turn) cost no bcrypt. While the proxy drains, queued
// checks are answered Etmpfail without bcrypt.
func (srv *Server) checkAuth(j *authJob, refused func()) {
	var u *bucketcfg.User
	err := errAuthUnavailable
	fail := func() {
		srv.flights.failed(j, srv.throttle.Now())
		refused()
	}
	if !srv.draining.Load() {
		j.cfg = srv.ten.Load().cfg
		if srv.decoyCheck(j, fail) {
			return
		}
		if u = srv.authCache.Lookup(j.cfg, j.user, j.pass); u != nil {
			err = nil
		} else {
			start := time.Now()
			u, err = srv.authCache.Authenticate(j.cfg, j.user, j.pass)
			j.took = srv.bcryptDuration(time.Since(start))
			srv.bcryptTook.Store(int64(j.took))
		}
		if err == nil && j.src != nil {
			srv.authQ.verified(j.src)
		}
	}
	if errors.Is(err, bucketcfg.ErrAuthFailed) {
		fail()
	}
	srv.authAnswer(j, u, err)
}

// bcryptDuration is what a bcrypt run that took real (its real, CPU-bound
// duration) counts as: real, unless a test fixed it (fixedBcrypt), so
// that the penalties and decoy delays derived from it are known exactly
// on a fake clock.
func (srv *Server) bcryptDuration(real time.Duration) time.Duration {
	if d := srv.fixedBcrypt.Load(); d > 0 {
		return time.Duration(d)
	}
	return real
}

// dropAuth answers a check the stopped worker did not run.
func (srv *Server) dropAuth(j *authJob) { srv.authAnswer(j, nil, errAuthUnavailable) }

// authAnswer hands a check's result back to the loop of each login that
// waited for it.
func (srv *Server) authAnswer(j *authJob, u *bucketcfg.User, err error) {
	srv.authAnswerLogins(j, u, err)
	if testHookAuthAnswered != nil {
		testHookAuthAnswered()
	}
}

// authAnswerLogins hands u and err back to the logins waiting for j, as
// authAnswer does without reporting a check answered: a displaced check
// (errAuthDisplaced) is answered so, without running.
func (srv *Server) authAnswerLogins(j *authJob, u *bucketcfg.User, err error) {
	if j.flight == nil {
		return
	}
	for _, c := range srv.flights.finish(j.flight) {
		c.back(func() { c.s.authDone(c, j, u, err) })
	}
}

// testHookAuthAnswered, when set (by tests, before the Server starts),
// runs on the auth worker once a check's answers are handed to their
// loops.
var testHookAuthAnswered func()

// parsePlain splits a PLAIN message: [authzid] NUL authcid NUL passwd.
func parsePlain(v []byte) (authz, user, pass string, ok bool) {
	parts := bytes.SplitN(v, []byte{0}, 3)
	if len(parts) != 3 || len(parts[1]) == 0 {
		return "", "", "", false
	}
	return string(parts[0]), string(parts[1]), string(parts[2]), true
}

// authDone applies a password check's result to the open session whose
// login c waited for it; on the loop, outside dispatch (offLoopCall.back).
func (s *session) authDone(c *offLoopCall, j *authJob, u *bucketcfg.User, err error) {
	name := j.user
	s.check = checkWait{}
	switch {
	case errors.Is(err, errAuthUnavailable):
		s.refuseAuth(c, name, binary.StatusEtmpfail, "authentication unavailable: the proxy is stopping")
	case errors.Is(err, errAuthDisplaced):
		s.refuseAuth(c, name, binary.StatusEtmpfail, authBusyReason)
	case err != nil:
		// A decoy's answer comes as late as a bcrypt run's (authdecoy.go).
		s.refuseAuthAfter(c, name, binary.StatusAuthError, authFailedReason, j.charge)
	default:
		srv := s.lp.srv
		ten := srv.ten.Load()
		if ten.cfg != j.cfg {
			// A reload or admin change during the check: the password
			// must match the user as it is now (the check has just
			// remembered it under the hash it was verified against).
			u = srv.authCache.Lookup(ten.cfg, j.user, j.pass)
		}
		if u == nil {
			srv.log.Warn().Str("user", name).Str("remote", s.remote).Msg("authentication failed: user changed or removed by a reload during the check")
			s.refuseAuth(c, name, binary.StatusAuthError, authFailedReason)
			break
		}
		s.login(ten, u)
		s.authSucceeded()
		c.answer(func(b []byte) []byte {
			return s.codec.appendResponse(b, c.sl.req, response{op: c.sl.req.op, status: binary.StatusSuccess, value: authenticated})
		})
	}
}

// login makes u the session's user and selects its bucket.
func (s *session) login(ten *tenants, u *bucketcfg.User) {
	s.user = u
	s.authFailed = false
	s.authenticated()
	switch {
	case ten.bucket(u.Name) != nil && u.CanAccess(u.Name):
		// Clients such as libmemcached and memjs never send
		// SelectBucket: the bucket named like the user is selected.
		s.setBucket(ten.bucket(u.Name))
	case s.bkt != nil && !u.CanAccess(s.bkt.name):
		s.setBucket(nil)
	}
	s.lp.srv.log.Debug().Str("user", u.Name).Str("remote", s.remote).Msg("authenticated")
}

// authSucceeded counts a successful SASL login of the session.
func (s *session) authSucceeded() {
	s.lp.srv.authStats.add(s.authMech, authSuccess)
}

// logout drops the session's identity after a refused SASL AUTH. A client
// that tried to authenticate and failed never falls back to its home
// bucket (proxy.default_bucket or its listener's): its data commands get
// Eaccess until a login succeeds (a client such as memjs that takes a
// refusal for success must not write its tenant's data into the
// anonymous bucket). It is unauthenticated again, under the
// pre-authentication bounds. A TLS client certificate's user stays.
func (s *session) logout() {
	s.user = nil
	s.authFailed = true
	ten := s.lp.srv.ten.Load()
	if s.certLogin(ten) { // a TLS client certificate's user stays (tls.go)
		return
	}
	var b *bucket
	if name := s.homeBucket(ten); name != "" {
		b = ten.bucket(name)
	} else {
		s.unauthenticated()
	}
	s.setBucket(b)
}

// refuseAuthNow refuses a SASL AUTH from dispatch, paced like any refusal.
func (s *session) refuseAuthNow(r *request, st binary.Status, reason string) {
	s.refuseAuth(s.offLoop(r), "", st, reason)
}

// refuseAuth answers c (a SASL AUTH or STEP) with st and reason: it logs
// the session out, counts the failure (kvthrottle_auth_total, and towards
// the connection's maxAuthFailures), logs it (sampled), and answers after
// authFailDelay, closing the connection at maxAuthFailures. With no delay
// it answers before returning (from dispatch, the dispatch loop goes on;
// from offLoopCall.back, back resumes the session); otherwise a timer
// answers (offLoopCall.after). On the loop.
func (s *session) refuseAuth(c *offLoopCall, name string, st binary.Status, reason string) {
	s.refuseAuthAfter(c, name, st, reason, 0)
}

// refuseAuthAfter is refuseAuth answering extra later than its pacing.
func (s *session) refuseAuthAfter(c *offLoopCall, name string, st binary.Status, reason string, extra time.Duration) {
	if s.closed {
		c.answer(nil)
		return
	}
	srv := s.lp.srv
	s.logout()
	if s.authFails < maxAuthFailures {
		s.authFails++
	}
	n := int(s.authFails)
	result := uint8(authInvalid)
	switch {
	case st == binary.StatusEtmpfail:
		result = authRefused
	case reason == authFailedReason:
		result = authFailure
	}
	srv.authStats.add(s.authMech, result)
	// Sampled: a client can cause these at will, on new connections.
	ls, msg := &srv.logAuthFail, "authentication failed"
	if result == authRefused {
		ls, msg = &srv.logAuthRefused, "authentication refused"
	}
	ls.event(&srv.log, zerolog.WarnLevel).Str("user", name).Str("remote", s.remote).
		Str("mechanism", authMechNames[s.authMech]).Str("result", authResultNames[result]).
		Int("failures", n).Str("reason", reason).Msg(msg)
	answer := func() {
		c.answer(func(b []byte) []byte { return s.codec.appendError(b, c.sl.req, st, reason) })
		if n >= maxAuthFailures && !s.closed {
			srv.logAuthFail.event(&srv.log, zerolog.InfoLevel).Str("remote", s.remote).Int("failures", n).
				Msg("too many failed authentications; closing connection")
			s.quit()
		}
	}
	d := authFailDelay(n) + extra
	if d == 0 || srv.draining.Load() {
		answer()
		return
	}
	// The timer only hands the answer back to the loop, within
	// maxAuthFailDelay; once the engine has stopped, the answer is dropped
	// with the connection.
	c.after(srv.throttle.Now()+d, answer)
}

// authFailedReason is the reason given for wrong credentials (never
// saying which part was wrong).
const authFailedReason = "authentication failed"

// selectBucket handles SelectBucket: the key names the bucket.
func (s *session) selectBucket(r *request) {
	name := string(r.key)
	ten := s.lp.srv.ten.Load()
	b := ten.bucket(name)
	if b == nil {
		s.localStatus(r, binary.StatusKeyEnoent, "no such bucket")
		return
	}
	allowed := name == s.homeBucket(ten)
	if s.user != nil {
		allowed = s.user.CanAccess(name)
	}
	if !allowed {
		s.localStatus(r, binary.StatusEaccess, "no access to bucket "+name)
		return
	}
	s.setBucket(b)
	s.localStatus(r, binary.StatusSuccess, "")
}
