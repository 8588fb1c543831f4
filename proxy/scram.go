package proxy

import (
	"net/netip"

	"github.com/rs/zerolog"
	"github.com/xdg-go/scram"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// SASL mechanisms, as named on the memcached binary protocol (Couchbase's
// spelling: no dash between SHA and the size). SCRAM (RFC 5802, 7677)
// never sends the password: the client proves it knows it, and the proxy,
// which stores only StoredKey and ServerKey ([[user]] scram_sha256 and
// scram_sha512), checks the proof with two HMACs, on the event loop (no
// PBKDF2, no bcrypt). The conversation:
//
//	SASL_AUTH  key "SCRAM-SHA512", value client-first  -> AuthContinue (0x21), value server-first
//	SASL_STEP  key "SCRAM-SHA512", value client-final  -> Success, value server-final "v=...", or AuthError
//
// The RFC names ("SCRAM-SHA-512", "SCRAM-SHA-256") are accepted as well.
const (
	mechPlain       = "PLAIN"
	mechSCRAMSHA256 = "SCRAM-SHA256"
	mechSCRAMSHA512 = "SCRAM-SHA512"
)

// SASL_LIST_MECHS answers: strongest first; PLAIN only where
// proxy.plain_auth allows it on the connection. (Never changed.)
var (
	saslMechsAll   = []byte(mechSCRAMSHA512 + " " + mechSCRAMSHA256 + " " + mechPlain)
	saslMechsSCRAM = []byte(mechSCRAMSHA512 + " " + mechSCRAMSHA256)
)

// plainRefused is the start of the reason given where proxy.plain_auth
// forbids PLAIN (the text protocol gives it too: appendTextError).
const plainRefused = "PLAIN is not allowed on this connection"

// scramMech returns the hash of a SCRAM mechanism name.
func scramMech(name []byte) (bucketcfg.SCRAMHash, bool) {
	switch string(name) {
	case mechSCRAMSHA256, "SCRAM-SHA-256":
		return bucketcfg.SCRAMSHA256, true
	case mechSCRAMSHA512, "SCRAM-SHA-512":
		return bucketcfg.SCRAMSHA512, true
	}
	return 0, false
}

// scramConv is a session's SCRAM conversation between its SASL_AUTH and
// its SASL_STEP (session.scram; one per session, dropped by the STEP, by
// any refusal and by a new SASL AUTH).
type scramConv struct {
	mech string // as the client named it
	hash bucketcfg.SCRAMHash
	conv *scram.ServerConversation
	cfg  *bucketcfg.Config // the configuration whose credential the server-first used
	user *bucketcfg.User   // the user of that credential; nil: a decoy (unknown user, or no credential for hash)
}

// saslMechs is the SASL_LIST_MECHS answer for the session.
func (s *session) saslMechs() []byte {
	if s.plainAllowed(s.lp.srv.ten.Load().cfg.Proxy.PlainAuth) {
		return saslMechsAll
	}
	return saslMechsSCRAM
}

// plainAllowed reports whether policy allows SASL PLAIN on the session's
// connection: over TLS, or, for tls-or-loopback, from 127.0.0.1 or ::1
// (only those: the rest of 127/8 counts as remote).
func (s *session) plainAllowed(policy bucketcfg.PlainAuthPolicy) bool {
	switch policy {
	case bucketcfg.PlainAnywhere:
		return true
	case bucketcfg.PlainTLSOnly:
		return s.overTLS
	}
	return s.overTLS || isLoopback(s.remote)
}

// isLoopback reports whether remote ("ip:port") is 127.0.0.1 or ::1 (an
// IPv4-mapped 127.0.0.1 too).
func isLoopback(remote string) bool {
	ap, err := netip.ParseAddrPort(remote)
	if err != nil {
		return false
	}
	a := ap.Addr().Unmap()
	return a == netip.AddrFrom4([4]byte{127, 0, 0, 1}) || a == netip.IPv6Loopback()
}

// plainRefusal is the reason PLAIN is refused under policy.
func plainRefusal(policy bucketcfg.PlainAuthPolicy) string {
	return plainRefused + " (proxy.plain_auth = " + string(policy) + "): use TLS or SCRAM"
}

// scramStart handles SASL_AUTH with a SCRAM mechanism: r.value is the
// client-first message. It answers AuthContinue with the server-first
// message and keeps the conversation for the STEP. An unknown user, or one
// without a credential for h, gets a decoy server-first (a salt and
// iteration count like a real user's) and is refused at the STEP, as a
// wrong password is. On the loop, from dispatch; cheap (no PBKDF2).
func (s *session) scramStart(r *request, h bucketcfg.SCRAMHash) {
	cfg := s.lp.srv.ten.Load().cfg
	sc := &scramConv{mech: string(r.key), hash: h, cfg: cfg}
	srv, err := h.Func().NewServer(func(name string) (scram.StoredCredentials, error) {
		cred, u := cfg.SCRAMCredentials(h, name)
		sc.user = u
		return cred, nil
	})
	if err != nil {
		s.refuseAuthNow(r, binary.StatusAuthError, "SCRAM unavailable")
		return
	}
	sc.conv = srv.NewConversation()
	first, err := sc.conv.Step(string(r.value))
	if err != nil {
		s.refuseAuthNow(r, binary.StatusAuthError, "malformed SCRAM client-first message")
		return
	}
	name := sc.conv.Username()
	if a := sc.conv.AuthzID(); a != "" && a != name {
		// As for PLAIN: acting as another user is not supported.
		s.refuseAuth(s.offLoop(r), name, binary.StatusAuthError, "SCRAM authzid must be empty or equal to the user name; acting as another user is not supported")
		return
	}
	s.scram = sc
	if s.user == nil {
		// A login in progress is not the anonymous client it was: until
		// the STEP, its data commands get Eaccess, not its home bucket
		// (homeBucket).
		s.setBucket(nil)
	}
	s.localValue(r, binary.StatusAuthContinue, []byte(first))
}

// scramStep handles SASL_STEP: the client-final message of the session's
// SCRAM conversation. A valid proof logs the user in (its bucket selected
// as after PLAIN) and is answered Success with the server-final message;
// anything else is refused AuthError, paced (refuseAuth). A source whose
// authentications failed lately waits its turn first (authQueue.scramTurn),
// and a wrong proof counts against its source as a wrong password does.
// The source is the user at the client's address (authPair): wrong proofs
// for one user slow that user's logins from that address only (unless the
// address guesses across many users: authAddr).
// On the loop.
func (s *session) scramStep(r *request) {
	sc := s.scram
	s.scram = nil
	if sc == nil {
		s.authMech = authMechOther
		s.refuseAuthNow(r, binary.StatusAuthError, "SASL STEP without a SCRAM conversation in progress: send SASL AUTH first")
		return
	}
	name := sc.conv.Username()
	c := s.offLoop(r)
	if len(r.key) > 0 && string(r.key) != sc.mech {
		s.refuseAuth(c, name, binary.StatusAuthError, "SASL STEP names another mechanism than its SASL AUTH")
		return
	}
	srv := s.lp.srv
	addr := authSource(s.remote)
	src := authPair(addr, name)
	now := srv.throttle.Now()
	wait, ok := srv.authQ.scramTurnFrom(src, addr, now)
	if !ok {
		s.refuseAuth(c, name, binary.StatusEtmpfail, authBusyReason)
		return
	}
	final := string(r.value) // r aliases the input buffer
	if wait == 0 {
		s.scramFinish(c, sc, src, addr, final)
		return
	}
	c.after(now+wait, func() { s.scramFinish(c, sc, src, addr, final) })
}

// scramFinish checks the client-final message of sc and answers c. On
// the loop.
func (s *session) scramFinish(c *offLoopCall, sc *scramConv, src, addr, clientFinal string) {
	name := sc.conv.Username()
	final, err := sc.conv.Step(clientFinal)
	srv := s.lp.srv
	if err != nil || !sc.conv.Valid() || sc.user == nil {
		if final == scram.ErrInvalidProof {
			// A password guess (not a malformed message): it counts
			// against the source.
			srv.authQ.scramFailedFrom(src, addr, srv.throttle.Now())
		}
		if sc.user == nil && sc.cfg.User(name) != nil {
			// The client cannot tell this from a wrong password; the
			// operator can.
			srv.logAuthFail.event(&srv.log, zerolog.WarnLevel).Str("user", name).Str("remote", s.remote).
				Str("mechanism", sc.mech).Msg("SCRAM login for a user without a credential for this hash (add it with kvthrottle hash-password)")
		}
		s.refuseAuth(c, name, binary.StatusAuthError, authFailedReason)
		return
	}
	ten := srv.ten.Load()
	u := sc.user
	if ten.cfg != sc.cfg {
		// A reload or admin change since the server-first: the proof must
		// hold for the user as it is now.
		if cur := ten.cfg.User(name); cur != nil && cur.SameSCRAM(u, sc.hash) {
			u = cur
		} else {
			srv.log.Warn().Str("user", name).Str("remote", s.remote).Msg("authentication failed: user changed or removed by a reload during the SCRAM conversation")
			s.refuseAuth(c, name, binary.StatusAuthError, authFailedReason)
			return
		}
	}
	s.login(ten, u)
	s.authSucceeded()
	v := []byte(final)
	c.answer(func(b []byte) []byte {
		return s.codec.appendResponse(b, c.sl.req, response{op: c.sl.req.op, status: binary.StatusSuccess, value: v})
	})
}
