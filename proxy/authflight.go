package proxy

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvthrottle/kvthrottle/metrics"
)

// Logins of the same credentials while their password is being checked
// share one check (one bcrypt run) and its answer: an application that
// opens its pool of 16-64 connections at once, with the password cache
// cold (after a restart, or once the cached password has expired), costs
// one check, not one per connection, and none of its connections is
// refused for the others. The bounds of the check queue (authqueue.go)
// thus count distinct credentials.
//
// A flight is keyed by an HMAC of the user name and the password, under a
// key drawn at start and kept only in memory: the password itself is
// never kept past the check, and only a login presenting the very same
// password joins a flight (a flight's answer never lets another password
// in). A login joins a flight started from another address only while its
// own source (its user at its address, authPair) is not under a failure
// penalty: otherwise a guess equal to a password being checked would be
// answered without waiting its turn. A source under penalty has a flight
// of its own per credential, which at most maxPenalisedWaiters connections
// may wait on (the bound a failing source's connections meet: more get
// Etmpfail at once); a healthy source's pool may be of any size.

// maxPenalisedWaiters bounds the logins waiting on one check of a source
// under a failure penalty.
const maxPenalisedWaiters = 64

// authFlights holds the password checks queued or running, by credentials.
// Safe for concurrent use.
type authFlights struct {
	key [32]byte

	mu  sync.Mutex
	m   map[[sha256.Size]byte][]*authFlight
	bad failedCreds // credentials whose check failed (authbad.go)
}

// authFlight is one password check and the logins (SASL AUTHs, on any
// loop) waiting for its answer.
type authFlight struct {
	cred      [sha256.Size]byte
	src       string // the source (authPair) whose turn the check takes
	penalised bool   // src was under a failure penalty when the check was queued
	calls     []*offLoopCall
	// waiting is len(calls), for the queue to read without f.mu: its
	// worker serves a source's flight with the most logins first.
	waiting atomic.Int32
	job     *authJob // its check, as queued
}

// joinResult is what became of a login that join was given.
type joinResult uint8

const (
	joined    joinResult = iota // it waits for a check's answer
	joinFull                    // not taken: a bound (the queue's, maxPenalisedWaiters)
	joinWrong                   // not taken: its credentials are known wrong (authbad.go)
)

func newAuthFlights() *authFlights {
	f := &authFlights{m: make(map[[sha256.Size]byte][]*authFlight)}
	// crypto/rand.Read does not fail (it aborts the program if the
	// system's generator is unusable).
	_, _ = rand.Read(f.key[:])
	return f
}

// credKey is the flight key of user's password.
func (f *authFlights) credKey(user, pass string) [sha256.Size]byte {
	h := hmac.New(sha256.New, f.key[:])
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(user)))
	h.Write(n[:])
	h.Write([]byte(user))
	h.Write([]byte(pass))
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// join makes c wait for the check of j's credentials (j.user, j.pass)
// from source src: an existing flight of src, or, when penalised is false
// (src is not under a failure penalty), of any source that was not either
// (its check does not wait for a penalty); otherwise a new flight whose
// check push queues (j). c is not taken (joinFull) when push refused the
// check (a bound of the queue) or maxPenalisedWaiters wait already for
// src's check, nor (joinWrong) when the credentials failed a check of
// j.who (the user as configured at the login, j.at) not long ago. With
// joined, it returns the flight c waits on.
func (f *authFlights) join(c *offLoopCall, j *authJob, src string, penalised bool, push func(*authJob) bool) (joinResult, *authFlight) {
	cred := f.credKey(j.user, j.pass)
	j.cred = cred
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.bad.has(cred, j.who, j.at) {
		return joinWrong, nil
	}
	var fl *authFlight
	for _, x := range f.m[cred] {
		if x.src == src {
			fl = x
			break
		}
		if !penalised && !x.penalised && fl == nil {
			fl = x
		}
	}
	if fl != nil {
		if penalised && len(fl.calls) >= maxPenalisedWaiters {
			return joinFull, nil
		}
		fl.calls = append(fl.calls, c)
		fl.waiting.Store(int32(len(fl.calls)))
		return joined, fl
	}
	fl = &authFlight{cred: cred, src: src, penalised: penalised, calls: []*offLoopCall{c}, job: j}
	fl.waiting.Store(1)
	j.flight = fl
	if !push(j) {
		return joinFull, nil
	}
	f.m[cred] = append(f.m[cred], fl)
	return joined, fl
}

// finish ends fl, whose check has been answered (or dropped), and returns
// the logins that waited for it: no login joins it from now on.
func (f *authFlights) finish(fl *authFlight) []*offLoopCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forget(fl)
	calls := fl.calls
	fl.calls = nil
	fl.waiting.Store(0)
	return calls
}

// leave takes c, a login whose connection has closed, out of fl: it no
// longer counts among the logins waiting (nor in the order in which a
// source's checks are served). found is false when c no longer waits
// (fl's answer is on its way to it); empty, when no login is left: fl is
// ended, and its check is for nobody (the caller withdraws it).
func (f *authFlights) leave(fl *authFlight, c *offLoopCall) (found, empty bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.Index(fl.calls, c)
	if i < 0 {
		return false, false
	}
	fl.calls = slices.Delete(fl.calls, i, i+1)
	fl.waiting.Store(int32(len(fl.calls)))
	if len(fl.calls) > 0 {
		return true, false
	}
	f.forget(fl)
	return true, true
}

// forget takes fl out of the flights logins may join. Under f.mu.
func (f *authFlights) forget(fl *authFlight) {
	list := f.m[fl.cred]
	for i, x := range list {
		if x == fl {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(f.m, fl.cred)
	} else {
		f.m[fl.cred] = list
	}
}

// Authentication mechanisms and results, as counted in
// kvthrottle_auth_total{mechanism,result}.
const (
	authMechPlain = iota
	authMechSCRAMSHA256
	authMechSCRAMSHA512
	authMechText // memcached's text authentication (checked as PLAIN)
	authMechOther
	numAuthMechs
)

const (
	authSuccess = iota // logged in
	authFailure        // wrong credentials (password, proof, unknown user)
	authRefused        // not checked: too many in progress (Etmpfail), or the proxy is stopping
	authInvalid        // not checked: malformed, unsupported mechanism, proxy.plain_auth, authzid
	numAuthResults
)

var (
	authMechNames   = [numAuthMechs]string{mechPlain, mechSCRAMSHA256, mechSCRAMSHA512, "text", "other"}
	authResultNames = [numAuthResults]string{"success", "failure", "refused", "invalid"}
)

// authCounters counts authentications by mechanism and result. Safe for
// concurrent use; the zero value is ready.
type authCounters [numAuthMechs][numAuthResults]atomic.Uint64

func (a *authCounters) add(mech, result uint8) {
	if int(mech) < numAuthMechs && int(result) < numAuthResults {
		a[mech][result].Add(1)
	}
}

// AppendAuth implements metrics.Source: one count per mechanism and result.
func (srv *Server) AppendAuth(dst []metrics.AuthCount) []metrics.AuthCount {
	for m := range numAuthMechs {
		for r := range numAuthResults {
			dst = append(dst, metrics.AuthCount{Mechanism: authMechNames[m], Result: authResultNames[r],
				Count: srv.authStats[m][r].Load()})
		}
	}
	return dst
}
