package proxy

import (
	"bytes"
	"errors"
	"strings"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// textCodec is memcached's text protocol as a codec (codec.go), for a
// client whose first byte is not a binary request magic (DESIGN.md section
// 12). proto/text parses each command exactly as memcached does; the
// classic commands become the binary requests the rest of the proxy
// handles (texttrans.go), and their answers become memcached's text
// replies. A retrieval command becomes one request per key and an END.
// Input memcached refuses is answered as memcached answers it (a
// codecReply). Meta commands go upstream as meta commands (textmeta.go);
// mn is answered by the proxy, in order.
//
// A session keeps its textCodec in place (session.text) and the codec
// interface points at it, so that its buffers are reused.
type textCodec struct {
	s       *session
	cmd     text.Command
	auth    text.Auth
	tc      textCommand
	scratch []byte      // the binary frame of the request being dispatched
	meta    metaCommand // the meta command being dispatched (textmeta.go)
	part    int         // which part of a retrieval command comes next

	// failed: in the order replies go out (passes), a key of the
	// retrieval command being answered failed, and the rest of its reply
	// is dropped up to its end.
	failed bool
}

var _ codec = (*textCodec)(nil)

// codecReply is a decode error the session answers and goes on from
// (unless close): the client's input is refused with reply (empty:
// silently), its skip bytes dropped (the command and whatever memcached
// swallows after it, which may not have arrived yet).
type codecReply struct {
	reply []byte
	skip  int
	close bool
}

func (e *codecReply) Error() string { return "refused: " + strings.TrimSpace(string(e.reply)) }

// errAdminUnsupported answers memcached's administrative commands (slabs,
// lru, watch, shutdown, ...): they act on the whole server, which no
// tenant may.
var errAdminUnsupported = []byte("SERVER_ERROR command not supported through kvthrottle\r\n")

// errBadCommandLine is memcached's refusal of a key over 250 bytes.
var errBadCommandLine = []byte("CLIENT_ERROR bad command line format\r\n")

// errMetaKey answers a meta command whose key the codec could not take
// apart (the parser accepts none such).
var errMetaKey = []byte("SERVER_ERROR the proxy could not read the key\r\n")

func (c *textCodec) peekLen() int { return 0 }

func (c *textCodec) starts(byte) bool { return true }

func (c *textCodec) requestLen(buf []byte, maxBody int) int {
	n, err := c.parse(buf, maxBody)
	if err != nil {
		return 0 // decode answers it
	}
	if n == 0 {
		if c.authenticating() {
			return c.auth.Need
		}
		return c.cmd.Need
	}
	return n
}

// authenticating reports that the client must authenticate and may do so
// with memcached's text authentication (a first set carrying "user
// password").
func (c *textCodec) authenticating() bool { return c.s.needAuth && c.s.user == nil }

func (c *textCodec) parse(buf []byte, maxBody int) (int, error) {
	if c.authenticating() {
		return text.ParseAuth(buf, maxBody, &c.auth)
	}
	return text.Parse(buf, maxBody, &c.cmd)
}

func (c *textCodec) decode(buf []byte, maxBody int, r *request) (int, error) {
	n, err := c.parse(buf, maxBody)
	if err != nil {
		var te *text.Error
		if errors.As(err, &te) {
			c.part = 0
			re := &codecReply{skip: n + te.Swallow, close: te.Close}
			if !te.Silent && te.Line != "" {
				re.reply = te.AppendReply(nil)
			}
			return 0, re
		}
		return 0, err
	}
	if n == 0 {
		return 0, nil
	}
	if c.authenticating() {
		// memcached's text authentication, as SASL PLAIN.
		c.tc = textCommand{kind: tkAuth, key: []byte("PLAIN")}
		c.scratch = append(c.scratch[:0], 0)
		c.scratch = append(c.scratch, c.auth.User...)
		c.scratch = append(c.scratch, 0)
		c.scratch = append(c.scratch, c.auth.Password...)
		c.tc.value = c.scratch
		c.scratch = buildTextRequest(nil, &c.tc, r)
		return n, nil
	}
	cmd := &c.cmd
	if c.keyTooLong(cmd) {
		// A key memcached takes (the parser refused longer ones as
		// memcached does) that the bucket's namespace makes too long:
		// refused as memcached refuses a key over 250 bytes, but with
		// its data block swallowed, since the client sent one (memcached
		// would read it as commands: a value could run as a delete).
		// noreply hides the refusal, as memcached's does.
		re := &codecReply{skip: n}
		if !cmd.NoReply || cmd.Kind.IsMeta() {
			re.reply = errBadCommandLine
		}
		return 0, re
	}
	if cmd.Kind.IsMeta() && cmd.Kind != text.KindMetaNoop && c.metaLineTooLong(cmd) {
		// memcached closes a connection on a command line it has read
		// more than 2 KiB of without its end, depending on how the bytes
		// arrive; the upstream connection is shared, so a namespaced line
		// must stay within that. The client is closed as memcached may
		// close it.
		return 0, &codecReply{close: true}
	}
	tc := &c.tc
	*tc = textCommand{noreply: cmd.NoReply, key: cmd.Key, value: cmd.Value, flags: cmd.Flags,
		exptime: textExptime(cmd.Exptime), cas: cmd.CAS, delta: cmd.Delta}
	tc.kind = textKinds[cmd.Kind]
	switch tc.kind {
	case tkGet, tkGets, tkGat, tkGats:
		if c.part < len(cmd.Keys) {
			tc.key = cmd.Keys[c.part]
			c.scratch = buildTextRequest(c.scratch, tc, r)
			r.more = true
			return 0, nil
		}
		tc.kind, tc.key = tkEnd, nil
		c.scratch = buildTextRequest(c.scratch, tc, r)
		r.last = true
		return n, nil
	case tkStats:
		tc.key = nil
		if len(cmd.Args) > 0 {
			tc.key = cmd.Args[0]
		}
	case tkMeta:
		if !c.decodeMeta(r) {
			return 0, &codecReply{reply: errMetaKey, skip: n}
		}
		return n, nil
	case 0: // memcached's administrative commands
		re := &codecReply{skip: n}
		if !cmd.NoReply { // memcached sends nothing then, errors included
			re.reply = errAdminUnsupported
		}
		return 0, re
	}
	c.scratch = buildTextRequest(c.scratch, tc, r)
	return n, nil
}

// keyTooLong reports whether a key of cmd is too long for memcached once
// the session's bucket namespace is put in front of it.
func (c *textCodec) keyTooLong(cmd *text.Command) bool {
	b := c.s.bkt
	if b == nil {
		return false
	}
	prefix := len(*b.prefix.Load())
	if cmd.Kind.IsMeta() {
		return cmd.Kind != text.KindMetaNoop && metaKeyTooLong(cmd, prefix)
	}
	room := binary.MaxKeyLen - prefix
	if len(cmd.Key) > room {
		return true
	}
	for _, k := range cmd.Keys {
		if len(k) > room {
			return true
		}
	}
	return false
}

// partDone: the part decode gave last was dispatched.
func (c *textCodec) partDone(last bool) {
	if last {
		c.part = 0
	} else {
		c.part++
	}
}

func (c *textCodec) appendResponse(dst []byte, q reqHead, resp response) []byte {
	return appendTextResponse(dst, q, resp)
}

func (c *textCodec) appendError(dst []byte, q reqHead, st binary.Status, reason string) []byte {
	return appendTextError(dst, q, st, reason)
}

// passes frames a failed retrieval command as memcached does: its reply
// ends with the one error line (memcached's own get, gets, gat and gats
// send "SERVER_ERROR ..." or "CLIENT_ERROR ..." alone, with no END, and
// stop at the failing key), so the replies of its later keys and its END
// are dropped. Whatever its earlier keys answered has gone out already
// (memcached, which sends nothing before END, drops those too): the
// client still reads one reply, which the error line ends. Every other
// reply passes; so do a noreply command's errors, which appendTextError
// never makes (memcached sends none either).
func (c *textCodec) passes(q reqHead, reply []byte) bool {
	switch k, _ := tagOf(q.opaque); k {
	case tkGet, tkGets, tkGat, tkGats:
		if c.failed {
			return false
		}
		// A key answers its VALUE block, nothing (a miss), or else the
		// error line appendTextError made of its failure.
		c.failed = len(reply) > 0 && !bytes.HasPrefix(reply, valuePrefix)
	case tkEnd:
		if c.failed {
			c.failed = false
			return false
		}
	}
	return true
}

var valuePrefix = []byte("VALUE ")

// textKinds maps the commands proto/text parses to those the codec
// translates; 0 for the ones it does not (memcached's administrative
// commands).
var textKinds = [...]textKind{
	text.KindGet: tkGet, text.KindGets: tkGets, text.KindGat: tkGat, text.KindGats: tkGats,
	text.KindSet: tkSet, text.KindAdd: tkAdd, text.KindReplace: tkReplace, text.KindAppend: tkAppend,
	text.KindPrepend: tkPrepend, text.KindCas: tkCas, text.KindIncr: tkIncr, text.KindDecr: tkDecr,
	text.KindDelete: tkDelete, text.KindTouch: tkTouch, text.KindFlushAll: tkFlushAll,
	text.KindVersion: tkVersion, text.KindVerbosity: tkVerbosity, text.KindQuit: tkQuit,
	text.KindStats: tkStats, text.KindMetaNoop: tkMetaNoop,
	text.KindMetaGet: tkMeta, text.KindMetaSet: tkMeta, text.KindMetaDelete: tkMeta,
	text.KindMetaArithmetic: tkMeta, text.KindMetaDebug: tkMeta,
	text.KindAdmin: 0,
}

// textExptime is a text exptime as the binary protocol's: memcached's text
// protocol expires an item at once for a negative exptime, which the
// binary one (unsigned) says with an absolute time long past.
func textExptime(e int32) uint32 {
	if e < 0 {
		return 30*24*3600 + 1 // an absolute Unix time in 1970
	}
	return uint32(e)
}
