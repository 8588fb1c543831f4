package proxy

import (
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A command answered by work off the event loop (offloop.go) holds back
// the commands pipelined behind it until it is answered, so they see its
// effects: a SelectBucket sent right behind a SASL AUTH whose password is
// being checked runs as the new user, a STAT behind an admin change shows
// the change.
func TestOffLoopHoldsLaterCommands(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t)})

	c := dial(t, p.Addr) // the password is not cached yet: bcrypt, off the loop
	c.Send(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00alice\x00alice-pw")})
	c.Send(mcclient.Request{Opcode: mc.OpSelectBucket, Key: []byte("alice")})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, what := range []string{"SASL AUTH", "SelectBucket alice behind it"} {
		if r, err := c.Read(); status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("%s: %s %q", what, r.Status(), r.Value)
		}
	}

	a := login(t, p.Addr, "admin")
	a.Send(mcclient.Request{Opcode: mc.OpSetBucketThrottleProperties, Key: []byte("bob"), Value: []byte(`{"reserved":0,"hard_limit":1234}`)})
	a.Send(mcclient.Request{Opcode: mc.OpStat, Key: []byte("throttle")})
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if r, err := a.Read(); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("SetBucketThrottleProperties: %s %q", r.Status(), r.Value)
	}
	limit := ""
	for {
		r, err := a.Read()
		if status(t, r, err) != mc.StatusSuccess {
			t.Fatalf("STAT throttle: %s %q", r.Status(), r.Value)
		}
		if len(r.Key) == 0 {
			break
		}
		if string(r.Key) == "bucket:bob:hard_limit" {
			limit = string(r.Value)
		}
	}
	if limit != "1234" {
		t.Errorf("STAT behind the admin change: bob's hard_limit %q, want 1234", limit)
	}
}

// Clients that go away while a command of theirs runs off the loop (a
// password check, a refused SASL AUTH waiting out its delay, an admin
// change, a FLUSH) leave nothing behind: every command is accounted for,
// the proxy serves others, and it shuts down (waiting for the work) in
// time (the harness's stop).
func TestOffLoopCallsEndWithTheirConnection(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{tail: tenantTail(t), loops: 1})
	admin, alice := login(t, p.Addr, "admin"), login(t, p.Addr, "alice")

	checking := dial(t, p.Addr) // bob's password is not cached: bcrypt runs
	checking.Send(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00bob\x00bob-pw")})

	delayed := dial(t, p.Addr)
	bad := mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("malformed")}
	if r, err := delayed.Do(bad); status(t, r, err) != mc.StatusAuthError {
		t.Fatalf("first refusal: %s", r.Status())
	}
	delayed.Send(bad) // the second refusal waits 100 ms
	delayed.Send(mcclient.Request{Opcode: mc.OpNoop})

	admin.Send(mcclient.Request{Opcode: mc.OpSetNodeThrottleProperties, Value: []byte(`{"capacity":"unlimited"}`)})
	alice.Send(mcclient.Request{Opcode: mc.OpFlush})

	for _, c := range []*mcclient.Client{checking, delayed, admin, alice} {
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	// A closed session's commands still off the loop count as in flight
	// until their work is back (the refusal's until its timer fires).
	eventually(t, time.Minute, "connections and commands in flight back to 0", func() bool {
		return p.Connections() == 0 && p.inflight() == 0
	})
	c := login(t, p.Addr, "bob")
	if r, err := c.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("SET after: %s", r.Status())
	}
}
