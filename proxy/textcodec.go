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
// interface points at it, so that its buffers are reused. What it needs to
// know of the session comes with each call (codecCtx).
type textCodec struct {
	cmd     text.Command
	auth    text.Auth
	tc      textCommand
	scratch []byte      // the binary frame of the request being dispatched
	meta    metaCommand // the meta command being dispatched (textmeta.go)
	part    int         // which part of a retrieval command comes next
	large   bool        // the last parse found a write too large for memcached (toolarge.go)

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

func (c *textCodec) peekLen([]byte, codecCtx) int { return 0 }

func (c *textCodec) starts(byte) bool { return true }

func (c *textCodec) requestLen(buf []byte, cx codecCtx) int {
	n, err := c.parse(buf, cx)
	if err != nil {
		return 0 // decode answers it
	}
	if n == 0 {
		if cx.textAuth {
			return c.auth.Need
		}
		return c.cmd.Need
	}
	return n
}

// parse reads the command at the start of buf: memcached's text
// authentication (a set carrying "user password") while the client must
// authenticate, else any command.
//
// A write too large for memcached is told by its line alone: its length is
// returned once the line is in, and large set (decodeTooLarge).
func (c *textCodec) parse(buf []byte, cx codecCtx) (int, error) {
	if cx.textAuth {
		c.large = false
		return text.ParseAuth(buf, cx.maxBody, &c.auth)
	}
	n, err := text.Parse(buf, cx.maxBody, &c.cmd)
	if line := c.refusable(n, err, cx); line > 0 {
		c.large = true
		return line, nil
	}
	c.large = false
	return n, err
}

func (c *textCodec) decode(buf []byte, cx codecCtx, r *request) (int, error) {
	n, err := c.parse(buf, cx)
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
	if cx.textAuth {
		c.decodeAuth(r)
		return n, nil
	}
	if c.large {
		c.decodeTooLarge(r)
		return n, nil
	}
	cmd := &c.cmd
	if keyTooLong(cmd, cx.prefix) {
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
	v := cmd.Verb
	if v.Run == text.RunMeta && metaLineTooLong(cmd, cx.prefix) {
		// memcached closes a connection on a command line it has read
		// more than 2 KiB of without its end, depending on how the bytes
		// arrive; the upstream connection is shared, so a namespaced line
		// must stay within that. The client is closed as memcached may
		// close it.
		return 0, &codecReply{close: true}
	}
	tc := &c.tc
	*tc = textCommand{verb: v, noreply: cmd.NoReply, key: cmd.Key, value: cmd.Value, flags: cmd.Flags,
		exptime: textExptime(cmd.Exptime), cas: cmd.CAS, delta: cmd.Delta}
	switch {
	case v.Run == text.RunRefused: // memcached's administrative commands
		re := &codecReply{skip: n}
		if !cmd.NoReply { // memcached sends nothing then, errors included
			re.reply = errAdminUnsupported
		}
		return 0, re
	case v.Run == text.RunMeta:
		if !c.decodeMeta(r) {
			return 0, &codecReply{reply: errMetaKey, skip: n}
		}
		return n, nil
	case cmd.Kind.IsMultiGet():
		if c.part < len(cmd.Keys) {
			tc.key = cmd.Keys[c.part]
			c.scratch = buildTextRequest(c.scratch, tc, r)
			r.more = true
			return 0, nil
		}
		tc.part, tc.key = partEnd, nil
		c.scratch = buildTextRequest(c.scratch, tc, r)
		r.last = true
		return n, nil
	case cmd.Kind == text.KindStats:
		tc.key = nil
		if len(cmd.Args) > 0 {
			tc.key = cmd.Args[0]
		}
	}
	c.scratch = buildTextRequest(c.scratch, tc, r)
	return n, nil
}

// decodeAuth fills r with memcached's text authentication (c.auth) as a
// SASL PLAIN request.
func (c *textCodec) decodeAuth(r *request) {
	c.tc = textCommand{part: partAuth, key: []byte("PLAIN")}
	c.scratch = append(c.scratch[:0], 0)
	c.scratch = append(c.scratch, c.auth.User...)
	c.scratch = append(c.scratch, 0)
	c.scratch = append(c.scratch, c.auth.Password...)
	c.tc.value = c.scratch
	c.scratch = buildTextRequest(nil, &c.tc, r)
}

// keyTooLong reports whether a key of cmd is too long for memcached once
// the bucket's namespace, prefix bytes, is put in front of it (never
// without a bucket: prefix < 0).
func keyTooLong(cmd *text.Command, prefix int) bool {
	if prefix < 0 {
		return false
	}
	if cmd.Verb.Run == text.RunMeta {
		return metaKeyTooLong(cmd, prefix)
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
	switch k, p, _ := tagOf(q.opaque); {
	case p == partEnd:
		if c.failed {
			c.failed = false
			return false
		}
	case p == partCommand && k.IsMultiGet():
		if c.failed {
			return false
		}
		// A key answers its VALUE block, nothing (a miss), or else the
		// error line appendTextError made of its failure.
		c.failed = len(reply) > 0 && !bytes.HasPrefix(reply, valuePrefix)
	}
	return true
}

var valuePrefix = []byte("VALUE ")

// textExptime is a text exptime as the binary protocol's: memcached's text
// protocol expires an item at once for a negative exptime, which the
// binary one (unsigned) says with an absolute time long past.
func textExptime(e int32) uint32 {
	if e < 0 {
		return 30*24*3600 + 1 // an absolute Unix time in 1970
	}
	return uint32(e)
}
