package mcclient

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/xdg-go/scram"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// saslHandler answers one SASL request of the fake server.
type saslHandler func(op mc.Opcode, key, value string) (mc.Status, string)

// fakeSASL serves h on one end of a pipe and returns a Client on the
// other; the server stops when the test ends.
func fakeSASL(t *testing.T, h saslHandler) *Client {
	t.Helper()
	cli, srv := net.Pipe()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r := bufio.NewReader(srv)
		for {
			var hb [mc.HeaderLen]byte
			if _, err := io.ReadFull(r, hb[:]); err != nil {
				return
			}
			hdr, _ := mc.ParseHeader(hb[:])
			body := make([]byte, hdr.BodyLen)
			if _, err := io.ReadFull(r, body); err != nil {
				return
			}
			key := string(body[hdr.ExtLen : int(hdr.ExtLen)+int(hdr.KeyLen)])
			st, v := h(hdr.Opcode, key, string(body[int(hdr.ExtLen)+int(hdr.KeyLen):]))
			if _, err := srv.Write(mc.AppendResponse(nil, &hdr, st, nil, nil, []byte(v))); err != nil {
				return
			}
		}
	}()
	c := New(cli)
	t.Cleanup(func() {
		c.Close()
		srv.Close()
		wg.Wait()
	})
	return c
}

// scramServer is a SCRAM server knowing user "op" with password pw for
// hash f; tamper alters the ServerKey it holds (it still checks proofs,
// but cannot sign for the user). steps counts the SASL STEPs received.
func scramServer(t *testing.T, f scram.HashGeneratorFcn, mech, pw string, tamper bool, steps *int) saslHandler {
	t.Helper()
	kc, err := f.NewClient("", pw, "")
	if err != nil {
		t.Fatal(err)
	}
	cred, err := kc.GetStoredCredentialsWithError(scram.KeyFactors{Salt: "0123456789abcdef", Iters: 4096})
	if err != nil {
		t.Fatal(err)
	}
	if tamper {
		cred.ServerKey = append([]byte(nil), cred.ServerKey...)
		cred.ServerKey[0] ^= 1
	}
	srv, err := f.NewServer(func(name string) (scram.StoredCredentials, error) {
		if name != "op" {
			return scram.StoredCredentials{}, errors.New("unknown user")
		}
		return cred, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var conv *scram.ServerConversation
	return func(op mc.Opcode, key, value string) (mc.Status, string) {
		if key != mech {
			return mc.StatusAuthError, "wrong mechanism " + key
		}
		switch op {
		case mc.OpSASLAuth:
			conv = srv.NewConversation()
			first, err := conv.Step(value)
			if err != nil {
				return mc.StatusAuthError, "bad client-first"
			}
			return mc.StatusAuthContinue, first
		case mc.OpSASLStep:
			*steps++
			final, err := conv.Step(value)
			if err != nil || !conv.Valid() {
				return mc.StatusAuthError, "authentication failed"
			}
			return mc.StatusSuccess, final
		}
		return mc.StatusUnknownCommand, ""
	}
}

// TestAuthSCRAM: both mechanisms log in and verify the server; a wrong
// password is the server's AuthError, without the password in it; a
// server that accepts the proof but cannot sign for the user is caught;
// a server asking for absurd iterations is refused before any proof is
// computed or sent.
func TestAuthSCRAM(t *testing.T) {
	const pw = "correct horse"
	for _, tc := range []struct {
		mech string
		f    scram.HashGeneratorFcn
	}{{MechSCRAMSHA256, scram.SHA256}, {MechSCRAMSHA512, scram.SHA512}} {
		t.Run(tc.mech, func(t *testing.T) {
			var steps int
			if err := fakeSASL(t, scramServer(t, tc.f, tc.mech, pw, false, &steps)).AuthSCRAM(tc.mech, "op", pw); err != nil || steps != 1 {
				t.Fatalf("login: %v after %d steps", err, steps)
			}

			err := fakeSASL(t, scramServer(t, tc.f, tc.mech, pw, false, &steps)).AuthSCRAM(tc.mech, "op", "wrong horse")
			var se *StatusError
			if !errors.As(err, &se) || se.Status != mc.StatusAuthError || se.Op != mc.OpSASLStep {
				t.Fatalf("wrong password: %v, want AuthError at the STEP", err)
			}
			if strings.Contains(err.Error(), "horse") {
				t.Fatalf("the error shows the password: %q", err)
			}

			err = fakeSASL(t, scramServer(t, tc.f, tc.mech, pw, true, &steps)).AuthSCRAM(tc.mech, "op", pw)
			if !errors.Is(err, ErrServerSignature) || strings.Contains(err.Error(), "horse") {
				t.Fatalf("impostor server: %v, want ErrServerSignature", err)
			}
		})
	}

	steps := 0
	greedy := func(op mc.Opcode, key, value string) (mc.Status, string) {
		if op == mc.OpSASLStep {
			steps++
			return mc.StatusSuccess, ""
		}
		_, nonce, _ := strings.Cut(value, ",r=")
		return mc.StatusAuthContinue, "r=" + nonce + "srv,s=MDEyMzQ1Njc4OWFiY2RlZg==,i=2000000000"
	}
	if err := fakeSASL(t, greedy).AuthSCRAM(MechSCRAMSHA512, "op", pw); !errors.Is(err, ErrSCRAMServer) || steps != 0 {
		t.Fatalf("2e9 iterations: %v after %d steps, want ErrSCRAMServer and no STEP", err, steps)
	}
	if err := fakeSASL(t, greedy).AuthSCRAM("SCRAM-MD5", "op", pw); err == nil || steps != 0 {
		t.Fatalf("unknown mechanism: %v", err)
	}
}
