package proxy

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// TestSASLFailurePacing: a connection's refused SASL AUTHs are answered
// after exactly 0, 100, 200, 400 and 800 ms of the engine's clock (a fake
// one: each delay is the timer the proxy arms, and the answer comes when
// the clock reaches it, not a nanosecond before), the fifth closes it, and
// the delays hold that connection only: another one on the same event loop
// is served while it waits, the clock standing still. (Malformed
// credentials, so that no bcrypt run and no per-source budget adds to the
// delays.)
func TestSASLFailurePacing(t *testing.T) {
	clock := throttle.NewFakeClock(0)
	p := startProxyClock(t, testConfig{tail: tenantTail(t), loops: 1}, clock)
	other := login(t, p.Addr, "bob")
	c := dial(t, p.Addr)
	bad := mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("alice")}
	for i, want := range []time.Duration{0, 100, 200, 400, 800} {
		want *= time.Millisecond
		sent := clock.Now()
		op := c.Send(bad)
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if want > 0 {
			armedAt(t, clock, sent+want)
			// While this connection waits, the loop serves the other.
			if r, err := other.Do(mcclient.Request{Opcode: mc.OpNoop}); status(t, r, err) != mc.StatusSuccess {
				t.Fatalf("other connection: %s", r.Status())
			}
			clock.Advance(want - 1)
			stillArmed(t, clock, sent+want)
			clock.Advance(1)
		}
		r, err := c.Read()
		if err != nil {
			t.Fatalf("refusal %d: %v", i+1, err)
		}
		if r.Opaque != op || r.Status() != mc.StatusAuthError {
			t.Fatalf("refusal %d: %s", i+1, r.Status())
		}
		armedAt(t, clock) // answered: nothing left to wait for
	}
	// The fifth refusal closed the connection.
	_ = c.Conn().SetReadDeadline(time.Now().Add(clientPatience))
	if _, err := c.Conn().Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
		t.Fatalf("connection still open after 5 refusals: %v", err)
	}
}

// TestSASLAuthzid: PLAIN with an authorization identity other than the
// user is refused with a reason (and the connection gets no identity); an
// empty one, or the user's own name, is accepted.
func TestSASLAuthzid(t *testing.T) {
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	c := dial(t, p.Addr)
	r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("admin\x00alice\x00alice-pw")})
	if status(t, r, err) != mc.StatusAuthError || !strings.Contains(string(r.Value), "authzid") {
		t.Fatalf("authzid admin for alice: %s %q, want AuthError with a reason", r.Status(), r.Value)
	}
	if r, err := c.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("alice")}); status(t, r, err) != mc.StatusEaccess {
		t.Errorf("select alice's bucket after the refusal: %s, want Eaccess", r.Status())
	}
	for _, v := range []string{"alice\x00alice\x00alice-pw", "\x00alice\x00alice-pw"} {
		c := dial(t, p.Addr)
		r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte(v)})
		if status(t, r, err) != mc.StatusSuccess {
			t.Errorf("PLAIN %q: %s %q", v, r.Status(), r.Value)
		}
		if r, err := c.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("alice")}); status(t, r, err) != mc.StatusSuccess {
			t.Errorf("PLAIN %q: select alice: %s", v, r.Status())
		}
	}
}

// TestSASLFailedReauthLogsOut: as in memcached, a refused SASL AUTH on an
// authenticated connection logs it out: it loses the user's buckets and
// privileges, and does not fall back to proxy.default_bucket either (its
// data commands get Eaccess until a login succeeds: issue 27).
func TestSASLFailedReauthLogsOut(t *testing.T) {
	auth := func(c *mcclient.Client, v string) mc.Status {
		t.Helper()
		r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte(v)})
		return status(t, r, err)
	}
	t.Run("default bucket", func(t *testing.T) {
		p := startProxy(t, testConfig{tail: tenantTail(t)})
		key := []byte("who")
		anon := dial(t, p.Addr)
		if r, err := anon.Set(key, []byte("default's")); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("set: %s", r.Status())
		}
		alice := login(t, p.Addr, "alice")
		if r, err := alice.Set(key, []byte("alice's")); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("set: %s", r.Status())
		}
		if st := auth(alice, "\x00alice\x00wrong"); st != mc.StatusAuthError {
			t.Fatalf("wrong password: %s", st)
		}
		if r, err := alice.Get(key); status(t, r, err) != mc.StatusEaccess {
			t.Errorf("GET after the failed re-auth: %s %q, want Eaccess (never the default bucket's value)", r.Status(), r.Value)
		}
		if r, err := alice.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("default")}); status(t, r, err) != mc.StatusEaccess {
			t.Errorf("select default after the failed re-auth: %s, want Eaccess", r.Status())
		}
		if r, err := alice.Do(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("alice")}); status(t, r, err) != mc.StatusEaccess {
			t.Errorf("select alice after the failed re-auth: %s, want Eaccess", r.Status())
		}
		// The admin loses its privilege the same way (here through a
		// refused authzid).
		admin := login(t, p.Addr, "admin")
		if st := auth(admin, "bob\x00admin\x00admin-pw"); st != mc.StatusAuthError {
			t.Fatalf("authzid: %s", st)
		}
		r, err := admin.Do(mcclient.Request{Opcode: mc.OpSetBucketThrottleProperties, Key: []byte("bob"), Value: []byte(`{"reserved": 1}`)})
		if status(t, r, err) != mc.StatusEaccess {
			t.Errorf("admin opcode after the failed re-auth: %s, want Eaccess", r.Status())
		}
		// Logging in again works.
		if st := auth(alice, "\x00alice\x00alice-pw"); st != mc.StatusSuccess {
			t.Fatalf("login again: %s", st)
		}
		if r, err := alice.Get(key); status(t, r, err) != mc.StatusSuccess || string(r.Value) != "alice's" {
			t.Errorf("GET after logging in again: %s %q", r.Status(), r.Value)
		}
	})
	t.Run("authentication required", func(t *testing.T) {
		p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tenantTail(t)})
		alice := login(t, p.Addr, "alice")
		if r, err := alice.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("set: %s", r.Status())
		}
		if st := auth(alice, "\x00alice\x00wrong"); st != mc.StatusAuthError {
			t.Fatalf("wrong password: %s", st)
		}
		r, err := alice.Get([]byte("k"))
		if status(t, r, err) != mc.StatusEaccess || !strings.Contains(string(r.Value), "authentication required") {
			t.Errorf("GET after the failed re-auth: %s %q, want Eaccess: authentication required", r.Status(), r.Value)
		}
	})
}

// TestSASLCacheFollowsReload: a password remembered from an earlier login
// stops working as soon as a reload changes the user's hash or removes the
// user; the new password works, and a user the reload left alone keeps
// logging in.
func TestSASLCacheFollowsReload(t *testing.T) {
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	for _, u := range []string{"alice", "bob", "admin"} {
		login(t, p.Addr, u).Close() // remembered
	}
	newHash := testmc.PasswordHash(t, "alice-new")
	tail := strings.Replace(tenantTail(t), hashes(t)["alice"], newHash, 1)
	// bob's user goes (his bucket stays).
	tail = strings.Replace(tail, "[[user]]\nname = \"bob\"\npassword_hash = \""+hashes(t)["bob"]+"\"\nbuckets = [\"bob\"]\n", "", 1)
	if strings.Contains(tail, hashes(t)["bob"]) || strings.Contains(tail, hashes(t)["alice"]) {
		t.Fatal("test bug: the new file still has the old hashes")
	}
	cfg, err := bucketcfg.Parse([]byte(testConfig{tail: tail}.render(p.opts.listen, []string{p.MC.Addr}, p.StatePath)))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Reload(cfg); err != nil {
		t.Fatal(err)
	}
	try := func(user, pw string) mc.Status {
		c := dial(t, p.Addr)
		defer c.Close()
		r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00" + user + "\x00" + pw)})
		return status(t, r, err)
	}
	// Successes first: each failure makes the next check from this
	// address wait (the per-source budget).
	if st := try("admin", "admin-pw"); st != mc.StatusSuccess {
		t.Errorf("admin, unchanged: %s", st)
	}
	if st := try("alice", "alice-new"); st != mc.StatusSuccess {
		t.Errorf("alice's new password: %s", st)
	}
	if st := try("alice", "alice-pw"); st != mc.StatusAuthError {
		t.Errorf("alice's old password after the reload: %s, want AuthError", st)
	}
	if st := try("bob", "bob-pw"); st != mc.StatusAuthError {
		t.Errorf("removed bob: %s, want AuthError", st)
	}
}
