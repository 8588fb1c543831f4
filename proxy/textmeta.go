package proxy

import (
	"bytes"
	"strconv"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// Meta commands (mg ms md ma me) go to memcached as meta commands, on the
// text sibling of the connection their key routes to (upstream.Conn.Meta):
// the binary protocol cannot say what their flags ask (remaining TTL, the
// vivify and recache wins, quiet mode's own rules). Only the key changes on
// the way: it gets the bucket's namespace (inside the base64 when the b
// flag is given), and replies lose it again (the k flag's token, ME's key).
// memcached applies every flag itself, q included, so the replies are its
// own. For admission and units a meta command counts as the binary command
// it stands for (metaOps): mg is a read of its key and value, a write too
// when it touches (T) or may create (N); ms a write of its key and data;
// md and ma writes of their key.

// metaCommand is the meta command being dispatched.
type metaCommand struct {
	verb   string // "mg", "ms", ...
	key    []byte // the key memcached stores: decoded from base64 with b
	b64    bool   // the b flag: the key travels in base64
	tail   []byte // the command line after the key, as the client sent it
	data   []byte // ms's data block with its "\r\n"; nil for the others
	quiet  bool   // the q flag
	keyBuf []byte // holds a decoded key
	line   []byte // the upstream command line (upstreamLine)
}

// metaTagB64 marks, in a meta request's text tag, that its key was base64.
const metaTagB64 = 1 << 9

// decodeMeta fills r for the meta command c.cmd (not mn): r.key is the key
// memcached stores, r.value ms's data, r.op the binary command it counts as.
// It returns false when the line cannot be split around its key (a parser
// invariant; the caller refuses the command).
func (c *textCodec) decodeMeta(r *request) bool {
	cmd := &c.cmd
	m := &c.meta
	off := cap(cmd.Line) - cap(cmd.Key)
	if off < 0 || off+len(cmd.Key) > len(cmd.Line) || len(cmd.Key) == 0 || &cmd.Line[off] != &cmd.Key[0] {
		return false
	}
	m.verb = cmd.Kind.String()
	m.tail = cmd.Line[off+len(cmd.Key):]
	m.b64 = cmd.Base64
	m.quiet = cmd.NoReply
	m.key = cmd.Key
	if m.b64 {
		k, ok := text.DecodeBase64(m.keyBuf[:0], cmd.Key)
		if !ok {
			return false // Parse refuses undecodable keys
		}
		m.keyBuf, m.key = k, k
	}
	m.data = nil
	op := binary.OpGet
	switch cmd.Kind {
	case text.KindMetaGet:
		if metaHasFlag(cmd.Meta, 'T') || metaHasFlag(cmd.Meta, 'N') {
			op = binary.OpGAT
		}
	case text.KindMetaSet:
		op = binary.OpSet
		m.data = cmd.Value[:len(cmd.Value)+2] // Parse checked its "\r\n"
	case text.KindMetaDelete:
		op = binary.OpDelete
	case text.KindMetaArithmetic:
		op = binary.OpIncrement
	}
	tag := textTag(tkMeta, false)
	if m.b64 {
		tag |= metaTagB64
	}
	*r = request{op: op, opaque: tag, key: m.key, value: cmd.Value, meta: true}
	return true
}

func metaHasFlag(flags []text.MetaFlag, f byte) bool {
	for _, m := range flags {
		if m.Flag == f {
			return true
		}
	}
	return false
}

// metaKeyTooLong reports whether the meta command's key, in the namespace
// prefix, is longer than memcached takes: 250 bytes, counted in base64 when
// the key travels so.
func metaKeyTooLong(cmd *text.Command, prefix int) bool {
	if !cmd.Base64 {
		return prefix+len(cmd.Key) > binary.MaxKeyLen
	}
	n, ok := text.Base64DecodedLen(cmd.Key)
	return ok && text.Base64EncodedLen(prefix+n) > binary.MaxKeyLen
}

// tooLong reports whether the command's key is too long for memcached in
// a namespace of prefix bytes (see metaKeyTooLong).
func (m *metaCommand) tooLong(prefix int) bool {
	if m.b64 {
		return text.Base64EncodedLen(prefix+len(m.key)) > binary.MaxKeyLen
	}
	return prefix+len(m.key) > binary.MaxKeyLen
}

// upstreamLine returns the meta command line for memcached: the client's,
// with prefix+key (in base64 with b) for its key. It is built in the
// codec's buffer, valid until the next call.
func (c *textCodec) upstreamLine(prefix []byte) []byte {
	m := &c.meta
	l := append(m.line[:0], m.verb...)
	l = append(l, ' ')
	if m.b64 {
		var k [binary.MaxKeyLen]byte
		l = text.AppendBase64(l, append(append(k[:0], prefix...), m.key...))
	} else {
		l = append(l, prefix...)
		l = append(l, m.key...)
	}
	l = append(l, m.tail...)
	l = append(l, "\r\n"...)
	m.line = l
	return l
}

// appendMetaReply appends memcached's reply to a meta command, line (without
// its line ending) and VA's value, as the client gets it: the k flag's key,
// or ME's, without the strip bytes of the bucket's namespace, and ME's
// item size without them; every other byte as memcached sent it. b64 says
// the command's key was base64 (ME's reply does not say).
func appendMetaReply(dst, line, value []byte, strip int, b64 bool) []byte {
	code, rest, spaced := bytes.Cut(line, []byte(" "))
	switch {
	case text.IsMetaCode(code):
		dst = append(dst, code...)
		b64 = metaReplyHasB(rest)
		first := string(code) == text.MetaVA // VA's size comes first
		for len(rest) > 0 {
			var tok []byte
			tok, rest, _ = bytes.Cut(rest, []byte(" "))
			dst = append(dst, ' ')
			if !first && len(tok) > 0 && tok[0] == 'k' {
				dst = append(dst, 'k')
				dst = appendClientKey(dst, tok[1:], strip, b64)
			} else {
				dst = append(dst, tok...)
			}
			first = false
		}
	case string(code) == "ME" && spaced:
		key, rest, _ := bytes.Cut(rest, []byte(" "))
		dst = append(dst, "ME "...)
		dst = appendClientKey(dst, key, strip, b64)
		for len(rest) > 0 {
			var tok []byte
			tok, rest, _ = bytes.Cut(rest, []byte(" "))
			dst = append(dst, ' ')
			if n, ok := bytes.CutPrefix(tok, []byte("size=")); ok {
				if v, err := strconv.Atoi(string(n)); err == nil && v >= strip {
					dst = append(dst, "size="...)
					dst = strconv.AppendInt(dst, int64(v-strip), 10)
					continue
				}
			}
			dst = append(dst, tok...)
		}
	default:
		dst = append(dst, line...)
	}
	dst = append(dst, "\r\n"...)
	if string(code) == text.MetaVA {
		dst = append(dst, value...)
		dst = append(dst, "\r\n"...)
	}
	return dst
}

// metaReplyHasB reports whether a meta reply's flags include b (its k
// token is base64).
func metaReplyHasB(flags []byte) bool {
	for len(flags) > 0 {
		var tok []byte
		tok, flags, _ = bytes.Cut(flags, []byte(" "))
		if len(tok) == 1 && tok[0] == 'b' {
			return true
		}
	}
	return false
}

// appendClientKey appends key, as memcached returned it, without the strip
// bytes of the namespace; b64: key is base64, and so is what is appended.
// A key shorter than the namespace (which memcached never returns) is
// appended as it is.
func appendClientKey(dst, key []byte, strip int, b64 bool) []byte {
	if !b64 {
		if len(key) >= strip {
			key = key[strip:]
		}
		return append(dst, key...)
	}
	var buf [binary.MaxKeyLen]byte
	k, ok := text.DecodeBase64(buf[:0], key)
	if !ok || len(k) < strip {
		return append(dst, key...)
	}
	return text.AppendBase64(dst, k[strip:])
}
