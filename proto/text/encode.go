package text

import (
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
// included. n == 0 and a nil error: buf holds no whole reply yet. Lines may
// end in "\r\n" or "\n". It allocates nothing once r.Flags has grown.
//
// A proxy rewriting a returned key re-encodes r with AppendMeta or
// AppendMetaValue after replacing the k flag's token (base64 when the b
// flag is among r.Flags).
func ParseMetaResponse(buf []byte, r *MetaResponse) (n int, err error) {
	*r = MetaResponse{Flags: r.Flags[:0]}
	nl := -1
	for i, b := range buf {
		if b == '\n' {
			nl = i
			break
		}
	}
	if nl < 0 {
		return 0, nil
	}
	n = nl + 1
	line := buf[:nl]
	if len(line) > 0 && line[len(line)-1] == '\r' {
		line = line[:len(line)-1]
	}
	r.Line = line
	i := 0
	for i < len(line) && line[i] != ' ' {
		i++
	}
	r.Code = line[:i]
	if !IsMetaCode(r.Code) {
		return n, nil
	}
	rest := line[i:]
	size := -1
	if string(r.Code) == MetaVA {
		rest = skipSpaces(rest)
		j := 0
		for j < len(rest) && rest[j] != ' ' {
			j++
		}
		v, ok := parseUint64(rest[:j])
		if !ok || j == 0 || rest[0] < '0' || rest[0] > '9' || v > 1<<31 {
			return 0, ErrBadResponse
		}
		size = int(v)
		rest = rest[j:]
	}
	for {
		rest = skipSpaces(rest)
		if len(rest) == 0 {
			break
		}
		j := 0
		for j < len(rest) && rest[j] != ' ' {
			j++
		}
		r.Flags = append(r.Flags, MetaFlag{Flag: rest[0], Token: rest[1:j]})
		rest = rest[j:]
	}
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

func skipSpaces(b []byte) []byte {
	for len(b) > 0 && b[0] == ' ' {
		b = b[1:]
	}
	return b
}
