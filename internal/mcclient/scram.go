package mcclient

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/xdg-go/scram"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// SASL mechanism names as the memcached binary protocol spells them
// (Couchbase's spelling: no dash between SHA and the size), the names
// SASLMechs returns and AuthSCRAM takes.
const (
	MechPlain       = "PLAIN"
	MechSCRAMSHA256 = "SCRAM-SHA256"
	MechSCRAMSHA512 = "SCRAM-SHA512"
)

// MaxSCRAMIterations is the highest PBKDF2 iteration count AuthSCRAM
// accepts from a server (bucketcfg's own bound): more would let a server
// keep the client busy for minutes.
const MaxSCRAMIterations = 10_000_000

// minSCRAMIterations is the lowest iteration count AuthSCRAM accepts from
// a server (RFC 7677's minimum).
const minSCRAMIterations = 4096

// ErrSCRAMServer is returned (wrapped) by AuthSCRAM when the server's part
// of the exchange is unacceptable: a malformed message, a nonce that does
// not extend the client's, an iteration count out of bounds, or a success
// without the server-final message.
var ErrSCRAMServer = errors.New("the server's SCRAM answer is not acceptable")

// ErrServerSignature is returned (wrapped) by AuthSCRAM when the server
// accepted the proof but its own signature (the server-final message)
// does not verify: the server does not hold the user's credential, so it
// is not the server it claims to be.
var ErrServerSignature = errors.New("the server's SCRAM signature does not verify (it does not hold the user's credential)")

// AuthSCRAM authenticates the connection with SASL SCRAM (RFC 5802, RFC
// 7677): mech is MechSCRAMSHA256 or MechSCRAMSHA512. It sends SASL auth
// (0x21) with key mech and the client-first message, expects AuthContinue
// (0x21) with the server-first message, sends SASL step (0x22) with key
// mech and the client-final message (the proof), expects Success with the
// server-final message, and verifies the server's signature in it. It does
// not list the mechanisms first (SASLMechs does that).
//
// The password never crosses the wire; it is run through PBKDF2 with the
// server's salt and iteration count (milliseconds). A refusal (a wrong
// password, an unknown user, a user without a credential for mech) is a
// *StatusError, 0x20 AuthError at the AUTH or the STEP; an unacceptable
// server message wraps ErrSCRAMServer, a signature that does not verify
// ErrServerSignature; other errors are the connection's. The password
// appears in no error. An unknown mech is an error before anything is
// sent.
func (c *Client) AuthSCRAM(mech, user, password string) error {
	var f scram.HashGeneratorFcn
	switch mech {
	case MechSCRAMSHA256:
		f = scram.SHA256
	case MechSCRAMSHA512:
		f = scram.SHA512
	default:
		return fmt.Errorf("unknown SCRAM mechanism %q (want %s or %s)", mech, MechSCRAMSHA256, MechSCRAMSHA512)
	}
	cl, err := f.NewClient(user, password, "")
	if err != nil {
		// SASLprep refused the user name or the password; its error
		// names neither.
		return fmt.Errorf("%s: cannot prepare the credentials: %w", mech, err)
	}
	conv := cl.WithMinIterations(minSCRAMIterations).NewConversation()
	first, err := conv.Step("")
	if err != nil {
		return fmt.Errorf("%s: client-first message: %w", mech, err)
	}
	resp, err := c.Do(Request{Opcode: mc.OpSASLAuth, Key: []byte(mech), Value: []byte(first)})
	if err != nil {
		return err
	}
	switch resp.Status() {
	case mc.StatusAuthContinue:
	case mc.StatusSuccess:
		return fmt.Errorf("%w: %s: success without a proof", ErrSCRAMServer, mech)
	default:
		return resp.Err()
	}
	serverFirst := string(resp.Value)
	if err := checkIterations(serverFirst); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrSCRAMServer, mech, err)
	}
	final, err := conv.Step(serverFirst)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrSCRAMServer, mech, err)
	}
	resp, err = c.Do(Request{Opcode: mc.OpSASLStep, Key: []byte(mech), Value: []byte(final)})
	if err != nil {
		return err
	}
	if err := resp.Err(); err != nil {
		return err
	}
	if len(resp.Value) == 0 {
		return fmt.Errorf("%w: %s: success without the server-final message", ErrSCRAMServer, mech)
	}
	if _, err := conv.Step(string(resp.Value)); err != nil || !conv.Valid() {
		return fmt.Errorf("%w: %s", ErrServerSignature, mech)
	}
	return nil
}

// checkIterations refuses a server-first message whose iteration count
// ("i=") is above MaxSCRAMIterations; the SCRAM client checks the rest.
func checkIterations(serverFirst string) error {
	for _, attr := range strings.Split(serverFirst, ",") {
		v, ok := strings.CutPrefix(attr, "i=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return errors.New("malformed iteration count")
		}
		if n > MaxSCRAMIterations {
			return fmt.Errorf("the server asks for %d iterations, more than %d", n, MaxSCRAMIterations)
		}
	}
	return nil
}
