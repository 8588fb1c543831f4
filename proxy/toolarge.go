package proxy

import (
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
	"github.com/kvthrottle/kvthrottle/throttle"
	"github.com/kvthrottle/kvthrottle/upstream"
)

// Writes memcached refuses as too large (issue 28, rule 4; docs/
// throttling.md, "Writes too large for memcached"). A write whose size is
// known before its value is read (text set, add, replace, append,
// prepend and cas, meta ms in every mode, the binary SET family with its
// quiet opcodes) and whose key, in the bucket's namespace, and value are
// longer than the item size limit of the memcached its key goes to (that
// server's item_size_max, upstream.LoopPool.ItemSizeMaxFor; not known:
// nothing is refused) is refused by the proxy as memcached 1.6 refuses
// it, once its line or its header and key are in:
//   - the answer is memcached's: text "SERVER_ERROR object too large for
//     cache" (nothing with noreply), ms the same in every mode and with q,
//     binary status 0x0003 "Too large." (quiet opcodes too);
//   - memcached unlinks the key of a refused text set, of every ms and of
//     a binary SET or SETQ (with or without a CAS), and keeps it for the
//     others: for those the proxy sends memcached a binary DELETE of the
//     key, in the refused write's place on the connection, and the
//     DELETE's answer is dropped (its failure is relayed: the old value
//     may be left);
//   - the command costs its bucket 1 unit (the refusal and the unlink
//     together), admitted as any command of 1 unit;
//   - its value is read from the client and dropped, no faster than the
//     bucket's fastest rate in write units (throttle.Bucket.Discard): the
//     session does not read on while the discard gauge has no room.

// isValueWrite reports whether op is a binary write whose value memcached
// stores whole (the SET family, APPEND and PREPEND, quiet or not).
func isValueWrite(op binary.Opcode) bool {
	switch op {
	case binary.OpSet, binary.OpSetQ, binary.OpAdd, binary.OpAddQ, binary.OpReplace, binary.OpReplaceQ,
		binary.OpAppend, binary.OpAppendQ, binary.OpPrepend, binary.OpPrependQ:
		return true
	}
	return false
}

// binaryLargeWrite looks at the binary request at the start of buf (its
// header in). When it is a well-formed value write whose namespaced key
// and value are longer than cx.itemMax, so maybe too large for its key's
// server, it returns its length up to the end of its key, and, once buf
// holds that key, whether memcached, the key's server, would refuse it
// (codecCtx.tooLarge); otherwise 0 and false: the request goes the usual
// way (an invalid one gets its Einval).
func binaryLargeWrite(buf []byte, cx codecCtx) (end int, refused bool) {
	if cx.itemMax <= 0 || cx.prefix < 0 || len(buf) < binary.HeaderLen || !isValueWrite(binary.Opcode(buf[1])) {
		return 0, false
	}
	h, _ := binary.ParseHeader(buf)
	size := cx.prefix + int(h.KeyLen) + h.ValueLen()
	if !h.Magic.IsRequest() || h.Validate(cx.maxBody) != nil || binary.ValidateRequest(&binary.Frame{Header: h}) != nil ||
		cx.prefix+int(h.KeyLen) > binary.MaxKeyLen || size <= cx.itemMax {
		return 0, false
	}
	end = binary.HeaderLen + int(h.FrameExtLen) + int(h.ExtLen) + int(h.KeyLen)
	return end, len(buf) >= end && cx.tooLarge(buf[end-int(h.KeyLen):end], size)
}

// decodeBinaryTooLarge fills r with the refused write at the start of buf,
// end bytes up to the end of its key (binaryLargeWrite), and returns end.
func decodeBinaryTooLarge(buf []byte, end int, r *request) int {
	h, _ := binary.ParseHeader(buf)
	*r = request{op: h.Opcode, opaque: h.Opaque, cas: h.CAS}
	r.key = buf[end-int(h.KeyLen) : end]
	r.tooLarge, r.swallow = true, h.ValueLen()
	r.unlink = h.Opcode == binary.OpSet || h.Opcode == binary.OpSetQ
	return end
}

// refusable returns the length of the command line of the storage command
// Parse read (n and err are its results) when memcached, the key's
// server, would refuse it as too large: its namespaced key and value over
// that server's limit (codecCtx.tooLarge; also when Parse refused its
// value as over maxBody, Error.TooLarge); else 0.
// Commands refused for their key or line in the namespace, or only for
// the proxy's own bound, go the usual way.
func (c *textCodec) refusable(n int, err error, cx codecCtx) int {
	cmd := &c.cmd
	if cx.prefix < 0 || !cmd.Kind.IsStorage() {
		return 0
	}
	line := 0
	switch te, _ := err.(*text.Error); {
	case te != nil && te.TooLarge:
		line = n
	case err != nil:
		return 0
	case n > 0:
		line = n - cmd.DataLen - 2
	case cmd.Need > 0:
		line = cmd.Need - cmd.DataLen - 2
	default:
		return 0
	}
	if keyTooLong(cmd, cx.prefix) || cmd.Verb.Run == text.RunMeta && metaLineTooLong(cmd, cx.prefix) {
		return 0
	}
	key := cmd.Key
	if cmd.Base64 {
		k, ok := text.Base64DecodedLen(cmd.Key)
		if !ok || cx.itemMax <= 0 || cx.prefix+k+cmd.DataLen <= cx.itemMax {
			return 0 // undecodable, or fits every server whose limit is known
		}
		c.meta.keyBuf, _ = text.DecodeBase64(c.meta.keyBuf[:0], cmd.Key) // the key as the pool routes it
		key = c.meta.keyBuf
	}
	if !cx.tooLarge(key, cx.prefix+len(key)+cmd.DataLen) {
		return 0 // memcached would take it (a value over maxBody only is the proxy's own refusal)
	}
	return line
}

// decodeTooLarge fills r with the write parse found too large for
// memcached (c.large): its key as memcached stores it, the answer it gets
// (the opaque's text tag), and the data block to drop.
func (c *textCodec) decodeTooLarge(r *request) {
	cmd := &c.cmd
	*r = request{tooLarge: true, swallow: cmd.DataLen + 2, key: cmd.Key}
	if cmd.Verb.Run == text.RunMeta { // ms: every mode unlinks; q does not hide the error
		if cmd.Base64 {
			r.key = c.meta.keyBuf // refusable decoded it
		}
		r.op, r.opaque, r.unlink = cmd.Verb.OpFor(false, false), textTag(cmd.Kind, partCommand, false), true
		return
	}
	r.op, r.opaque = cmd.Verb.OpFor(cmd.NoReply, false), textTag(cmd.Kind, partCommand, cmd.NoReply)
	r.unlink = cmd.Kind == text.KindSet
}

// sendRefused completes the slot sl of the refused write r (admitted and
// queued): with r.unlink, a DELETE of its key goes to memcached on u, the
// connection of the key, whose answer is replaced by the refusal
// (slot.refused); otherwise the refusal is its answer at once.
func (s *session) sendRefused(r *request, sl *slot, u *upstream.Conn, prefix []byte) {
	sl.refused = true
	if !r.unlink {
		sl.resp = s.codec.appendError(sl.resp, sl.req, binary.StatusE2big, reasonTooLarge)
		s.slotBytes += len(sl.resp)
		sl.done = true
		s.advance()
		return
	}
	s.enterPath(sl, false)
	h := binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpDelete}
	s.lp.scratch = binary.AppendFrame(s.lp.scratch[:0], h, nil, nil, r.key, nil)
	f, _, _ := binary.Decode(s.lp.scratch, 0)
	_ = u.Forward(&f, prefix, sl) // a failure has already answered sl
}

// reasonTooLarge is memcached's own reason for binary status 0x0003.
const reasonTooLarge = "Too large."

// refusedAnswer answers sl, a refused write whose unlink memcached has
// answered (whatever it said), with the refusal.
func (sl *slot) refusedAnswer() {
	s := sl.s
	n := len(sl.resp)
	sl.resp = s.codec.appendError(sl.resp, sl.req, binary.StatusE2big, reasonTooLarge)
	s.slotBytes += len(sl.resp) - n
	sl.done = true
	s.advance()
}

// dropPaced drops up to avail bytes of the value of a refused write still
// to be skipped (s.skip) and returns how many: all of them when skip is
// not paced (s.skipPace nil, or an unthrottled session); otherwise as many
// as the bucket's discard gauge allows now, and when it allows fewer the
// session is held until it has room again (not a throttle hold: no place
// in the bucket's line, no wait counted). The caller discards the bytes.
func (s *session) dropPaced(avail int) int {
	want := min(avail, s.skip)
	if want <= 0 {
		return 0
	}
	n := want
	b := s.skipPace
	if b != nil && s.mode() != throttle.Unthrottled {
		got, wait := b.tb.Discard(int64(want), s.lp.srv.opts.writeUnitSize)
		n = int(got)
		if n < want {
			s.setPause(held)
			s.holdSeq++
			if wait != throttle.InfDuration {
				s.lp.schedule(s, s.lp.srv.throttle.Now()+wait)
			}
		}
	}
	s.skip -= n
	if s.skip == 0 {
		s.skipPace = nil
	}
	return n
}
