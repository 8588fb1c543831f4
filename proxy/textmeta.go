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
// it stands for (its row's text.Verb.OpFor): mg is a read of its key and value, a write too
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
	if cmd.Kind.IsStorage() {
		m.data = cmd.Value[:len(cmd.Value)+2] // Parse checked its "\r\n"
	}
	touch := metaHasFlag(cmd.Meta, 'T') || metaHasFlag(cmd.Meta, 'N')
	op := cmd.Verb.OpFor(false, touch)
	*r = request{op: op, opaque: textTag(cmd.Kind, partCommand, false), key: m.key, value: cmd.Value, meta: true}
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

// metaWireKeyLen is the length of a meta key as memcached receives it:
// keyLen bytes of key (decoded) behind prefix bytes of namespace, in base64
// when b64. Every check of a meta key or line against memcached's limits
// counts with it.
func metaWireKeyLen(prefix, keyLen int, b64 bool) int {
	if b64 {
		return text.Base64EncodedLen(prefix + keyLen)
	}
	return prefix + keyLen
}

// cmdWireKeyLen is metaWireKeyLen for a parsed meta command, whose key is
// still as the client sent it; ok is false when a base64 key does not
// decode (the command is refused later, for that).
func cmdWireKeyLen(cmd *text.Command, prefix int) (n int, ok bool) {
	n = len(cmd.Key)
	if cmd.Base64 {
		if n, ok = text.Base64DecodedLen(cmd.Key); !ok {
			return 0, false
		}
	}
	return metaWireKeyLen(prefix, n, cmd.Base64), true
}

// metaKeyTooLong reports whether the meta command's key, in the namespace
// prefix, is longer than memcached takes: 250 bytes, counted in base64 when
// the key travels so.
func metaKeyTooLong(cmd *text.Command, prefix int) bool {
	n, ok := cmdWireKeyLen(cmd, prefix)
	return ok && n > binary.MaxKeyLen
}

// tooLong reports whether the command's key is too long for memcached in
// a namespace of prefix bytes (see metaKeyTooLong), or its line longer
// than memcached reliably reads (metaLineTooLong).
func (m *metaCommand) tooLong(prefix int) bool {
	key := metaWireKeyLen(prefix, len(m.key), m.b64)
	return key > binary.MaxKeyLen || len(m.verb)+1+key+len(m.tail)+2 > text.MaxLineLen
}

// metaLineTooLong reports whether meta command cmd's line, with its key in
// the bucket's namespace of prefix bytes, is longer than memcached
// reliably reads: text.MaxLineLen bytes, "\r\n" included (never without
// a bucket: prefix < 0).
func metaLineTooLong(cmd *text.Command, prefix int) bool {
	if prefix < 0 {
		return false
	}
	key, _ := cmdWireKeyLen(cmd, prefix)
	return len(cmd.Line)-len(cmd.Key)+key+2 > text.MaxLineLen
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

// appendMetaReply appends memcached's reply r to a meta command as the
// client gets it: the key it echoes (the k flag's token, or ME's key)
// without the strip bytes of the bucket's namespace, ME's item size
// without them too, and every other byte as memcached sent it. memcached
// echoes a key in base64 when the item was stored with a base64 key,
// whatever the command asked: a k token says so with a b flag; for ME,
// whose reply does not, rawLen (the length of the namespaced key) tells
// the raw echo from the longer base64 one.
func appendMetaReply(dst []byte, r *text.MetaResponse, strip, rawLen int) []byte {
	line := r.Line
	if r.KeyStart < 0 {
		dst = append(dst, line...)
	} else {
		key := line[r.KeyStart:r.KeyEnd]
		var b64 bool
		if string(r.Code) == "ME" {
			b64 = len(key) != rawLen
		} else {
			_, b64 = r.Flag('b')
		}
		dst = append(dst, line[:r.KeyStart]...)
		dst = appendClientKey(dst, key, strip, b64)
		rest := line[r.KeyEnd:]
		if string(r.Code) == "ME" {
			dst = appendMESize(dst, rest, strip)
		} else {
			dst = append(dst, rest...)
		}
	}
	dst = append(dst, "\r\n"...)
	if string(r.Code) == text.MetaVA {
		dst = append(dst, r.Value...)
		dst = append(dst, "\r\n"...)
	}
	return dst
}

// appendMESize appends the rest of an ME line (after its key) with its
// size= less the strip bytes the namespace added to the item.
func appendMESize(dst, rest []byte, strip int) []byte {
	i := bytes.Index(rest, []byte(" size="))
	if i < 0 {
		return append(dst, rest...)
	}
	num := rest[i+len(" size="):]
	j := 0
	for j < len(num) && num[j] >= '0' && num[j] <= '9' {
		j++
	}
	v, err := strconv.Atoi(string(num[:j]))
	if err != nil || v < strip {
		return append(dst, rest...)
	}
	dst = append(dst, rest[:i+len(" size=")]...)
	dst = strconv.AppendInt(dst, int64(v-strip), 10)
	return append(dst, num[j:]...)
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
