package proxy

import (
	"bytes"
	"context"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// saslAuth handles SASL_AUTH with mechanism PLAIN. The password check
// (bcrypt, tens of milliseconds) runs off the loop; the session dispatches
// nothing else until it is done, so later commands see the new identity.
func (s *session) saslAuth(f *binary.Frame) {
	if string(f.Key()) != "PLAIN" {
		s.localStatus(f, binary.StatusAuthError, "unsupported SASL mechanism; use PLAIN")
		return
	}
	user, pass, ok := parsePlain(f.Value())
	if !ok {
		s.localStatus(f, binary.StatusAuthError, "malformed PLAIN credentials")
		return
	}
	srv := s.lp.srv
	if srv.authQueued.Add(1) > maxQueuedAuth {
		srv.authQueued.Add(-1)
		s.localStatus(f, binary.StatusEtmpfail, "too many authentications in progress; retry")
		return
	}
	cfg := srv.ten.Load().cfg
	sl := s.later(f)
	s.waiting = true
	srv.jobs.Add(1)
	go func() {
		defer srv.jobs.Done()
		srv.authSem <- struct{}{}
		u, err := cfg.Authenticate(user, pass)
		<-srv.authSem
		srv.authQueued.Add(-1)
		_ = s.lp.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
			s.authDone(sl, user, u, err)
			return nil
		}))
	}()
}

// maxQueuedAuth bounds the password checks running or waiting: past it,
// SASL AUTH gets Etmpfail at once instead of queueing (bcrypt is slow on
// purpose; a flood of attempts must not delay real logins for minutes).
const maxQueuedAuth = 64

// parsePlain splits a PLAIN message: [authzid] NUL authcid NUL passwd.
func parsePlain(v []byte) (user, pass string, ok bool) {
	parts := bytes.SplitN(v, []byte{0}, 3)
	if len(parts) != 3 || len(parts[1]) == 0 {
		return "", "", false
	}
	return string(parts[1]), string(parts[2]), true
}

// authDone applies a password check's result; on the loop.
func (s *session) authDone(sl *slot, name string, u *bucketcfg.User, err error) {
	s.waiting = false
	srv := s.lp.srv
	if err != nil {
		srv.log.Warn().Str("user", name).Str("remote", s.remote).Msg("authentication failed")
		s.completeLater(sl, func(b []byte) []byte {
			return binary.AppendError(b, &sl.req, binary.StatusAuthError, "authentication failed")
		})
		s.resume()
		return
	}
	if !s.closed {
		ten := srv.ten.Load()
		if cur := ten.cfg.User(u.Name); cur != nil {
			u = cur // a reload during the check: use the user as it is now
		} else {
			srv.log.Warn().Str("user", name).Str("remote", s.remote).Msg("authentication failed: user removed by a reload")
			s.completeLater(sl, func(b []byte) []byte {
				return binary.AppendError(b, &sl.req, binary.StatusAuthError, "authentication failed")
			})
			s.resume()
			return
		}
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
		srv.log.Debug().Str("user", name).Str("remote", s.remote).Msg("authenticated")
	}
	s.completeLater(sl, func(b []byte) []byte {
		return binary.AppendResponse(b, &sl.req, binary.StatusSuccess, nil, nil, []byte("Authenticated"))
	})
	s.resume()
}

// selectBucket handles SelectBucket: the key names the bucket.
func (s *session) selectBucket(f *binary.Frame) {
	name := string(f.Key())
	ten := s.lp.srv.ten.Load()
	b := ten.bucket(name)
	if b == nil {
		s.localStatus(f, binary.StatusKeyEnoent, "no such bucket")
		return
	}
	allowed := name == ten.cfg.Proxy.DefaultBucket
	if s.user != nil {
		allowed = s.user.CanAccess(name)
	}
	if !allowed {
		s.localStatus(f, binary.StatusEaccess, "no access to bucket "+name)
		return
	}
	s.setBucket(b)
	s.localStatus(f, binary.StatusSuccess, "")
}
