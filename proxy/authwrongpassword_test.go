package proxy

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xdg-go/scram"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A wrong-password flood from one address must not punish that address's
// correct logins (issue 27 point 2): the penalty falls on the credentials
// that failed (the user at that address), not on the address (a NAT, a
// Kubernetes node, a shared application host).

// coldUsersTail is scramTail plus users cold0..cold19 (cheap password hashes,
// each logging in once: every login is a cold check).
func coldUsersTail(t testing.TB, n int) string {
	var b strings.Builder
	b.WriteString(scramTail(t))
	for i := range n {
		name := fmt.Sprintf("cold%d", i)
		fmt.Fprintf(&b, "[[user]]\nname = %q\npassword_hash = %q\nbuckets = [\"alice\"]\n", name, hashes(t)["alice"])
	}
	return b.String()
}

// wrongFlood runs n connections from 127.0.0.1 sending wrong credentials,
// each attempt with a password never tried before, reconnecting whenever
// the proxy closes one, until stopped: SCRAM-SHA256 proofs for carol when
// useSCRAM, else SASL PLAIN for bob.
type wrongFlood struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	attempts atomic.Int64 // answered
	refused  atomic.Int64 // answered AuthError
	mu       sync.Mutex
	conns    map[net.Conn]bool
}

func startWrongFlood(t *testing.T, addr string, n int, useSCRAM bool) *wrongFlood {
	return startAttemptFlood(t, addr, n, func(rc *rawConn, seq int64) (mc.Status, error) {
		pw := fmt.Sprintf("wrong-%d", seq)
		if useSCRAM {
			return scramStatus(rc, "SCRAM-SHA256", "carol", pw)
		}
		st, _, err := rawExchange(rc, mc.OpSASLAuth, "PLAIN", "\x00bob\x00"+pw)
		return st, err
	})
}

// startAttemptFlood runs n connections from 127.0.0.1, each calling try (its
// seq-th attempt of the whole flood: 1, 2, ...) until the proxy closes it
// (then another connection takes its place) or the flood is stopped.
func startAttemptFlood(t *testing.T, addr string, n int, try func(rc *rawConn, seq int64) (mc.Status, error)) *wrongFlood {
	f := &wrongFlood{stop: make(chan struct{}), conns: map[net.Conn]bool{}}
	var seq atomic.Int64
	for range n {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			for {
				select {
				case <-f.stop:
					return
				default:
				}
				c, err := net.DialTimeout("tcp", addr, 5*time.Second)
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				f.mu.Lock()
				f.conns[c] = true
				f.mu.Unlock()
				rc := &rawConn{t: t, c: c, r: bufio.NewReader(c)}
				for f.running() {
					st, err := try(rc, seq.Add(1))
					if err != nil {
						break
					}
					f.attempts.Add(1)
					if st == mc.StatusAuthError {
						f.refused.Add(1)
					}
				}
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
				c.Close()
			}
		}()
	}
	t.Cleanup(f.halt)
	return f
}

func (f *wrongFlood) running() bool {
	select {
	case <-f.stop:
		return false
	default:
		return true
	}
}

// halt stops the flood and waits for it; safe to call twice.
func (f *wrongFlood) halt() {
	if !f.running() {
		return
	}
	close(f.stop)
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// rawExchange sends one request on rc and reads its answer; unlike
// rawConn.do it reports errors (a closed connection, no answer within 5 s)
// instead of failing the test, so it may run off the test's goroutine.
func rawExchange(rc *rawConn, op mc.Opcode, key, value string) (mc.Status, string, error) {
	b := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: op, Opaque: 7}, nil, nil, []byte(key), []byte(value))
	if _, err := rc.c.Write(b); err != nil {
		return 0, "", err
	}
	st, v, err := rc.read()
	return st, string(v), err
}

// tryPlain logs in with SASL PLAIN; ok is a Success answer.
func tryPlain(rc *rawConn, user, pw string) (bool, error) {
	st, _, err := rawExchange(rc, mc.OpSASLAuth, "PLAIN", "\x00"+user+"\x00"+pw)
	return st == mc.StatusSuccess, err
}

// scramStatus runs a SCRAM conversation and returns the status that ended
// it (the AUTH's when it is not AuthContinue, else the STEP's).
func scramStatus(rc *rawConn, mech, user, pw string) (mc.Status, error) {
	cl, err := scram.SHA256.NewClient(user, pw, "")
	if strings.HasSuffix(mech, "512") {
		cl, err = scram.SHA512.NewClient(user, pw, "")
	}
	if err != nil {
		return 0, err
	}
	conv := cl.NewConversation()
	c1, _ := conv.Step("")
	st, s1, err := rawExchange(rc, mc.OpSASLAuth, mech, c1)
	if err != nil || st != mc.StatusAuthContinue {
		return st, err
	}
	c2, err := conv.Step(s1)
	if err != nil {
		return 0, err
	}
	st, _, err = rawExchange(rc, mc.OpSASLStep, mech, c2)
	return st, err
}

// tryScram runs a SCRAM conversation; ok is a Success STEP whose
// server-final the client accepts.
func tryScram(rc *rawConn, mech, user, pw string) (bool, error) {
	f := scram.SHA256
	if strings.HasSuffix(mech, "512") {
		f = scram.SHA512
	}
	cl, err := f.NewClient(user, pw, "")
	if err != nil {
		return false, err
	}
	conv := cl.NewConversation()
	c1, _ := conv.Step("")
	st, s1, err := rawExchange(rc, mc.OpSASLAuth, mech, c1)
	if err != nil || st != mc.StatusAuthContinue {
		return false, err
	}
	c2, err := conv.Step(s1)
	if err != nil {
		return false, err
	}
	st, s2, err := rawExchange(rc, mc.OpSASLStep, mech, c2)
	if err != nil || st != mc.StatusSuccess {
		return false, err
	}
	_, err = conv.Step(s2)
	return err == nil && conv.Valid(), err
}

// TestWrongPasswordFloodSparesCorrectLogins: from 127.0.0.1, 8 connections
// keep sending wrong PLAIN passwords for bob and 8 wrong SCRAM proofs for
// carol, each a new guess. Meanwhile, from the same address, 20 users log
// in with PLAIN for the first time (each a cold password check) and alice
// logs in 20 times with SCRAM-SHA512: every one of the 40 succeeds. Before
// the fix, the address's penalty took them down with it (a wrong SCRAM
// proof made every proof from the address wait 2 s, in a line of at most
// eight). The flood is still refused (its failures are counted), and bob's
// and carol's own penalties are what TestSCRAMSourcePenalty and the
// authqueue tests check.
func TestWrongPasswordFloodSparesCorrectLogins(t *testing.T) {
	const cold = 20
	p := startProxy(t, testConfig{tail: coldUsersTail(t, cold)})
	plainFlood := startWrongFlood(t, p.Addr, 8, false)
	scramFlood := startWrongFlood(t, p.Addr, 8, true)
	eventually(t, 10*time.Second, "both floods to be refused", func() bool {
		return plainFlood.refused.Load() >= 1 && scramFlood.refused.Load() >= 1
	})
	plainOK, scramOK := 0, 0
	for i := range cold {
		ok, err := tryPlain(dialFrom(t, p.Addr, "127.0.0.1"), fmt.Sprintf("cold%d", i), "alice-pw")
		if ok {
			plainOK++
		} else {
			t.Logf("cold PLAIN login %d: refused (%v)", i, err)
		}
		ok, err = tryScram(dialFrom(t, p.Addr, "127.0.0.1"), "SCRAM-SHA512", "alice", "alice-pw")
		if ok {
			scramOK++
		} else {
			t.Logf("SCRAM login %d: refused (%v)", i, err)
		}
	}
	plainFlood.halt()
	scramFlood.halt()
	t.Logf("flood: %d PLAIN and %d SCRAM attempts answered, %d and %d of them AuthError",
		plainFlood.attempts.Load(), scramFlood.attempts.Load(), plainFlood.refused.Load(), scramFlood.refused.Load())
	if plainOK != cold || scramOK != cold {
		t.Errorf("beside the flood: %d of %d cold PLAIN logins and %d of %d SCRAM logins succeeded, want all",
			plainOK, cold, scramOK, cold)
	}
}
