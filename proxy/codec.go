package proxy

import (
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// A session is protocol-neutral (DESIGN.md section 1): a codec, one per
// client protocol, turns the client's bytes into requests and the answers
// to them back into bytes, and everything between (dispatch, tenancy and
// namespacing, throttling, holding and pausing, the response order) works
// on the neutral forms below. The binary protocol (binaryCodec) is the
// first codec; the text and meta protocols, and TLS in front of either,
// are to come in through the same seam.
//
// The neutral forms name commands by memcached's binary opcodes: they are
// the proxy's command set, since memcached speaks the binary protocol to
// the proxy, and every command a client sends becomes one of them
// upstream. What still speaks binary directly, and why:
//   - the upstream hop: request.frame is the command as a binary frame,
//     which upstream.Conn.Forward sends and binary.ValidateRequest checks
//     (a text codec is to build one); upstream answers reach slot.Deliver
//     as binary frames;
//   - telling the protocol from a connection's first byte and answering
//     input that is no binary request (session.notRequest);
//   - what only the binary protocol has: HELLO and its features
//     (non-blocking mode, units reported in flexible framing extras).

// request is one client command in neutral form. Its byte slices alias the
// client's input: they are valid while the command is dispatched, and
// whatever outlives that is copied (the slot keeps a reqHead).
type request struct {
	op     binary.Opcode // the command; op.Quiet(): no answer on success (or on a miss)
	key    []byte
	value  []byte
	extras []byte // memcached's extras for op (a SET's flags and expiry, ...)
	cas    uint64
	opaque uint32 // the client's tag, echoed in every answer

	// frame is the command as memcached's binary frame, which is what goes
	// upstream; the binary codec's is the client's own frame.
	frame binary.Frame

	// more: this request is one part of a client command whose other
	// parts follow; last: the last part of such a command (see
	// codec.decode).
	more, last bool

	// meta: a text meta command, which goes upstream as it is (the text
	// codec's metaCommand), not as frame; key is the key memcached
	// stores, value ms's data.
	meta bool

	// tooLarge: a write memcached would refuse as too large for its
	// items, which the proxy refuses itself (toolarge.go): frame and
	// value are unset, and the swallow bytes of its value that follow
	// the request are dropped unread; unlink: memcached would unlink its
	// key, which the proxy does in its place.
	tooLarge, unlink bool
	swallow          int
}

// head returns what an answer to r needs of it.
func (r *request) head() reqHead { return reqHead{op: r.op, opaque: r.opaque} }

// reqHead is what an answer needs of its request: the command and the
// client's tag. A slot keeps it until its command is answered.
type reqHead struct {
	op     binary.Opcode
	opaque uint32
}

// response is one answer in neutral form. Its byte slices alias memcached's
// frame or the proxy's own buffers: a codec copies them into the client's
// output.
type response struct {
	op     binary.Opcode
	status binary.Status
	extras []byte
	key    []byte // as the client knows it: without the bucket's namespace
	value  []byte
	cas    uint64

	// units asks for the units the command was charged, readUnits and
	// writeUnits, to go with the answer (the client asked for them with
	// HELLO ReportUnitUsage before it sent the command).
	units                 bool
	readUnits, writeUnits int64

	// upstream is memcached's frame the answer came in, nil for the
	// proxy's own answers: a binary codec may pass it on as it is when the
	// fields above are its own (the data type and such are in it too).
	upstream *binary.Frame

	// meta is memcached's reply to a meta command, strip the length of
	// the bucket's namespace in the key it echoes, metaRaw the length of
	// that key, namespace included; nil for every other answer.
	meta    *text.MetaResponse
	strip   int
	metaRaw int
}

// codecCtx is what a codec is told of its session with each request it
// reads (the session's state may change between two): a codec holds no
// pointer back to its session.
type codecCtx struct {
	// maxBody bounds a request's body (its bytes past the header).
	maxBody int
	// prefix is the length of the bucket's namespace, which the keys get
	// upstream; -1 while the session has no bucket.
	prefix int
	// textAuth: the client must authenticate and has not, which it may do
	// with memcached's text authentication (a set carrying "user
	// password").
	textAuth bool
	// itemMax is the least item size limit known of the servers
	// (upstream.LoopPool.LeastItemSizeMax): a write whose namespaced key
	// and value are no longer fits every server whose limit is known; 0:
	// none known, or no bucket (nothing is refused).
	itemMax int
	// items tells the limit of the server a key goes to: a write whose
	// namespaced key and value are longer than it is refused by the proxy
	// (toolarge.go); nil: itemMax is every key's.
	items itemLimits
}

// itemLimits is where a codec learns the item size limit of a key's
// server (upstream.LoopPool.ItemSizeMaxFor; 0: not known). key is the key
// as the pool routes it: the client's, without the namespace, base64
// decoded.
type itemLimits interface {
	ItemSizeMaxFor(key []byte) int64
}

// tooLarge reports whether memcached, the key's server, would refuse a
// write of key (as itemLimits takes it) whose namespaced key and value
// are size bytes, as too large. It asks cx.items only for writes over
// cx.itemMax (most fit every server).
func (cx *codecCtx) tooLarge(key []byte, size int) bool {
	if cx.itemMax <= 0 || size <= cx.itemMax {
		return false
	}
	if cx.items == nil {
		return true
	}
	limit := cx.items.ItemSizeMaxFor(key)
	return limit > 0 && int64(size) > limit
}

// codecCtx is what the session's codec needs to know of it to read the
// next request, within maxBody.
func (s *session) codecCtx(maxBody int) codecCtx {
	cx := codecCtx{maxBody: maxBody, prefix: -1, textAuth: s.needAuth && s.user == nil}
	if s.bkt != nil {
		cx.prefix = len(*s.bkt.prefix.Load())
		cx.itemMax, cx.items = int(s.lp.pool.LeastItemSizeMax()), s.lp.pool
	}
	return cx
}

// codec is one client protocol. A session holds one for its whole life.
// Its methods run on the session's loop and must not allocate per request
// on the common path: a pointer they get must point into the session (or
// other heap memory), since an interface call makes its target escape.
type codec interface {
	// decode reads the request at the start of buf into r and returns its
	// length. n == 0 and a nil error: buf holds no whole request yet. An
	// error: the input is no valid request and the stream cannot be
	// resumed; r's op and opaque are what could be read, to answer it.
	//
	// A client command may become several requests (a text multi-key
	// get: one per key, then its end): decode then sets r.more and
	// returns n == 0 for every part but the last, whose n is the whole
	// command's length; the codec remembers which part comes next, and is
	// asked again at the same place (after a hold, too) until the last.
	decode(buf []byte, cx codecCtx, r *request) (n int, err error)

	// requestLen returns the length of the request at the start of buf
	// once buf tells it (with the binary protocol, its header has arrived
	// and is valid within cx.maxBody), else 0.
	requestLen(buf []byte, cx codecCtx) int

	// peekLen is how many bytes at the start of a request requestLen
	// needs, start being what is buffered of it (nil at first): the
	// binary header, then the key too of a write that may be too large
	// for its key's server; 0: everything buffered (a protocol whose
	// requests are told by their first line).
	peekLen(start []byte, cx codecCtx) int

	// starts reports whether b can begin a request of this protocol; a
	// session answers input that cannot (notRequest).
	starts(b byte) bool

	// partDone tells the codec that the part of a client command decode
	// gave last (request.more or .last) was dispatched: the next decode
	// gives the next part.
	partDone(last bool)

	// appendResponse appends resp, the answer to the request q, to dst.
	appendResponse(dst []byte, q reqHead, resp response) []byte

	// appendError appends a status-only answer to q: st, with reason as
	// its human-readable explanation ("" for none).
	appendError(dst []byte, q reqHead, st binary.Status, reason string) []byte

	// passes is told of every reply the two methods above made, in
	// request order, as it goes to the client (answers are made as they
	// arrive, which may be before the commands ahead of them are
	// answered), and reports whether it goes: the one place where a
	// protocol whose failed command part ends its command's reply (a
	// text retrieval's error line: memcached sends nothing after it)
	// drops what the command's later parts answered. reply is the whole
	// answer to one request, or a piece of a streamed one (STAT).
	passes(q reqHead, reply []byte) bool
}
