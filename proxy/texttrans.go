package proxy

import (
	be "encoding/binary"
	"strings"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// The text protocol's classic commands, translated to the binary
// commands the proxy forwards (DESIGN.md section 12), and the binary
// answers translated back into memcached's text replies. Which binary
// command a text command runs as is its row in proto/text's command table
// (text.Verb.OpFor); what its answers read as is here, keyed by the row's
// kind (appendTextResponse, textFailure). The text codec fills a
// textCommand per command line (per key of a retrieval) and sends the
// requests built here; the reply functions give the bytes a text client
// gets for each answer, byte for byte what memcached would send.

// textPart is which part of a text command a request is, beyond the
// command itself: the requests the proxy adds or substitutes.
type textPart uint8

const (
	partCommand textPart = iota // the command (one key of a retrieval)
	partEnd                     // the "END" after a retrieval's keys: a NOOP
	partAuth                    // memcached's text authentication: SASL PLAIN
	partCasZero                 // cas with the value 0, which never matches: a GET (see buildTextRequest)
)

// textTag is what a text request's reqHead.opaque carries (the text
// protocol has no opaque of its own): the command's kind (proto/text's
// command table), the part, and whether the client asked for no reply.
func textTag(k text.Kind, p textPart, noreply bool) uint32 {
	t := uint32(k) | uint32(p)<<9
	if noreply {
		t |= 1 << 8
	}
	return t
}

func tagOf(opaque uint32) (k text.Kind, p textPart, noreply bool) {
	return text.Kind(opaque & 0xff), textPart(opaque >> 9 & 3), opaque&(1<<8) != 0
}

// textCommand is one parsed text command (one key of it, for retrieval).
type textCommand struct {
	verb    *text.Verb // the command's row in proto/text's table; nil for partAuth
	part    textPart
	key     []byte
	value   []byte // storage commands' data
	flags   uint32 // storage commands' client flags
	exptime uint32 // storage commands, gat/gats, touch; flush_all's delay
	cas     uint64 // cas
	delta   uint64 // incr/decr
	noreply bool
}

// kind is c's command kind (KindNone for partAuth).
func (c *textCommand) kind() text.Kind {
	if c.verb == nil {
		return text.KindNone
	}
	return c.verb.Kind
}

// op is the binary command c runs as: its row's (text.Verb.OpFor), or
// the proxy's own for the parts it adds.
func (c *textCommand) op() binary.Opcode {
	switch c.part {
	case partEnd:
		return binary.OpNoop
	case partAuth:
		return binary.OpSASLAuth
	case partCasZero:
		return binary.OpGet
	}
	return c.verb.OpFor(c.noreply, false)
}

// buildTextRequest fills r with c as a binary request whose frame is built
// in buf (reused; returned grown), so that the rest of the proxy sees a
// binary client's command. Retrieval commands are quiet GETKQ/GATKQ (a
// miss answers nothing) followed by partEnd (a NOOP answered "END").
// The extras are those memcached's binary protocol reads for the opcode.
//
// A cas with the value 0 never stores in the text protocol (no item has
// CAS 0: memcached answers EXISTS, or NOT_FOUND for a missing key), while
// a binary SET with CAS 0 stores unconditionally: it becomes a GET whose
// hit answers EXISTS.
func buildTextRequest(buf []byte, c *textCommand, r *request) []byte {
	if c.part == partCommand && c.kind() == text.KindCas && c.cas == 0 {
		z := textCommand{verb: c.verb, part: partCasZero, key: c.key, noreply: c.noreply}
		c = &z
	}
	op := c.op()
	var ex [20]byte
	var extras []byte
	switch op {
	case binary.OpSet, binary.OpSetQ, binary.OpAdd, binary.OpAddQ, binary.OpReplace, binary.OpReplaceQ:
		be.BigEndian.PutUint32(ex[0:], c.flags)
		be.BigEndian.PutUint32(ex[4:], c.exptime)
		extras = ex[:8]
	case binary.OpIncrement, binary.OpIncrementQ, binary.OpDecrement, binary.OpDecrementQ:
		// No initial value and expiry 0xffffffff: a missing key is
		// NOT_FOUND, as in the text protocol.
		be.BigEndian.PutUint64(ex[0:], c.delta)
		be.BigEndian.PutUint64(ex[8:], 0)
		be.BigEndian.PutUint32(ex[16:], 0xffffffff)
		extras = ex[:20]
	case binary.OpGATKQ, binary.OpTouch:
		be.BigEndian.PutUint32(ex[0:], c.exptime)
		extras = ex[:4]
	case binary.OpFlush, binary.OpFlushQ:
		if c.exptime != 0 {
			be.BigEndian.PutUint32(ex[0:], c.exptime)
			extras = ex[:4]
		}
	case binary.OpVerbosity:
		// The level is not kept: the proxy answers verbosity itself
		// (dispatch); the extras make the frame well formed.
		extras = ex[:4]
	}
	h := binary.Header{Magic: binary.MagicRequest, Opcode: op, Opaque: textTag(c.kind(), c.part, c.noreply), CAS: c.cas}
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
	k, p, noreply := tagOf(q.opaque)
	if resp.status != binary.StatusSuccess {
		return appendTextError(dst, q, resp.status, string(resp.value))
	}
	if noreply {
		return dst
	}
	switch p {
	case partEnd:
		return append(dst, text.End...)
	case partAuth:
		return append(dst, text.AuthStored...)
	case partCasZero:
		return append(dst, text.Exists...)
	}
	switch k {
	case text.KindStats:
		if len(resp.key) == 0 {
			return append(dst, text.End...)
		}
		dst = append(dst, "STAT "...)
		dst = appendLine(dst, string(resp.key))
		dst = append(dst, ' ')
		dst = appendLine(dst, string(resp.value))
		return append(dst, "\r\n"...)
	case text.KindMetaNoop:
		return append(dst, text.MetaNoop...)
	case text.KindMetaGet, text.KindMetaSet, text.KindMetaDelete, text.KindMetaArithmetic, text.KindMetaDebug:
		return appendMetaReply(dst, resp.meta, resp.strip, resp.metaRaw)
	case text.KindQuit:
		return dst
	case text.KindGet, text.KindGets, text.KindGat, text.KindGats:
		var flags uint32
		if len(resp.extras) >= 4 {
			flags = be.BigEndian.Uint32(resp.extras)
		}
		if k == text.KindGets || k == text.KindGats {
			return text.AppendValueCAS(dst, resp.key, flags, resp.value, resp.cas)
		}
		return text.AppendValue(dst, resp.key, flags, resp.value)
	case text.KindSet, text.KindAdd, text.KindReplace, text.KindAppend, text.KindPrepend, text.KindCas:
		return append(dst, text.Stored...)
	case text.KindIncr, text.KindDecr:
		var n uint64
		if len(resp.value) == 8 {
			n = be.BigEndian.Uint64(resp.value)
		}
		return text.AppendNumber(dst, n)
	case text.KindDelete:
		return append(dst, text.Deleted...)
	case text.KindTouch:
		return append(dst, text.Touched...)
	case text.KindFlushAll, text.KindVerbosity:
		return append(dst, text.OK...)
	case text.KindVersion:
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
	k, p, noreply := tagOf(q.opaque)
	if noreply || k == text.KindQuit && p == partCommand {
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
	switch p {
	case partAuth:
		if st == binary.StatusAuthError && strings.HasPrefix(reason, plainRefused) {
			// Not a wrong password: say why (proxy.plain_auth).
			dst = append(dst, "CLIENT_ERROR "...)
			dst = appendLine(dst, reason)
			return append(dst, "\r\n"...)
		}
		if st == binary.StatusAuthError {
			return append(dst, text.AuthFailure...)
		}
	case partCasZero:
		if st == binary.StatusKeyEnoent {
			return append(dst, text.NotFound...)
		}
	case partCommand:
		if line := textFailure(k, st); line != "" {
			return append(dst, line...)
		}
		if k.IsMultiGet() && st == binary.StatusKeyEnoent {
			return dst // a miss
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

// textFailure returns memcached's reply line (with its "\r\n") to
// command k failing with st, or "" when the failure has no line of its
// own (a retrieval miss, answered by nothing, or a failure answered with
// its reason).
func textFailure(k text.Kind, st binary.Status) string {
	switch k {
	case text.KindVerbosity:
		return text.OK // memcached answers OK, whatever the level
	case text.KindStats:
		if st == binary.StatusKeyEnoent {
			// A group memcached does not know (the proxy's answer, or
			// memcached's binary one to an admin): its text answer
			// (memcached 1.6's proto_text.c, process_stat).
			return text.ErrorLine
		}
	case text.KindFlushAll:
		if st == binary.StatusEaccess {
			return "CLIENT_ERROR flush_all not allowed\r\n"
		}
	case text.KindSet, text.KindAdd, text.KindReplace, text.KindAppend, text.KindPrepend:
		switch st {
		case binary.StatusKeyEexists, binary.StatusKeyEnoent, binary.StatusNotStored:
			return text.NotStored
		}
	case text.KindCas:
		switch st {
		case binary.StatusKeyEexists:
			return text.Exists
		case binary.StatusKeyEnoent:
			return text.NotFound
		case binary.StatusNotStored:
			return text.NotStored
		}
	case text.KindIncr, text.KindDecr:
		switch st {
		case binary.StatusKeyEnoent:
			return text.NotFound
		case binary.StatusDeltaBadval:
			return textNonNumeric
		}
	case text.KindDelete, text.KindTouch:
		if st == binary.StatusKeyEnoent {
			return text.NotFound
		}
	}
	return ""
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
