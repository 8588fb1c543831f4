package proxy

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/xdg-go/scram"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// scramLogin runs a SCRAM conversation with mechanism mech (Couchbase's
// name) as user: the AUTH's status, the STEP's (0 when there was none),
// and an error when the exchange itself went wrong (including a
// server-final the client does not accept).
func scramLogin(t testing.TB, rc *rawConn, mech, user, password string) (auth, step mc.Status, err error) {
	t.Helper()
	f := scram.SHA256
	if strings.HasSuffix(mech, "512") {
		f = scram.SHA512
	}
	cl, err := f.NewClient(user, password, "")
	if err != nil {
		t.Fatal(err)
	}
	conv := cl.NewConversation()
	c1, err := conv.Step("")
	if err != nil {
		t.Fatal(err)
	}
	auth, s1 := rc.do(mc.OpSASLAuth, mech, c1)
	if auth != mc.StatusAuthContinue {
		return auth, 0, nil
	}
	c2, err := conv.Step(s1)
	if err != nil {
		return auth, 0, fmt.Errorf("client-final: %w", err)
	}
	step, s2 := rc.do(mc.OpSASLStep, mech, c2)
	if step != mc.StatusSuccess {
		return auth, step, nil
	}
	if _, err := conv.Step(s2); err != nil || !conv.Valid() {
		return auth, step, fmt.Errorf("server-final %q not accepted: %v", s2, err)
	}
	return auth, step, nil
}

// TestSCRAMLogin: SCRAM-SHA256 and SCRAM-SHA512 log a user in without the
// password crossing the wire, into the bucket named like it (as PLAIN
// does), and the server proves it holds the credential (server-final).
// A user without a credential for the hash, an unknown user and a wrong
// password are refused alike, at the STEP; a STEP without AUTH is refused;
// a second AUTH restarts the conversation.
func TestSCRAMLogin(t *testing.T) {
	p := startProxy(t, testConfig{tail: scramTail(t)})
	c := dialFrom(t, p.Addr, "127.0.0.1")
	if st, v := c.do(mc.OpSASLListMechs, "", ""); st != mc.StatusSuccess || v != "SCRAM-SHA512 SCRAM-SHA256 PLAIN" {
		t.Fatalf("list mechs: %s %q", st, v)
	}
	for _, mech := range []string{"SCRAM-SHA256", "SCRAM-SHA512"} {
		c := dialFrom(t, p.Addr, "127.0.0.1")
		auth, step, err := scramLogin(t, c, mech, "alice", "alice-pw")
		if err != nil || auth != mc.StatusAuthContinue || step != mc.StatusSuccess {
			t.Fatalf("%s as alice: AUTH %s, STEP %s, %v", mech, auth, step, err)
		}
		if st, _ := c.do(mc.OpSet, "k", "by "+mech); st != mc.StatusSuccess {
			t.Fatalf("%s: set: %s", mech, st)
		}
		if st, v := c.do(mc.OpGet, "k", ""); st != mc.StatusSuccess || v != "by "+mech {
			t.Fatalf("%s: get: %s %q", mech, st, v)
		}
	}
	// The value is in alice's bucket, not the default one.
	if r, err := login(t, p.Addr, "alice").Get([]byte("k")); status(t, r, err) != mc.StatusSuccess || string(r.Value) != "by SCRAM-SHA512" {
		t.Errorf("alice's bucket via PLAIN: %s %q", r.Status(), r.Value)
	}
	if r, err := dial(t, p.Addr).Get([]byte("k")); status(t, r, err) != mc.StatusKeyEnoent {
		t.Errorf("default bucket has alice's key: %s", r.Status())
	}
	// carol: SCRAM-SHA-256 only; PLAIN refused for her (no password_hash).
	c = dialFrom(t, p.Addr, "127.0.0.1")
	if auth, step, err := scramLogin(t, c, "SCRAM-SHA256", "carol", "carol-pw"); err != nil || step != mc.StatusSuccess {
		t.Fatalf("carol SCRAM-SHA256: AUTH %s, STEP %s, %v", auth, step, err)
	}
	if st, _ := c.do(mc.OpSet, "k", "carol's"); st != mc.StatusSuccess {
		t.Fatalf("carol: set: %s", st)
	}
	refused := []struct{ mech, user, pw string }{
		{"SCRAM-SHA256", "alice", "wrong"},
		{"SCRAM-SHA512", "carol", "carol-pw"}, // no scram_sha512
		{"SCRAM-SHA256", "bob", "bob-pw"},     // no SCRAM credential
		{"SCRAM-SHA512", "mallory", "x"},
	}
	for i, r := range refused {
		// Each from its own address: a wrong proof makes its source's
		// next check wait (TestSCRAMSourcePenalty).
		c := dialFrom(t, p.Addr, fmt.Sprintf("127.0.0.%d", 10+i))
		auth, step, err := scramLogin(t, c, r.mech, r.user, r.pw)
		// Refused at the STEP, like a wrong password: the AUTH does not
		// tell whether the user or its credential exists.
		if err != nil || auth != mc.StatusAuthContinue || step != mc.StatusAuthError {
			t.Errorf("%s as %s/%s: AUTH %s, STEP %s, %v; want AuthContinue then AuthError", r.mech, r.user, r.pw, auth, step, err)
		}
		// A failed login never falls back to the default bucket.
		if st, _ := c.do(mc.OpGet, "k", ""); st != mc.StatusEaccess {
			t.Errorf("%s as %s/%s: GET after the refusal: %s, want Eaccess", r.mech, r.user, r.pw, st)
		}
	}
	if st, _ := dialFrom(t, p.Addr, "127.0.0.1").do(mc.OpSASLAuth, "PLAIN", "\x00carol\x00carol-pw"); st != mc.StatusAuthError {
		t.Errorf("PLAIN for carol (no password_hash): %s, want AuthError", st)
	}

	// Between its AUTH and its STEP a login is not the anonymous client
	// it was: its data commands are refused, not served from the default
	// bucket.
	c = dialFrom(t, p.Addr, "127.0.0.1")
	if st, _ := c.do(mc.OpSet, "anon", "default's"); st != mc.StatusSuccess {
		t.Fatalf("set in the default bucket: %s", st)
	}
	mid, _ := scram.SHA256.NewClient("alice", "alice-pw", "")
	midConv := mid.NewConversation()
	m1, _ := midConv.Step("")
	st, m2 := c.do(mc.OpSASLAuth, "SCRAM-SHA256", m1)
	if st != mc.StatusAuthContinue {
		t.Fatalf("AUTH: %s %q", st, m2)
	}
	if st, v := c.do(mc.OpGet, "anon", ""); st != mc.StatusEaccess {
		t.Errorf("GET between AUTH and STEP: %s %q, want Eaccess", st, v)
	}
	if st, _ := c.do(mc.OpSet, "anon", "written mid-login"); st != mc.StatusEaccess {
		t.Errorf("SET between AUTH and STEP: %s, want Eaccess", st)
	}
	final, _ := midConv.Step(m2)
	if st, _ := c.do(mc.OpSASLStep, "SCRAM-SHA256", final); st != mc.StatusSuccess {
		t.Fatalf("STEP: %s", st)
	}
	if st, v := c.do(mc.OpGet, "k", ""); st != mc.StatusSuccess || v != "by SCRAM-SHA512" {
		t.Errorf("after the login: %s %q, want alice's value", st, v)
	}
	if r, err := dial(t, p.Addr).Get([]byte("anon")); status(t, r, err) != mc.StatusSuccess || string(r.Value) != "default's" {
		t.Errorf("the default bucket's value: %s %q", r.Status(), r.Value)
	}

	// STEP without AUTH.
	c = dialFrom(t, p.Addr, "127.0.0.1")
	if st, v := c.do(mc.OpSASLStep, "SCRAM-SHA256", "c=biws,r=x,p=eA=="); st != mc.StatusAuthError || !strings.Contains(v, "SASL AUTH first") {
		t.Errorf("STEP without AUTH: %s %q", st, v)
	}
	// A second AUTH restarts: the first conversation's STEP no longer
	// applies, the second's does.
	cl, _ := scram.SHA256.NewClient("alice", "alice-pw", "")
	first := cl.NewConversation()
	c1, _ := first.Step("")
	if st, s1 := c.do(mc.OpSASLAuth, "SCRAM-SHA256", c1); st != mc.StatusAuthContinue {
		t.Fatalf("first AUTH: %s %q", st, s1)
	}
	if auth, step, err := scramLogin(t, c, "SCRAM-SHA256", "alice", "alice-pw"); err != nil || step != mc.StatusSuccess {
		t.Fatalf("restarted conversation: AUTH %s, STEP %s, %v", auth, step, err)
	}
	if st, v := c.do(mc.OpGet, "k", ""); st != mc.StatusSuccess || v != "by SCRAM-SHA512" {
		t.Errorf("after the restarted conversation: %s %q", st, v)
	}
	// The conversation ended with its STEP: another STEP is refused.
	if st, _ := c.do(mc.OpSASLStep, "SCRAM-SHA256", "c=biws,r=x,p=eA=="); st != mc.StatusAuthError {
		t.Errorf("second STEP: %s, want AuthError", st)
	}
}

// TestSCRAMFailurePacing: refused SCRAM STEPs on one connection are paced
// like PLAIN refusals, exactly 0, 100, 200, 400 and 800 ms of the engine's
// (fake) clock, and the fifth closes it. (A client-final with a wrong
// nonce, so that no source penalty adds to the delays: it is not a
// password guess.)
func TestSCRAMFailurePacing(t *testing.T) {
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{tail: scramTail(t), loops: 1}, clock)
	c := dialFrom(t, p.Addr, "127.0.0.1")
	for i, want := range []time.Duration{0, 100, 200, 400, 800} {
		want *= time.Millisecond
		cl, _ := scram.SHA512.NewClient("alice", "alice-pw", "")
		conv := cl.NewConversation()
		c1, _ := conv.Step("")
		st, s1 := c.do(mc.OpSASLAuth, "SCRAM-SHA512", c1)
		if st != mc.StatusAuthContinue {
			t.Fatalf("attempt %d: AUTH %s", i+1, st)
		}
		c2, err := conv.Step(s1)
		if err != nil {
			t.Fatal(err)
		}
		c2 = strings.Replace(c2, ",r=", ",r=x", 1)
		sent := clock.Now()
		c.send(mc.OpSASLStep, nil, []byte("SCRAM-SHA512"), []byte(c2))
		if want > 0 {
			armedAt(t, clock, sent+want)
			clock.Advance(want - 1)
			stillArmed(t, clock, sent+want)
			clock.Advance(1)
		}
		st, _, err = c.read()
		if err != nil || st != mc.StatusAuthError {
			t.Fatalf("attempt %d: STEP %s %v, want AuthError", i+1, st, err)
		}
		armedAt(t, clock)
	}
	_ = c.c.SetReadDeadline(time.Now().Add(clientPatience))
	if _, err := c.c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("connection still open after 5 refusals: %v", err)
	}
}

// TestSCRAMSourcePenalty: a wrong SCRAM proof counts against its source
// as a wrong password does: the source's next proof, on another
// connection, is checked exactly maxFailedAuthPenalty of the engine's
// (fake) clock after the wrong one (so one address guesses no faster with
// SCRAM than with PLAIN), while another address is served with the clock
// standing still.
func TestSCRAMSourcePenalty(t *testing.T) {
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{tail: scramTail(t)}, clock)
	failedAt := clock.Now()
	if _, step, err := scramLogin(t, dialFrom(t, p.Addr, "127.0.0.5"), "SCRAM-SHA256", "alice", "wrong"); err != nil || step != mc.StatusAuthError {
		t.Fatalf("wrong password: STEP %s, %v", step, err)
	}
	armedAt(t, clock) // the first refusal of a connection is answered at once
	if _, step, err := scramLogin(t, dialFrom(t, p.Addr, "127.0.0.6"), "SCRAM-SHA256", "alice", "alice-pw"); err != nil || step != mc.StatusSuccess {
		t.Fatalf("other address: STEP %s, %v", step, err)
	}
	// Same address, right password: the STEP waits for the penalty's end.
	c := dialFrom(t, p.Addr, "127.0.0.5")
	cl, _ := scram.SHA256.NewClient("alice", "alice-pw", "")
	conv := cl.NewConversation()
	c1, _ := conv.Step("")
	st, s1 := c.do(mc.OpSASLAuth, "SCRAM-SHA256", c1)
	if st != mc.StatusAuthContinue {
		t.Fatalf("same address: AUTH %s", st)
	}
	c2, err := conv.Step(s1)
	if err != nil {
		t.Fatal(err)
	}
	c.send(mc.OpSASLStep, nil, []byte("SCRAM-SHA256"), []byte(c2))
	end := failedAt + maxFailedAuthPenalty
	armedAt(t, clock, end)
	clock.Advance(maxFailedAuthPenalty - 1)
	stillArmed(t, clock, end)
	clock.Advance(1)
	if st, _, err := c.read(); err != nil || st != mc.StatusSuccess {
		t.Fatalf("same address, right password: STEP %s, %v", st, err)
	}
}

// TestPlainAuthPolicy: proxy.plain_auth decides where SASL PLAIN (and
// memcached's text authentication) is allowed. By default only from
// 127.0.0.1 and ::1 (and over TLS): from 127.0.0.2 PLAIN is refused with
// the reason, and not listed, while SCRAM works; "anywhere" allows it;
// "tls-only" refuses it even from 127.0.0.1.
func TestPlainAuthPolicy(t *testing.T) {
	plain := func(c *rawConn) (mc.Status, string) {
		return c.do(mc.OpSASLAuth, "PLAIN", "\x00alice\x00alice-pw")
	}
	t.Run("default", func(t *testing.T) {
		p := startProxy(t, testConfig{tail: scramTail(t)})
		remote := dialFrom(t, p.Addr, "127.0.0.2")
		st, v := plain(remote)
		if st != mc.StatusAuthError || !strings.Contains(v, "PLAIN is not allowed on this connection (proxy.plain_auth = tls-or-loopback): use TLS or SCRAM") {
			t.Fatalf("PLAIN from 127.0.0.2: %s %q, want AuthError with the reason", st, v)
		}
		if st, v := remote.do(mc.OpSelectBucket, "alice", ""); st != mc.StatusEaccess {
			t.Errorf("select alice after the refusal: %s %q", st, v)
		}
		if st, v := remote.do(mc.OpSASLListMechs, "", ""); st != mc.StatusSuccess || v != "SCRAM-SHA512 SCRAM-SHA256" {
			t.Errorf("mechanisms offered to 127.0.0.2: %q", v)
		}
		if auth, step, err := scramLogin(t, remote, "SCRAM-SHA256", "alice", "alice-pw"); err != nil || step != mc.StatusSuccess {
			t.Errorf("SCRAM from 127.0.0.2: AUTH %s, STEP %s, %v", auth, step, err)
		}
		if st, v := plain(dialFrom(t, p.Addr, "127.0.0.1")); st != mc.StatusSuccess {
			t.Errorf("PLAIN from 127.0.0.1: %s %q", st, v)
		}
	})
	t.Run("anywhere", func(t *testing.T) {
		p := startProxy(t, testConfig{proxy: `plain_auth = "anywhere"`, tail: scramTail(t)})
		if st, v := plain(dialFrom(t, p.Addr, "127.0.0.2")); st != mc.StatusSuccess {
			t.Errorf("PLAIN from 127.0.0.2: %s %q", st, v)
		}
	})
	t.Run("tls-only", func(t *testing.T) {
		p := startProxy(t, testConfig{proxy: `plain_auth = "tls-only"`, tail: scramTail(t)})
		c := dialFrom(t, p.Addr, "127.0.0.1")
		if st, v := plain(c); st != mc.StatusAuthError || !strings.Contains(v, "(proxy.plain_auth = tls-only)") {
			t.Errorf("PLAIN from 127.0.0.1: %s %q, want AuthError with the reason", st, v)
		}
		if auth, step, err := scramLogin(t, c, "SCRAM-SHA512", "alice", "alice-pw"); err != nil || step != mc.StatusSuccess {
			t.Errorf("SCRAM: AUTH %s, STEP %s, %v", auth, step, err)
		}
	})
	t.Run("text", func(t *testing.T) {
		p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: scramTail(t)})
		auth := func(from string) string {
			c := dialFrom(t, p.Addr, from)
			if _, err := c.c.Write([]byte("set auth 0 0 14\r\nalice alice-pw\r\n")); err != nil {
				t.Fatal(err)
			}
			_ = c.c.SetReadDeadline(time.Now().Add(clientPatience))
			line, err := c.r.ReadString('\n')
			if err != nil {
				t.Fatalf("text auth from %s: %v", from, err)
			}
			return line
		}
		if got := auth("127.0.0.2"); got != "CLIENT_ERROR PLAIN is not allowed on this connection (proxy.plain_auth = tls-or-loopback): use TLS or SCRAM\r\n" {
			t.Errorf("text auth from 127.0.0.2: %q", got)
		}
		if got := auth("127.0.0.1"); got != "STORED\r\n" {
			t.Errorf("text auth from 127.0.0.1: %q", got)
		}
	})
}

// TestSCRAMTurn: after a wrong proof, a source's proofs are checked one
// per maxFailedAuthPenalty, at most maxQueuedAuthPerSource waiting; other
// sources do not wait.
func TestSCRAMTurn(t *testing.T) {
	q := newAuthQueue(throttle.NewFakeClock(0))
	now := time.Minute
	if d, ok := q.scramTurn("a", now); d != 0 || !ok {
		t.Fatalf("before any failure: %v %v", d, ok)
	}
	q.scramFailed("a", now)
	for i := 1; i <= maxQueuedAuthPerSource; i++ {
		d, ok := q.scramTurn("a", now)
		if !ok || d != time.Duration(i)*maxFailedAuthPenalty {
			t.Fatalf("turn %d: wait %v %v, want %v", i, d, ok, time.Duration(i)*maxFailedAuthPenalty)
		}
	}
	if _, ok := q.scramTurn("a", now); ok {
		t.Errorf("turn %d granted past the bound", maxQueuedAuthPerSource+1)
	}
	if d, ok := q.scramTurn("b", now); d != 0 || !ok {
		t.Errorf("another source: %v %v", d, ok)
	}
	q.drain()
	if d, ok := q.scramTurn("a", now); d != 0 || !ok {
		t.Errorf("draining: %v %v, want no wait", d, ok)
	}
}
