package text

import "bytes"

// Replies to memcached's text authentication (memcached -Y), with "\r\n".
const (
	AuthStored  = "STORED\r\n"
	AuthFailure = "CLIENT_ERROR authentication failure\r\n"
)

// memcached's refusals of an authentication attempt.
const (
	msgUnauthenticated = "CLIENT_ERROR unauthenticated"
	msgAuthTermination = "CLIENT_ERROR bad command line termination"
	msgAuthFormat      = "CLIENT_ERROR bad authentication token format"
)

// Auth is a text authentication attempt: the first command of a connection
// to a memcached that requires authentication, `set <any key> <any flags>
// <any exptime> <n>` (anything after the length ignored, noreply included)
// with a data block of n bytes holding `<user> <password>`. User and
// Password alias the buffer given to ParseAuth.
type Auth struct {
	User, Password []byte
	// Need is as Command.Need: when ParseAuth returns 0 and a nil error
	// after the line has arrived, the length in bytes of the whole attempt.
	Need int

	err  Error
	toks [maxTokens][]byte
}

// ParseAuth reads an authentication attempt at the start of buf as
// memcached does while a connection is unauthenticated, and returns its
// length in bytes. n == 0 and a nil error: buf holds no whole attempt yet.
// A *Error (pointing into a) is memcached's refusal: "CLIENT_ERROR
// unauthenticated" for a line that is no such set (any other command),
// "CLIENT_ERROR bad command line termination" for a data block not ending
// in "\r\n", "CLIENT_ERROR bad authentication token format" for a block
// with fewer than two words; the connection stays unauthenticated and the
// next bytes are another attempt. A line without "\n" within MaxLineLen
// bytes closes the connection without a reply, whatever it starts with.
//
// With no error, the caller checks User and Password and answers
// AuthStored (the connection is authenticated; Parse reads what follows) or
// AuthFailure (it stays unauthenticated).
//
// maxValue bounds the data block (Error.Limit, closing; memcached would
// wait for it); maxValue <= 0 means no bound.
//
// memcached 1.6.18 keeps a single reply while a connection is
// unauthenticated and overwrites it with each attempt's: of attempts it
// reads in one batch (pipelined), only the last is answered. A client that
// waits for each answer, as clients do, sees every one.
func ParseAuth(buf []byte, maxValue int, a *Auth) (n int, err error) {
	a.User, a.Password, a.Need = nil, nil, 0
	nl := bytes.IndexByte(buf, '\n')
	if nl < 0 {
		if len(buf) > MaxLineLen {
			a.err = Error{Close: true}
			return 0, &a.err
		}
		return 0, nil
	}
	n = nl + 1
	// memcached leaves the "\r" in: the length's parse stops at it.
	line := buf[:nl]
	if z := bytes.IndexByte(line, 0); z >= 0 {
		line = line[:z]
	}
	nt, _ := tokenize(&a.toks, line)
	var size uint32
	ok := nt >= 6 && string(a.toks[0]) == "set"
	if ok {
		size, ok = parseUint32(a.toks[4])
	}
	if !ok {
		a.err = Error{Line: msgUnauthenticated}
		return n, &a.err
	}
	if size > 1<<32-3 || maxValue > 0 && int64(size) > int64(maxValue) {
		a.err = Error{Close: true, Limit: true}
		return 0, &a.err
	}
	end := n + int(size) + 2
	if len(buf) < end {
		a.Need = end
		return 0, nil
	}
	if buf[end-2] != '\r' || buf[end-1] != '\n' {
		a.err = Error{Line: msgAuthTermination}
		return end, &a.err
	}
	payload := buf[n : end-2]
	if z := bytes.IndexByte(payload, 0); z >= 0 {
		payload = payload[:z]
	}
	if nt, _ = tokenize(&a.toks, payload); nt < 3 {
		a.err = Error{Line: msgAuthFormat}
		return end, &a.err
	}
	a.User, a.Password = a.toks[0], a.toks[1]
	return end, nil
}
