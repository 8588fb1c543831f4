package proxy

import "github.com/kvthrottle/kvthrottle/proto/binary"

// binaryCodec is the memcached binary protocol as a codec (codec.go):
// magic 0x80 requests, with or without flexible framing (0x08), and 0x81
// answers, or 0x18 with the units when the client negotiated
// ReportUnitUsage. It has no state of its own.
type binaryCodec struct{}

var _ codec = binaryCodec{}

func (binaryCodec) decode(buf []byte, cx codecCtx, r *request) (int, error) {
	if end, refused := binaryLargeWrite(buf, cx); refused {
		return decodeBinaryTooLarge(buf, end, r), nil
	}
	f, n, err := binary.Decode(buf, cx.maxBody)
	*r = request{frame: f, op: f.Opcode, opaque: f.Opaque, cas: f.CAS}
	if err != nil || n == 0 {
		return 0, err
	}
	r.extras, r.key, r.value = f.Extras(), f.Key(), f.Value()
	return n, nil
}

func (binaryCodec) requestLen(buf []byte, cx codecCtx) int {
	if end, refused := binaryLargeWrite(buf, cx); refused || end > len(buf) {
		// A write too large for memcached: up to its key (toolarge.go);
		// or one that may be, whose key tells.
		return end
	}
	return binary.PendingFrameLen(buf, cx.maxBody)
}

// peekLen: the header, then up to the key of a write that may be too
// large for its key's server (binaryLargeWrite), so that requestLen tells
// its length before its value is in.
func (binaryCodec) peekLen(start []byte, cx codecCtx) int {
	end, _ := binaryLargeWrite(start, cx)
	return max(binary.HeaderLen, end)
}

func (binaryCodec) starts(b byte) bool { return binary.Magic(b).IsRequest() }

func (binaryCodec) partDone(bool) {}

// passes lets every answer go: each binary request has its own.
func (binaryCodec) passes(reqHead, []byte) bool { return true }

// appendResponse appends a classic answer, memcached's own frame (with the
// client's opaque) when the answer is it unchanged, or a flexible-framing
// answer carrying the read and write units (framing-info IDs 0x01 and
// 0x02).
func (binaryCodec) appendResponse(dst []byte, q reqHead, r response) []byte {
	h := binary.Header{Magic: binary.MagicResponse, Opcode: r.op, VBucket: uint16(r.status), CAS: r.cas}
	if f := r.upstream; f != nil {
		if !r.units && len(r.key) == int(f.KeyLen) {
			n := len(dst)
			dst = append(dst, f.Raw...)
			binary.SetOpaque(dst[n:], q.opaque)
			return dst
		}
		h = f.Header
	}
	h.Opaque = q.opaque
	if !r.units {
		return binary.AppendFrame(dst, h, nil, r.extras, r.key, r.value)
	}
	var feBuf [8]byte
	fe := feBuf[:0]
	if r.readUnits > 0 {
		fe = binary.AppendFrameInfo(fe, binary.FrameInfoReadUnits, units16(r.readUnits))
	}
	if r.writeUnits > 0 {
		fe = binary.AppendFrameInfo(fe, binary.FrameInfoWriteUnits, units16(r.writeUnits))
	}
	h.Magic = binary.MagicAltResponse
	return binary.AppendFrame(dst, h, fe, r.extras, r.key, r.value)
}

func (binaryCodec) appendError(dst []byte, q reqHead, st binary.Status, reason string) []byte {
	return binary.AppendError(dst, &binary.Header{Opcode: q.op, Opaque: q.opaque}, st, reason)
}

// units16 encodes a unit count as the 16-bit big-endian value of a
// framing-info entry, saturating at 65535.
func units16(u int64) []byte {
	if u > 0xffff {
		u = 0xffff
	}
	return []byte{byte(u >> 8), byte(u)}
}
