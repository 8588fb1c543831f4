package proxy

import (
	"bytes"
	"errors"
	"testing"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// The binary codec turns a request frame into the neutral request, field
// by field, keeps the frame for the upstream hop, and says when a frame is
// incomplete or invalid (with what an answer needs).
func TestBinaryCodecDecode(t *testing.T) {
	t.Parallel()
	var c codec = binaryCodec{}
	extras := []byte{0, 0, 0, 7, 0, 0, 0, 60}
	frame := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpSetQ, Opaque: 42, CAS: 9}, nil, extras, []byte("key"), []byte("value"))
	in := append(append([]byte{}, frame...), 0x80) // and the first byte of the next

	var r request
	n, err := c.decode(in, codecCtx{maxBody: 1 << 20}, &r)
	if err != nil || n != len(frame) {
		t.Fatalf("decode: n %d err %v, want %d", n, err, len(frame))
	}
	if r.op != mc.OpSetQ || r.opaque != 42 || r.cas != 9 || string(r.key) != "key" || string(r.value) != "value" || !bytes.Equal(r.extras, extras) {
		t.Errorf("decoded %+v", r)
	}
	if !bytes.Equal(r.frame.Raw, frame) || r.head() != (reqHead{op: mc.OpSetQ, opaque: 42}) {
		t.Errorf("frame %x, head %+v", r.frame.Raw, r.head())
	}
	if got := c.requestLen(in[:mc.HeaderLen], codecCtx{maxBody: 1 << 20}); got != len(frame) {
		t.Errorf("requestLen of its header: %d, want %d", got, len(frame))
	}

	if n, err := c.decode(frame[:len(frame)-1], codecCtx{maxBody: 1 << 20}, &r); n != 0 || err != nil || r.key != nil {
		t.Errorf("incomplete frame: n %d err %v key %q; want 0, nil, none", n, err, r.key)
	}
	if n, err := c.decode(frame, codecCtx{maxBody: 8}, &r); n != 0 || !errors.Is(err, mc.ErrFrameTooLarge) || r.op != mc.OpSetQ || r.opaque != 42 {
		t.Errorf("frame over maxBody: n %d err %v op %s opaque %d; want ErrFrameTooLarge with the op and opaque", n, err, r.op, r.opaque)
	}
	if got := c.requestLen(frame[:mc.HeaderLen], codecCtx{maxBody: 8}); got != 0 {
		t.Errorf("requestLen of a header over maxBody: %d, want 0", got)
	}
}

// A write too large for memcached's items (toolarge.go) is told by its
// header: requestLen asks for the frame up to its key only, and decode
// gives the refused write (its value to be dropped, and whether memcached
// would unlink the key); a write that fits, a malformed one, one whose key
// the namespace makes too long, or no known limit, go the usual way.
func TestBinaryCodecTooLarge(t *testing.T) {
	t.Parallel()
	var c codec = binaryCodec{}
	extras := []byte{0, 0, 0, 7, 0, 0, 0, 60}
	frame := func(op mc.Opcode, extras []byte, key string, n int) []byte {
		return mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: op, Opaque: 5, CAS: 9}, nil, extras, []byte(key), bytes.Repeat([]byte{'v'}, n))
	}
	cx := codecCtx{maxBody: 1 << 20, prefix: 8, itemMax: 64}
	for _, tc := range []struct {
		op     mc.Opcode
		extras []byte
		unlink bool
	}{
		{mc.OpSet, extras, true}, {mc.OpSetQ, extras, true}, {mc.OpAddQ, extras, false},
		{mc.OpReplace, extras, false}, {mc.OpAppendQ, nil, false}, {mc.OpPrepend, nil, false},
	} {
		in := frame(tc.op, tc.extras, "key", 100)
		head := mc.HeaderLen + len(tc.extras) + 3
		if got := c.requestLen(in[:mc.HeaderLen], cx); got != head {
			t.Errorf("%s: requestLen %d, want %d (up to the key)", tc.op, got, head)
		}
		var r request
		if n, err := c.decode(in[:head-1], cx, &r); n != 0 || err != nil {
			t.Errorf("%s without all its key: n %d err %v; want 0, nil", tc.op, n, err)
		}
		n, err := c.decode(in[:head+10], cx, &r)
		if n != head || err != nil || !r.tooLarge || r.unlink != tc.unlink || r.swallow != 100 || string(r.key) != "key" ||
			r.head() != (reqHead{op: tc.op, opaque: 5}) || r.cas != 9 {
			t.Errorf("%s: n %d err %v, decoded %+v", tc.op, n, err, r)
		}
	}
	for what, in := range map[string][]byte{
		"fits":               frame(mc.OpSet, extras, "key", 64-8-3),
		"no extras":          frame(mc.OpSet, nil, "key", 100),
		"key too long":       frame(mc.OpSet, extras, string(bytes.Repeat([]byte{'k'}, 243)), 100),
		"not a value write":  frame(mc.OpIncrement, make([]byte, 20), "key", 0),
		"over maxBody first": frame(mc.OpSet, extras, "key", 2<<20),
	} {
		if got, want := c.requestLen(in[:mc.HeaderLen], cx), mc.PendingFrameLen(in[:mc.HeaderLen], cx.maxBody); got != want {
			t.Errorf("%s: requestLen %d, want the whole frame's %d", what, got, want)
		}
	}
	none := cx
	none.itemMax = 0
	if got := c.requestLen(frame(mc.OpSet, extras, "key", 100)[:mc.HeaderLen], none); got != mc.HeaderLen+8+3+100 {
		t.Errorf("no known item size: requestLen %d, want the whole frame", got)
	}
}

// The binary codec's answers: memcached's own frame with the client's
// opaque when it is passed on unchanged, a rebuilt one when the key lost
// its namespace, flexible framing with the units when they were asked for,
// and the proxy's own answers as memcached would give them.
func TestBinaryCodecAnswers(t *testing.T) {
	t.Parallel()
	var c codec = binaryCodec{}
	q := reqHead{op: mc.OpGetK, opaque: 7}
	flags := []byte{0, 0, 0, 1}
	up := func(key string) *mc.Frame {
		raw := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicResponse, Opcode: mc.OpGetK, Opaque: 1234, CAS: 5, DataType: 1}, nil, flags, []byte(key), []byte("v"))
		f, _, _ := mc.Decode(raw, 0)
		return &f
	}
	want := func(h mc.Header, fe []byte, key string) []byte {
		return mc.AppendFrame(nil, h, fe, flags, []byte(key), []byte("v"))
	}
	h := mc.Header{Magic: mc.MagicResponse, Opcode: mc.OpGetK, Opaque: 7, CAS: 5, DataType: 1}

	f := up("k")
	if got := c.appendResponse(nil, q, response{op: f.Opcode, extras: f.Extras(), key: f.Key(), value: f.Value(), cas: 5, upstream: f}); !bytes.Equal(got, want(h, nil, "k")) {
		t.Errorf("unchanged: %x\nwant %x", got, want(h, nil, "k"))
	}
	f = up("ns:k")
	if got := c.appendResponse(nil, q, response{op: f.Opcode, extras: f.Extras(), key: f.Key()[3:], value: f.Value(), cas: 5, upstream: f}); !bytes.Equal(got, want(h, nil, "k")) {
		t.Errorf("namespace stripped: %x\nwant %x", got, want(h, nil, "k"))
	}
	fe := mc.AppendFrameInfo(mc.AppendFrameInfo(nil, mc.FrameInfoReadUnits, []byte{0, 3}), mc.FrameInfoWriteUnits, []byte{0xff, 0xff})
	hu := h
	hu.Magic = mc.MagicAltResponse
	if got := c.appendResponse(nil, q, response{op: f.Opcode, extras: f.Extras(), key: f.Key()[3:], value: f.Value(), cas: 5, upstream: f, units: true, readUnits: 3, writeUnits: 1 << 20}); !bytes.Equal(got, want(hu, fe, "k")) {
		t.Errorf("with units: %x\nwant %x", got, want(hu, fe, "k"))
	}

	qh := mc.Header{Opcode: q.op, Opaque: q.opaque}
	if got, w := c.appendResponse(nil, q, response{op: q.op, status: mc.StatusSuccess, key: []byte("pid"), value: []byte("1")}), mc.AppendResponse(nil, &qh, mc.StatusSuccess, nil, []byte("pid"), []byte("1")); !bytes.Equal(got, w) {
		t.Errorf("the proxy's answer: %x\nwant %x", got, w)
	}
	if got, w := c.appendError(nil, q, mc.StatusEinval, "why"), mc.AppendError(nil, &qh, mc.StatusEinval, "why"); !bytes.Equal(got, w) {
		t.Errorf("the proxy's error: %x\nwant %x", got, w)
	}
}

// Decoding a request and encoding answers through the codec interface
// allocates nothing, given pointers into heap memory (as the session's
// fields are) and output buffers that have grown: the hot path stays
// allocation-free behind the seam.
func TestBinaryCodecAllocatesNothing(t *testing.T) {
	frame := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpGet, Opaque: 1}, nil, nil, []byte("key"), nil)
	raw := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicResponse, Opcode: mc.OpGetK}, nil, []byte{0, 0, 0, 0}, []byte("ns:key"), bytes.Repeat([]byte("v"), 100))
	type state struct { // stands for the session and the upstream connection
		c    codec
		req  request
		up   mc.Frame
		out  []byte
		body []byte
	}
	st := &state{c: binaryCodec{}, out: make([]byte, 0, 4096), body: []byte(`{"next_tick_us":1}`)}
	st.up, _, _ = mc.Decode(raw, 0)
	allocs := testing.AllocsPerRun(1000, func() {
		st.out = st.out[:0]
		if n, err := st.c.decode(frame, codecCtx{maxBody: 1 << 20}, &st.req); n == 0 || err != nil {
			t.Fatal(n, err)
		}
		q := st.req.head()
		f := &st.up
		st.out = st.c.appendResponse(st.out, q, response{op: f.Opcode, status: f.Status(), extras: f.Extras(), key: f.Key()[3:], value: f.Value(), upstream: f})
		st.out = st.c.appendResponse(st.out, q, response{op: f.Opcode, key: f.Key(), value: f.Value(), upstream: f, units: true, readUnits: 1})
		st.out = st.c.appendResponse(st.out, q, response{op: q.op, status: mc.StatusEWouldThrottle, value: st.body})
		st.out = st.c.appendError(st.out, q, mc.StatusSuccess, "")
	})
	if allocs != 0 {
		t.Errorf("%v allocations per request, want 0", allocs)
	}
}

// BenchmarkBinaryCodec measures one request decoded and its answer
// encoded (a GET hit whose key loses its namespace) through the codec
// interface.
func BenchmarkBinaryCodec(b *testing.B) {
	frame := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpGet, Opaque: 1}, nil, nil, []byte("bench:key:01"), nil)
	raw := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicResponse, Opcode: mc.OpGet}, nil, []byte{0, 0, 0, 0}, nil, bytes.Repeat([]byte("v"), 100))
	type state struct {
		c   codec
		req request
		up  mc.Frame
		out []byte
	}
	st := &state{c: binaryCodec{}, out: make([]byte, 0, 4096)}
	st.up, _, _ = mc.Decode(raw, 0)
	b.ReportAllocs()
	for b.Loop() {
		st.out = st.out[:0]
		_, _ = st.c.decode(frame, codecCtx{maxBody: 1 << 20}, &st.req)
		f := &st.up
		st.out = st.c.appendResponse(st.out, st.req.head(), response{op: f.Opcode, status: f.Status(), extras: f.Extras(), key: f.Key(), value: f.Value(), upstream: f})
	}
}
