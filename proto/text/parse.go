package text

import (
	"bytes"
)

// MaxKeyLen is the longest key memcached accepts, in bytes. For a meta
// command with the b flag it bounds the key as sent (base64), not decoded.
const MaxKeyLen = 250

// MaxLineLen is how many bytes memcached buffers without finding a "\n"
// before it gives up on a command line and closes the connection without a
// reply; lines starting with "get " or "gets " are exempt (a multi-get line
// has no bound in memcached). A line whose "\n" has arrived is read whatever
// its length, up to ReadBufferLen.
const MaxLineLen = 2048

// ReadBufferLen is memcached's read buffer, in bytes: a command line
// longer than this, "\n" included, can never be whole in it, so memcached
// always closes the connection on one (without a reply), get and gets
// lines excepted. A line between MaxLineLen and ReadBufferLen is closed or
// answered depending on how its bytes arrive; Parse answers it, as
// memcached does when the line arrives in one piece.
const ReadBufferLen = 16384

// maxTokens is memcached's MAX_TOKENS: a line is split into at most
// maxTokens-1 tokens (the last slot is the terminal token) and the rest is
// left for the multi-get commands to split again.
const maxTokens = 24

// maxMetaTokens is memcached's MFLAG_MAX_OPT_LENGTH: a meta command with
// more tokens than this (counting the terminal token) is refused.
const maxMetaTokens = 20

// MaxOpaqueLen is the longest O (opaque) flag memcached accepts, in bytes,
// counting the letter O.
const MaxOpaqueLen = 32

// Parse reads the command at the start of buf into c and returns its length
// in bytes: the command line with its "\n" and, for a storage command, its
// data block and "\r\n".
//
// It returns n == 0 and a nil error while buf holds no whole command. It
// returns a *Error (pointing into c) when memcached would refuse the
// command; n is then the bytes memcached consumes with it, and the error
// says what memcached sends, whether it discards further bytes and whether
// it closes the connection. After a refusal that does not close, the next
// command starts at buf[n+Swallow:].
//
// maxValue bounds a data block in bytes; a longer one is refused with
// memcached's "SERVER_ERROR object too large for cache" (memcached's own
// bound is its item size, -I). maxValue also bounds a multi-get line still
// waiting for its "\n" (Error.Limit). maxValue <= 0 means no bound.
//
// Parse allocates nothing once c's slices have grown; c's fields alias buf.
func Parse(buf []byte, maxValue int, c *Command) (n int, err error) {
	c.reset()
	nl := bytes.IndexByte(buf, '\n')
	if nl < 0 {
		if len(buf) <= MaxLineLen {
			return 0, nil
		}
		if !isGetLine(buf) {
			return 0, c.fail(Error{Close: true})
		}
		if maxValue > 0 && len(buf) > maxValue {
			return 0, c.fail(Error{Close: true, Limit: true})
		}
		return 0, nil
	}
	n = nl + 1
	if n > ReadBufferLen && !isGetLine(buf) {
		return 0, c.fail(Error{Close: true})
	}
	line := buf[:nl]
	if nl > 1 && line[nl-1] == '\r' {
		line = line[:nl-1]
	}
	if z := bytes.IndexByte(line, 0); z >= 0 {
		line = line[:z]
	}
	c.Line = line
	return c.dispatch(buf, n, maxValue)
}

// isGetLine reports whether memcached reads the line starting buf
// whatever its length: a get or gets, after at most leadingSpaceLimit
// spaces.
func isGetLine(buf []byte) bool {
	p := 0
	for p < len(buf) && buf[p] == ' ' {
		p++
	}
	return p <= leadingSpaceLimit && (bytes.HasPrefix(buf[p:], []byte("get ")) || bytes.HasPrefix(buf[p:], []byte("gets ")))
}

// tokenize splits s as memcached's tokenize_command does into c.toks and
// returns ntokens in memcached's sense (real tokens plus the terminal one)
// and the unsplit rest of s (nil when all of s was split).
func (c *Command) tokenize(s []byte) (nt int, rest []byte) { return tokenize(&c.toks, s) }

// tokenize splits s at spaces into toks, at most maxTokens-1 tokens, and
// returns ntokens in memcached's sense (real tokens plus the terminal one)
// and the unsplit rest of s (nil when all of s was split).
func tokenize(toks *[maxTokens][]byte, s []byte) (nt int, rest []byte) {
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] != ' ' {
			continue
		}
		if i > start {
			toks[nt] = s[start:i]
			nt++
			if nt == maxTokens-1 {
				if i+1 < len(s) {
					rest = s[i+1:]
				}
				toks[nt] = nil
				return nt + 1, rest
			}
		}
		start = i + 1
	}
	if start < len(s) {
		toks[nt] = s[start:]
		nt++
	}
	toks[nt] = nil
	return nt + 1, nil
}

// dispatch finds the command the line names in the table (commands.go)
// and has its syntax read the line. memcached (process_command_ascii)
// picks a command by its first letter before it compares names, so a name
// it does not know that starts with one of those letters is an ERROR
// (firstLetterCaught); only other unknown names are checked for an HTTP
// request line, which memcached closes the connection on without a word.
func (c *Command) dispatch(buf []byte, n, maxValue int) (int, error) {
	nt, rest := c.tokenize(c.Line)
	t := &c.toks
	if nt < 2 || len(t[0]) < 2 {
		return n, c.fail(Error{Line: msgError})
	}
	v := lookup(t[0])
	if v == nil {
		if !firstLetterCaught(t[0]) && bytes.HasPrefix(t[nt-2], []byte("HTTP/")) {
			return n, c.fail(Error{Close: true})
		}
		return n, c.fail(Error{Line: msgError})
	}
	c.Verb = v
	if args := nt - 2; args < int(v.minArgs) || v.maxArgs > 0 && args > int(v.maxArgs) {
		return n, c.fail(Error{Line: msgError})
	}
	switch v.syntax {
	case synRetrieval:
		return c.get(n, nt, rest, v.Kind)
	case synUpdate:
		return c.update(buf, n, nt, maxValue, v.Kind)
	case synArithmetic:
		return c.arithmetic(n, nt, v.Kind)
	case synDelete:
		return c.delete(n, nt)
	case synTouch:
		return c.touch(n, nt)
	case synFlushAll:
		return c.flushAll(n, nt)
	case synVerbosity:
		return c.verbosity(n, nt)
	case synStats:
		c.Kind = KindStats
		c.Args = append(c.Args, t[1:nt-1]...)
		return n, nil
	case synAdmin:
		return c.admin(n, nt, v)
	case synMetaGet:
		return c.metaGet(n, nt)
	case synMetaSet:
		return c.metaSet(buf, n, nt, maxValue)
	case synMetaDelete:
		return c.metaDelete(n, nt)
	case synMetaArithmetic:
		return c.metaArithmetic(n, nt)
	case synMetaDebug:
		return c.metaDebug(n, nt)
	}
	c.Kind = v.Kind // synBare, synMetaNoop: nothing more to read
	return n, nil
}

// firstLetterCaught reports whether memcached's dispatch answers an
// unknown command name ERROR within the branch of its first letter: g s a
// c i d t, and m for a two-letter name (the meta commands).
func firstLetterCaught(name []byte) bool {
	if name[0] == 'm' {
		return len(name) == 2
	}
	return bytes.IndexByte([]byte("gsacidt"), name[0]) >= 0
}
