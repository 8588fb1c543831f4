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
// loop. Otherwise the check (bcrypt, tens of milliseconds) is queued for
// the Server's single auth worker (an offLoopCall); the session dispatches
// nothing else until it is answered, so later commands see the new
// identity. Any refusal logs the session out (as memcached does) and is
// paced by refuseAuth. A new SASL AUTH ends a SCRAM conversation in
// progress.
func (s *session) saslAuth(r *request) {
	s.scram = nil
	if h, ok := scramMech(r.key); ok {
		s.scramStart(r, h)
		return
	}
	if string(r.key) != mechPlain {
		s.refuseAuthNow(r, binary.StatusAuthError, "unsupported SASL mechanism; use SCRAM-SHA512, SCRAM-SHA256 or PLAIN")
		return
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
	srv := s.lp.srv
	ten := srv.ten.Load()
	if p := ten.cfg.Proxy.PlainAuth; !s.plainAllowed(p) {
		s.refuseAuth(s.offLoop(r), user, binary.StatusAuthError, plainRefusal(p))
		return
	}
	if u := srv.authCache.Lookup(ten.cfg, user, pass); u != nil {
		s.login(ten, u)
		s.localValue(r, binary.StatusSuccess, authenticated)
		return
	}
	c := s.offLoop(r)
	j := &authJob{call: c, user: user, pass: pass}
	if !c.handOff(func() bool { return srv.authQ.push(authSource(s.remote), j, time.Now()) }) {
		s.refuseAuth(c, user, binary.StatusEtmpfail, "too many authentications in progress; retry")
		return
	}
	s.checking = true
}

// checkAuth runs one queued password check on the auth worker, against
// the configuration in force when it starts, and reports whether the
// credentials were wrong. While the proxy drains, queued checks are
// answered Etmpfail without bcrypt.
func (srv *Server) checkAuth(j *authJob) (refused bool) {
	var u *bucketcfg.User
	err := errAuthUnavailable
	if !srv.draining.Load() {
		j.cfg = srv.ten.Load().cfg
		u, err = srv.authCache.Authenticate(j.cfg, j.user, j.pass)
	}
	srv.authAnswer(j, u, err)
	return errors.Is(err, bucketcfg.ErrAuthFailed)
}

// dropAuth answers a check the stopped worker did not run.
func (srv *Server) dropAuth(j *authJob) { srv.authAnswer(j, nil, errAuthUnavailable) }

// authAnswer hands a check's result back to its session's loop.
func (srv *Server) authAnswer(j *authJob, u *bucketcfg.User, err error) {
	j.call.back(func() { j.call.s.authDone(j, u, err) })
}

// parsePlain splits a PLAIN message: [authzid] NUL authcid NUL passwd.
func parsePlain(v []byte) (authz, user, pass string, ok bool) {
	parts := bytes.SplitN(v, []byte{0}, 3)
	if len(parts) != 3 || len(parts[1]) == 0 {
		return "", "", "", false
	}
	return string(parts[0]), string(parts[1]), string(parts[2]), true
}

// authDone applies a password check's result to the open session; on
// the loop, outside dispatch (offLoopCall.back).
func (s *session) authDone(j *authJob, u *bucketcfg.User, err error) {
	c, name := j.call, j.user
	s.checking = false
	switch {
	case errors.Is(err, errAuthUnavailable):
		s.refuseAuth(c, name, binary.StatusEtmpfail, "authentication unavailable: the proxy is stopping")
	case err != nil:
		s.refuseAuth(c, name, binary.StatusAuthError, "authentication failed")
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
			s.refuseAuth(c, name, binary.StatusAuthError, "authentication failed")
			break
		}
		s.login(ten, u)
		c.answer(func(b []byte) []byte {
			return s.codec.appendResponse(b, c.sl.req, response{op: c.sl.req.op, status: binary.StatusSuccess, value: authenticated})
		})
	}
}

// login makes u the session's user and selects its bucket.
func (s *session) login(ten *tenants, u *bucketcfg.User) {
	s.user = u
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

// logout drops the session's identity after a refused SASL AUTH: it gets
// what an unauthenticated connection gets (proxy.default_bucket, or no
// bucket, and then the pre-authentication bounds again).
func (s *session) logout() {
	s.user = nil
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

// refuseAuth answers c (a SASL AUTH) with st and reason: it logs the
// session out, counts the failure, and answers after authFailDelay,
// closing the connection at maxAuthFailures. With no delay it answers
// before returning (from dispatch, the dispatch loop goes on; from
// offLoopCall.back, back resumes the session); otherwise a timer answers
// (offLoopCall.after). On the loop.
func (s *session) refuseAuth(c *offLoopCall, name string, st binary.Status, reason string) {
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
	if st == binary.StatusAuthError {
		// Sampled: a client can cause this at will, on new connections.
		srv.logAuthFail.event(&srv.log, zerolog.WarnLevel).Str("user", name).Str("remote", s.remote).
			Int("failures", n).Str("reason", reason).Msg("authentication failed")
	}
	answer := func() {
		c.answer(func(b []byte) []byte { return s.codec.appendError(b, c.sl.req, st, reason) })
		if n >= maxAuthFailures && !s.closed {
			srv.logAuthFail.event(&srv.log, zerolog.InfoLevel).Str("remote", s.remote).Int("failures", n).
				Msg("too many failed authentications; closing connection")
			s.quit()
		}
	}
	d := authFailDelay(n)
	if d == 0 || srv.draining.Load() {
		answer()
		return
	}
	// The timer only hands the answer back to the loop, within
	// maxAuthFailDelay; once the engine has stopped, the answer is dropped
	// with the connection.
	c.after(d, answer)
}

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
