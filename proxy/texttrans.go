package proxy

import (
	be "encoding/binary"
	"strings"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// The text protocol's classic commands, translated to the binary
// commands the proxy forwards (DESIGN.md section 12), and the binary
// answers translated back into memcached's text replies. The text codec
// (to come with proto/text's parser) fills a textCommand per command line
// and sends the requests built here; the reply functions give the bytes a
// text client gets for each answer, byte for byte what memcached would
// send.

// textKind is the text command a request comes from.
type textKind uint8

const (
	tkGet textKind = iota + 1
	tkGets
	tkGat
	tkGats
	tkEnd // the "END" after a retrieval command's keys
	tkSet
	tkAdd
	tkReplace
	tkAppend
	tkPrepend
	tkCas
	tkIncr
	tkDecr
	tkDelete
	tkTouch
	tkFlushAll
	tkVersion
	tkVerbosity
	tkQuit
	tkStats
	tkMetaNoop
	tkAuth    // memcached's text authentication, as SASL PLAIN
	tkCasZero // cas with the value 0, which never matches (see buildTextRequest)
	tkMeta    // mg ms md ma me, forwarded as meta commands (textmeta.go)
)

// textTag is what a text request's reqHead.opaque carries (the text
// protocol has no opaque of its own): the command kind, and whether the
// client asked for no reply.
func textTag(k textKind, noreply bool) uint32 {
	t := uint32(k)
	if noreply {
		t |= 1 << 8
	}
	return t
}

func tagOf(opaque uint32) (k textKind, noreply bool) {
	return textKind(opaque & 0xff), opaque&(1<<8) != 0
}

// textCommand is one parsed text command (one key of it, for retrieval).
type textCommand struct {
	kind    textKind
	key     []byte
	value   []byte // storage commands' data
	flags   uint32 // storage commands' client flags
	exptime uint32 // storage commands, gat/gats, touch; flush_all's delay
	cas     uint64 // cas
	delta   uint64 // incr/decr
	noreply bool
}

// textOps maps a command to its binary opcode, loud and quiet (noreply).
var textOps = [...]struct{ loud, quiet binary.Opcode }{
	tkGet:       {binary.OpGetKQ, binary.OpGetKQ},
	tkGets:      {binary.OpGetKQ, binary.OpGetKQ},
	tkGat:       {binary.OpGATKQ, binary.OpGATKQ},
	tkGats:      {binary.OpGATKQ, binary.OpGATKQ},
	tkEnd:       {binary.OpNoop, binary.OpNoop},
	tkSet:       {binary.OpSet, binary.OpSetQ},
	tkAdd:       {binary.OpAdd, binary.OpAddQ},
	tkReplace:   {binary.OpReplace, binary.OpReplaceQ},
	tkAppend:    {binary.OpAppend, binary.OpAppendQ},
	tkPrepend:   {binary.OpPrepend, binary.OpPrependQ},
	tkCas:       {binary.OpSet, binary.OpSetQ},
	tkIncr:      {binary.OpIncrement, binary.OpIncrementQ},
	tkDecr:      {binary.OpDecrement, binary.OpDecrementQ},
	tkDelete:    {binary.OpDelete, binary.OpDeleteQ},
	tkTouch:     {binary.OpTouch, binary.OpTouch},
	tkFlushAll:  {binary.OpFlush, binary.OpFlushQ},
	tkVersion:   {binary.OpVersion, binary.OpVersion},
	tkVerbosity: {binary.OpVerbosity, binary.OpVerbosity},
	tkQuit:      {binary.OpQuit, binary.OpQuit},
	tkStats:     {binary.OpStat, binary.OpStat},
	tkMetaNoop:  {binary.OpNoop, binary.OpNoop},
	tkAuth:      {binary.OpSASLAuth, binary.OpSASLAuth},
	tkCasZero:   {binary.OpGet, binary.OpGet},
}

// buildTextRequest fills r with c as a binary request whose frame is built
// in buf (reused; returned grown), so that the rest of the proxy sees a
// binary client's command. Retrieval commands are quiet GETKQ/GATKQ (a
// miss answers nothing) followed by tkEnd (a NOOP answered "END").
//
// A cas with the value 0 never stores in the text protocol (no item has
// CAS 0: memcached answers EXISTS, or NOT_FOUND for a missing key), while
// a binary SET with CAS 0 stores unconditionally: it becomes a GET whose
// hit answers EXISTS.
func buildTextRequest(buf []byte, c *textCommand, r *request) []byte {
	if c.kind == tkCas && c.cas == 0 {
		z := textCommand{kind: tkCasZero, key: c.key, noreply: c.noreply}
		c = &z
	}
	ops := textOps[c.kind]
	op := ops.loud
	if c.noreply {
		op = ops.quiet
	}
	var ex [20]byte
	var extras []byte
	switch c.kind {
	case tkSet, tkAdd, tkReplace, tkCas:
		be.BigEndian.PutUint32(ex[0:], c.flags)
		be.BigEndian.PutUint32(ex[4:], c.exptime)
		extras = ex[:8]
	case tkIncr, tkDecr:
		// No initial value and expiry 0xffffffff: a missing key is
		// NOT_FOUND, as in the text protocol.
		be.BigEndian.PutUint64(ex[0:], c.delta)
		be.BigEndian.PutUint64(ex[8:], 0)
		be.BigEndian.PutUint32(ex[16:], 0xffffffff)
		extras = ex[:20]
	case tkGat, tkGats, tkTouch:
		be.BigEndian.PutUint32(ex[0:], c.exptime)
		extras = ex[:4]
	case tkFlushAll:
		if c.exptime != 0 {
			be.BigEndian.PutUint32(ex[0:], c.exptime)
			extras = ex[:4]
		}
	case tkVerbosity:
		// The level is not kept: the proxy answers verbosity itself
		// (dispatch); the extras make the frame well formed.
		extras = ex[:4]
	}
	h := binary.Header{Magic: binary.MagicRequest, Opcode: op, Opaque: textTag(c.kind, c.noreply)}
	if c.kind == tkCas {
		h.CAS = c.cas
	}
	buf = binary.AppendFrame(buf[:0], h, nil, extras, c.key, c.value)
	f, _, _ := binary.Decode(buf, len(buf))
	*r = request{op: op, opaque: h.Opaque, cas: h.CAS, frame: f, extras: f.Extras(), key: f.Key(), value: f.Value()}
	return buf
}

// Memcached's text replies that proto/text does not name (its encoders
// and reply lines give the rest).
const (
	textTooLarge    = "SERVER_ERROR object too large for cache\r\n"
	textOutOfMemory = "SERVER_ERROR out of memory storing object\r\n"
	textNonNumeric  = "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
)

// appendTextResponse appends the text reply to resp, the answer to the
// text request q.
func appendTextResponse(dst []byte, q reqHead, resp response) []byte {
	k, noreply := tagOf(q.opaque)
	if resp.status != binary.StatusSuccess {
		return appendTextError(dst, q, resp.status, string(resp.value))
	}
	if noreply {
		return dst
	}
	switch k {
	case tkStats:
		if len(resp.key) == 0 {
			return append(dst, text.End...)
		}
		dst = append(dst, "STAT "...)
		dst = appendLine(dst, string(resp.key))
		dst = append(dst, ' ')
		dst = appendLine(dst, string(resp.value))
		return append(dst, "\r\n"...)
	case tkMetaNoop:
		return append(dst, text.MetaNoop...)
	case tkMeta:
		return appendMetaReply(dst, resp.meta, resp.strip, resp.metaRaw)
	case tkAuth:
		return append(dst, text.AuthStored...)
	case tkCasZero:
		return append(dst, text.Exists...)
	case tkQuit:
		return dst
	case tkGet, tkGets, tkGat, tkGats:
		var flags uint32
		if len(resp.extras) >= 4 {
			flags = be.BigEndian.Uint32(resp.extras)
		}
		if k == tkGets || k == tkGats {
			return text.AppendValueCAS(dst, resp.key, flags, resp.value, resp.cas)
		}
		return text.AppendValue(dst, resp.key, flags, resp.value)
	case tkEnd:
		return append(dst, text.End...)
	case tkSet, tkAdd, tkReplace, tkAppend, tkPrepend, tkCas:
		return append(dst, text.Stored...)
	case tkIncr, tkDecr:
		var n uint64
		if len(resp.value) == 8 {
			n = be.BigEndian.Uint64(resp.value)
		}
		return text.AppendNumber(dst, n)
	case tkDelete:
		return append(dst, text.Deleted...)
	case tkTouch:
		return append(dst, text.Touched...)
	case tkFlushAll, tkVerbosity:
		return append(dst, text.OK...)
	case tkVersion:
		dst = append(dst, "VERSION "...)
		dst = append(dst, resp.value...)
		return append(dst, "\r\n"...)
	}
	return append(dst, "SERVER_ERROR unexpected answer\r\n"...)
}

// appendTextError appends the text reply to a failed request q: the line
// memcached gives for the same failure, or for the proxy's own refusals
// (an upstream timed out or down, throttle.max_hold, ...) a SERVER_ERROR
// (CLIENT_ERROR for the client's fault) with the reason. It is one line,
// which a retrieval's key sends instead of the rest of the command's reply
// (textCodec.passes). A retrieval miss answers nothing; noreply
// suppresses every reply, errors included, as memcached's does (a meta
// command's q is not noreply: its errors are sent, as memcached sends
// them).
func appendTextError(dst []byte, q reqHead, st binary.Status, reason string) []byte {
	k, noreply := tagOf(q.opaque)
	if noreply || k == tkQuit {
		return dst
	}
	if st == binary.StatusSuccess { // the proxy's own answers (NOOP, QUIT ...)
		return appendTextResponse(dst, q, response{status: st})
	}
	if st == binary.StatusEaccess && reason == "authentication required" {
		return append(dst, "CLIENT_ERROR unauthenticated\r\n"...)
	}
	if st == binary.StatusEinval && reason == reasonKeyTooLong {
		return append(dst, errBadCommandLine...)
	}
	switch k {
	case tkAuth:
		if st == binary.StatusAuthError && strings.HasPrefix(reason, plainRefused) {
			// Not a wrong password: say why (proxy.plain_auth).
			dst = append(dst, "CLIENT_ERROR "...)
			dst = appendLine(dst, reason)
			return append(dst, "\r\n"...)
		}
		if st == binary.StatusAuthError {
			return append(dst, text.AuthFailure...)
		}
	case tkVerbosity:
		return append(dst, text.OK...) // memcached answers OK, whatever the level
	case tkStats:
		if st == binary.StatusKeyEnoent {
			// A group memcached does not know (the proxy's answer, or
			// memcached's binary one to an admin): its text answer
			// (memcached 1.6's proto_text.c, process_stat).
			return append(dst, text.ErrorLine...)
		}
	case tkFlushAll:
		if st == binary.StatusEaccess {
			return append(dst, "CLIENT_ERROR flush_all not allowed\r\n"...)
		}
	case tkGet, tkGets, tkGat, tkGats:
		if st == binary.StatusKeyEnoent {
			return dst
		}
	case tkSet, tkAdd, tkReplace, tkAppend, tkPrepend:
		switch st {
		case binary.StatusKeyEexists, binary.StatusKeyEnoent, binary.StatusNotStored:
			return append(dst, text.NotStored...)
		}
	case tkCasZero:
		if st == binary.StatusKeyEnoent {
			return append(dst, text.NotFound...)
		}
	case tkCas:
		switch st {
		case binary.StatusKeyEexists:
			return append(dst, text.Exists...)
		case binary.StatusKeyEnoent:
			return append(dst, text.NotFound...)
		case binary.StatusNotStored:
			return append(dst, text.NotStored...)
		}
	case tkIncr, tkDecr:
		switch st {
		case binary.StatusKeyEnoent:
			return append(dst, text.NotFound...)
		case binary.StatusDeltaBadval:
			return append(dst, textNonNumeric...)
		}
	case tkDelete, tkTouch:
		if st == binary.StatusKeyEnoent {
			return append(dst, text.NotFound...)
		}
	}
	switch st {
	case binary.StatusE2big:
		return append(dst, textTooLarge...)
	case binary.StatusEnomem:
		return append(dst, textOutOfMemory...)
	case binary.StatusEinval, binary.StatusEaccess:
		dst = append(dst, "CLIENT_ERROR "...)
	default:
		dst = append(dst, "SERVER_ERROR "...)
	}
	if reason == "" {
		reason = st.String()
	}
	dst = appendLine(dst, reason)
	return append(dst, "\r\n"...)
}

// appendLine appends s with every byte that would end or break a reply
// line (CR, LF, other control bytes) replaced by a space.
func appendLine(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < ' ' || c == 0x7f {
			c = ' '
		}
		dst = append(dst, c)
	}
	return dst
}
