package text

import (
	"bytes"
	"errors"
	"strconv"
)

// Reply lines of the classic commands, with their "\r\n", as memcached
// sends them. Append them with append(dst, End...).
const (
	End       = "END\r\n"
	Stored    = "STORED\r\n"
	NotStored = "NOT_STORED\r\n"
	Exists    = "EXISTS\r\n"
	NotFound  = "NOT_FOUND\r\n"
	Deleted   = "DELETED\r\n"
	Touched   = "TOUCHED\r\n"
	OK        = "OK\r\n"
	Reset     = "RESET\r\n"
	ErrorLine = "ERROR\r\n"
	MetaNoop  = "MN\r\n"
)

// AppendValue appends one item of a get or gat reply:
// "VALUE <key> <flags> <bytes>\r\n<data>\r\n". AppendValueCAS is the form
// of gets and gats.
func AppendValue(dst, key []byte, flags uint32, data []byte) []byte {
	dst = appendValueHead(dst, key, flags, len(data))
	dst = append(dst, "\r\n"...)
	dst = append(dst, data...)
	return append(dst, "\r\n"...)
}

// AppendValueCAS appends one item of a gets or gats reply:
// "VALUE <key> <flags> <bytes> <cas>\r\n<data>\r\n".
func AppendValueCAS(dst, key []byte, flags uint32, data []byte, cas uint64) []byte {
	dst = appendValueHead(dst, key, flags, len(data))
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, cas, 10)
	dst = append(dst, "\r\n"...)
	dst = append(dst, data...)
	return append(dst, "\r\n"...)
}

func appendValueHead(dst, key []byte, flags uint32, n int) []byte {
	dst = append(dst, "VALUE "...)
	dst = append(dst, key...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, uint64(flags), 10)
	dst = append(dst, ' ')
	return strconv.AppendUint(dst, uint64(n), 10)
}

// AppendNumber appends incr's or decr's reply: the new value and "\r\n".
func AppendNumber(dst []byte, v uint64) []byte {
	dst = strconv.AppendUint(dst, v, 10)
	return append(dst, "\r\n"...)
}

// AppendVersion appends "VERSION <version>\r\n".
func AppendVersion(dst []byte, version string) []byte {
	dst = append(dst, "VERSION "...)
	dst = append(dst, version...)
	return append(dst, "\r\n"...)
}

// AppendStat appends one line of a stats reply, "STAT <name> <value>\r\n";
// the reply ends with End.
func AppendStat(dst []byte, name string, value []byte) []byte {
	dst = append(dst, "STAT "...)
	dst = append(dst, name...)
	dst = append(dst, ' ')
	dst = append(dst, value...)
	return append(dst, "\r\n"...)
}

// AppendStatUint is AppendStat for a number.
func AppendStatUint(dst []byte, name string, v uint64) []byte {
	dst = append(dst, "STAT "...)
	dst = append(dst, name...)
	dst = append(dst, ' ')
	dst = strconv.AppendUint(dst, v, 10)
	return append(dst, "\r\n"...)
}

// AppendClientError appends "CLIENT_ERROR <msg>\r\n".
func AppendClientError(dst []byte, msg string) []byte {
	dst = append(dst, "CLIENT_ERROR "...)
	dst = append(dst, msg...)
	return append(dst, "\r\n"...)
}

// AppendServerError appends "SERVER_ERROR <msg>\r\n".
func AppendServerError(dst []byte, msg string) []byte {
	dst = append(dst, "SERVER_ERROR "...)
	dst = append(dst, msg...)
	return append(dst, "\r\n"...)
}

// Meta reply codes.
const (
	MetaHD = "HD" // success, no value
	MetaVA = "VA" // success, a value follows
	MetaEN = "EN" // miss (mg)
	MetaNF = "NF" // not found (md, ma, ms with mode)
	MetaNS = "NS" // not stored (ms)
	MetaEX = "EX" // CAS mismatch
	MetaMN = "MN" // mn's reply
	MetaME = "ME" // me's reply
)

// AppendMeta appends a meta reply line without a value: code (MetaHD,
// MetaEN, ...), then each flag as " <letter><token>", then "\r\n"; for
// example "HD O123 c5 kfoo\r\n".
func AppendMeta(dst []byte, code string, flags []MetaFlag) []byte {
	dst = append(dst, code...)
	dst = appendMetaFlags(dst, flags)
	return append(dst, "\r\n"...)
}

// AppendMetaValue appends a meta VA reply: "VA <len(data)>", the flags,
// "\r\n", data and "\r\n"; for example "VA 5 f0 s5\r\nhello\r\n".
func AppendMetaValue(dst []byte, flags []MetaFlag, data []byte) []byte {
	dst = append(dst, "VA "...)
	dst = strconv.AppendUint(dst, uint64(len(data)), 10)
	dst = appendMetaFlags(dst, flags)
	dst = append(dst, "\r\n"...)
	dst = append(dst, data...)
	return append(dst, "\r\n"...)
}

func appendMetaFlags(dst []byte, flags []MetaFlag) []byte {
	for _, f := range flags {
		dst = append(dst, ' ', f.Flag)
		dst = append(dst, f.Token...)
	}
	return dst
}

// AppendCommand appends c as a command line (and data block) that Parse
// reads back into the same command, and returns the extended slice. It is
// canonical: single spaces, "\r\n", numbers in decimal. c must be a
// command Parse accepted (KindNone appends nothing).
func AppendCommand(dst []byte, c *Command) []byte {
	k := c.Kind
	switch {
	case k == KindNone:
		return dst
	case k == KindAdmin:
		for i, a := range c.Args {
			if i > 0 {
				dst = append(dst, ' ')
			}
			dst = append(dst, a...)
		}
		return append(dst, "\r\n"...)
	}
	dst = append(dst, k.String()...)
	switch {
	case k.IsMultiGet():
		if k == KindGat || k == KindGats {
			dst = append(dst, ' ')
			dst = strconv.AppendInt(dst, int64(c.Exptime), 10)
		}
		for _, key := range c.Keys {
			dst = append(dst, ' ')
			dst = append(dst, key...)
		}
	case k == KindMetaSet:
		dst = append(dst, ' ')
		dst = append(dst, c.Key...)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(len(c.Value)), 10)
		dst = appendMetaFlags(dst, c.Meta)
		dst = append(dst, "\r\n"...)
		dst = append(dst, c.Value...)
	case k.IsStorage():
		dst = append(dst, ' ')
		dst = append(dst, c.Key...)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(c.Flags), 10)
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, int64(c.Exptime), 10)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(len(c.Value)), 10)
		if k == KindCas {
			dst = append(dst, ' ')
			dst = strconv.AppendUint(dst, c.CAS, 10)
		}
		dst = appendNoreply(dst, c)
		dst = append(dst, "\r\n"...)
		dst = append(dst, c.Value...)
	case k == KindMetaNoop:
	case k.IsMeta():
		dst = append(dst, ' ')
		dst = append(dst, c.Key...)
		dst = appendMetaFlags(dst, c.Meta)
	case k == KindIncr || k == KindDecr:
		dst = append(dst, ' ')
		dst = append(dst, c.Key...)
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, c.Delta, 10)
		dst = appendNoreply(dst, c)
	case k == KindTouch:
		dst = append(dst, ' ')
		dst = append(dst, c.Key...)
		dst = append(dst, ' ')
		dst = strconv.AppendInt(dst, int64(c.Exptime), 10)
		dst = appendNoreply(dst, c)
	case k == KindDelete:
		dst = append(dst, ' ')
		dst = append(dst, c.Key...)
		dst = appendNoreply(dst, c)
	case k == KindFlushAll:
		if c.HasDelay {
			dst = append(dst, ' ')
			dst = strconv.AppendInt(dst, int64(c.Exptime), 10)
		}
		dst = appendNoreply(dst, c)
	case k == KindVerbosity:
		dst = append(dst, ' ')
		dst = strconv.AppendUint(dst, uint64(c.Level), 10)
		dst = appendNoreply(dst, c)
	case k == KindStats:
		for _, a := range c.Args {
			dst = append(dst, ' ')
			dst = append(dst, a...)
		}
	}
	return append(dst, "\r\n"...)
}

func appendNoreply(dst []byte, c *Command) []byte {
	if c.NoReply {
		dst = append(dst, " noreply"...)
	}
	return dst
}

// MetaResponse is one reply of memcached to a meta command, as
// ParseMetaResponse reads it. Its byte slices alias the parsed buffer; Flags
// keeps its capacity across calls.
type MetaResponse struct {
	// Code is the reply's first word: a meta code (MetaHD, MetaVA, ...)
	// or, for other lines, their first word ("ERROR", "CLIENT_ERROR",
	// "SERVER_ERROR").
	Code []byte
	// Flags are the returned flags of HD, VA, EN, NF, NS, EX (for VA, those
	// after the size), each a letter and its token; empty for other codes.
	Flags []MetaFlag
	// Value is VA's data, without its "\r\n".
	Value []byte
	// Line is the first line without its "\r\n".
	Line []byte
	// KeyStart and KeyEnd locate the key the reply echoes in Line: the k
	// flag's token, or ME's key; -1 when there is none.
	KeyStart, KeyEnd int
	// Need is set when ParseMetaResponse returns 0 for a VA whose line
	// has arrived but not all of its data: the whole reply's length in
	// bytes, so the caller can wait for that much. It is 0 otherwise.
	Need int
}

// IsMetaCode reports whether code is one of the meta reply codes whose
// line carries flags (HD VA EN NF NS EX).
func IsMetaCode(code []byte) bool {
	switch string(code) {
	case MetaHD, MetaVA, MetaEN, MetaNF, MetaNS, MetaEX:
		return true
	}
	return false
}

// Flag returns the token of r's first flag f and whether r has it.
func (r *MetaResponse) Flag(f byte) ([]byte, bool) {
	for _, m := range r.Flags {
		if m.Flag == f {
			return m.Token, true
		}
	}
	return nil, false
}

// ErrBadResponse is returned by ParseMetaResponse for a reply memcached
// does not send: a VA without a valid size, or a data block not ending in
// "\r\n". The stream cannot be resynchronised after it.
var ErrBadResponse = errors.New("text: malformed meta reply")

// ParseMetaResponse reads the meta reply at the start of buf (from
// memcached) into r and returns its length in bytes, the data block of VA
// included. n == 0 and a nil error: buf holds no whole reply yet (r.Need
// says how much a VA needs). Lines may end in "\r\n" or "\n". It
// allocates nothing once r.Flags has grown. It is ParseMetaReply with no
// raw key expected: every token ends at a space or the line's end.
func ParseMetaResponse(buf []byte, r *MetaResponse) (n int, err error) {
	return ParseMetaReply(buf, 0, r)
}

// ParseMetaReply is ParseMetaResponse for the reply to a command whose key
// memcached may echo raw and rawKeyLen bytes long: the k flag's token, or
// ME's key, is taken as exactly rawKeyLen bytes when a space or the line's
// end follows them, whatever they hold. memcached echoes an item's key as
// it was stored, in base64 (with a b flag) only when it was stored with
// one, so the echo of a key stored through the binary protocol, asked for
// with a base64 key, may hold spaces or line ends; a base64 echo of the
// same key is longer, so the two cannot be confused. rawKeyLen 0 expects
// no such key. r.KeyStart and r.KeyEnd locate the echoed key in r.Line.
//
// A proxy rewriting a returned key re-encodes r after replacing the k
// flag's token (base64 when the b flag is among r.Flags).
func ParseMetaReply(buf []byte, rawKeyLen int, r *MetaResponse) (n int, err error) {
	*r = MetaResponse{Flags: r.Flags[:0], KeyStart: -1, KeyEnd: -1}
	p := 0
	for p < len(buf) && buf[p] != ' ' && buf[p] != '\n' {
		p++
	}
	if p == len(buf) {
		return 0, nil
	}
	code := buf[:p]
	if len(code) > 0 && code[len(code)-1] == '\r' && buf[p] == '\n' {
		code = code[:len(code)-1]
	}
	meta := IsMetaCode(code)
	me := string(code) == "ME"
	if !meta && !me {
		// Any other line (MN, errors): up to its end.
		nl := bytes.IndexByte(buf[p:], '\n')
		if nl < 0 {
			return 0, nil
		}
		return r.finishLine(buf, p+nl, code)
	}
	size := -1
	first := true // VA's size, ME's key
	for buf[p] == ' ' {
		p++ // the space before a token
		start := p
		switch {
		case me && first:
			p = tokenEnd(buf, p, rawKeyLen)
			r.KeyStart, r.KeyEnd = start, p
		case first && string(code) == MetaVA:
			p = tokenEnd(buf, p, 0)
			v, ok := parseUint64(buf[start:p])
			if !ok || p == start || buf[start] < '0' || buf[start] > '9' || v > 1<<31 {
				if p == len(buf) {
					return 0, nil
				}
				return 0, ErrBadResponse
			}
			size = int(v)
		case meta && p < len(buf) && buf[p] == 'k':
			p = tokenEnd(buf, p+1, rawKeyLen)
			r.KeyStart, r.KeyEnd = start+1, p
			r.Flags = append(r.Flags, MetaFlag{Flag: 'k', Token: buf[start+1 : p]})
		default:
			p = tokenEnd(buf, p, 0)
			if meta && p > start {
				r.Flags = append(r.Flags, MetaFlag{Flag: buf[start], Token: buf[start+1 : p]})
			}
		}
		if p == len(buf) {
			return 0, nil
		}
		first = false
	}
	// buf[p] ends the line: "\n", or "\r" before it.
	if buf[p] == '\r' {
		if p+1 == len(buf) {
			return 0, nil
		}
		if buf[p+1] != '\n' {
			return 0, ErrBadResponse
		}
		p++
	}
	if buf[p] != '\n' {
		return 0, ErrBadResponse
	}
	if size < 0 && string(code) == MetaVA {
		return 0, ErrBadResponse
	}
	n, _ = r.finishLine(buf, p, code)
	if size >= 0 {
		end := n + size + 2
		if len(buf) < end {
			r.Need = end
			return 0, nil
		}
		if buf[end-2] != '\r' || buf[end-1] != '\n' {
			return 0, ErrBadResponse
		}
		r.Value = buf[n : n+size]
		n = end
	}
	return n, nil
}

// finishLine sets r.Line and r.Code for a line whose "\n" is buf[nl] and
// returns the line's length with its "\n".
func (r *MetaResponse) finishLine(buf []byte, nl int, code []byte) (int, error) {
	line := buf[:nl]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	r.Line, r.Code = line, code
	if r.KeyEnd > len(line) {
		r.KeyStart, r.KeyEnd = -1, -1
	}
	return nl + 1, nil
}

// tokenEnd returns where the token starting at buf[p] ends: after exactly
// rawLen bytes when a space or line end follows them (rawLen > 0; a
// longer token, a base64 echo, otherwise), else at the next space, "\r"
// or "\n"; len(buf) when that has not arrived.
func tokenEnd(buf []byte, p, rawLen int) int {
	if rawLen > 0 {
		if p+rawLen >= len(buf) {
			return len(buf) // cannot tell yet: wait for more
		}
		if c := buf[p+rawLen]; c == ' ' || c == '\r' || c == '\n' {
			return p + rawLen
		}
	}
	for p < len(buf) && buf[p] != ' ' && buf[p] != '\r' && buf[p] != '\n' {
		p++
	}
	return p
}
