package binary

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderLen is the size of every frame header in bytes.
const HeaderLen = 24

// MaxKeyLen is the longest key memcached accepts, in bytes.
const MaxKeyLen = 250

// Header is a decoded frame header. KeyLen and FrameExtLen are normalised:
// for classic magics FrameExtLen is 0.
type Header struct {
	Magic       Magic
	Opcode      Opcode
	FrameExtLen uint8  // framing extras length (flexible magics only)
	KeyLen      uint16 // at most 255 with flexible magics
	ExtLen      uint8
	DataType    uint8
	VBucket     uint16 // the vbucket of a request, the Status of a response
	BodyLen     uint32
	Opaque      uint32
	CAS         uint64
}

// Status returns the status of a response header (the vbucket field).
func (h *Header) Status() Status { return Status(h.VBucket) }

// FrameLen returns the size of the whole frame: header plus body.
func (h *Header) FrameLen() int { return HeaderLen + int(h.BodyLen) }

// ValueLen returns the body length left for the value, which is negative
// when the header is inconsistent (Validate reports that).
func (h *Header) ValueLen() int {
	return int(h.BodyLen) - int(h.FrameExtLen) - int(h.ExtLen) - int(h.KeyLen)
}

// Errors returned by the decoder. They are sentinel values so callers can
// choose a response with errors.Is.
var (
	// ErrBadMagic: the first byte is not one of the four known magics.
	ErrBadMagic = errors.New("binary: bad magic")
	// ErrFrameTooLarge: the body length exceeds the decoder's limit.
	ErrFrameTooLarge = errors.New("binary: frame too large")
	// ErrBadLengths: framing extras, extras and key do not fit in the body.
	ErrBadLengths = errors.New("binary: inconsistent header lengths")
)

// ParseHeader decodes the first HeaderLen bytes of b. It checks only that
// b is long enough; use Validate for consistency.
func ParseHeader(b []byte) (Header, error) {
	var h Header
	if len(b) < HeaderLen {
		return h, fmt.Errorf("binary: header needs %d bytes, have %d", HeaderLen, len(b))
	}
	h.Magic = Magic(b[0])
	h.Opcode = Opcode(b[1])
	if h.Magic.IsAlt() {
		h.FrameExtLen = b[2]
		h.KeyLen = uint16(b[3])
	} else {
		h.KeyLen = binary.BigEndian.Uint16(b[2:4])
	}
	h.ExtLen = b[4]
	h.DataType = b[5]
	h.VBucket = binary.BigEndian.Uint16(b[6:8])
	h.BodyLen = binary.BigEndian.Uint32(b[8:12])
	h.Opaque = binary.BigEndian.Uint32(b[12:16])
	h.CAS = binary.BigEndian.Uint64(b[16:24])
	return h, nil
}

// Validate checks the magic, that the body length is at most maxBody bytes
// (0 means no limit) and that the parts fit in the body.
func (h *Header) Validate(maxBody int) error {
	if !h.Magic.Valid() {
		return fmt.Errorf("%w 0x%02x", ErrBadMagic, uint8(h.Magic))
	}
	if maxBody > 0 && uint64(h.BodyLen) > uint64(maxBody) {
		return fmt.Errorf("%w: body of %d bytes exceeds limit of %d", ErrFrameTooLarge, h.BodyLen, maxBody)
	}
	if h.ValueLen() < 0 {
		return fmt.Errorf("%w: framing extras %d + extras %d + key %d > body %d",
			ErrBadLengths, h.FrameExtLen, h.ExtLen, h.KeyLen, h.BodyLen)
	}
	if !h.Magic.IsAlt() && h.FrameExtLen != 0 {
		return fmt.Errorf("%w: framing extras with classic magic", ErrBadLengths)
	}
	if h.Magic.IsAlt() && h.KeyLen > 0xff {
		return fmt.Errorf("%w: key length %d with flexible magic", ErrBadLengths, h.KeyLen)
	}
	return nil
}

// Put encodes h into the first HeaderLen bytes of b, which must be long
// enough. With a flexible magic, KeyLen must be at most 255.
func (h *Header) Put(b []byte) {
	_ = b[HeaderLen-1]
	b[0] = byte(h.Magic)
	b[1] = byte(h.Opcode)
	if h.Magic.IsAlt() {
		b[2] = h.FrameExtLen
		b[3] = byte(h.KeyLen)
	} else {
		binary.BigEndian.PutUint16(b[2:4], h.KeyLen)
	}
	b[4] = h.ExtLen
	b[5] = h.DataType
	binary.BigEndian.PutUint16(b[6:8], h.VBucket)
	binary.BigEndian.PutUint32(b[8:12], h.BodyLen)
	binary.BigEndian.PutUint32(b[12:16], h.Opaque)
	binary.BigEndian.PutUint64(b[16:24], h.CAS)
}

// Frame is one whole frame: its decoded header and its raw bytes (header
// included). Raw aliases the decoder's input; copy it to keep it.
type Frame struct {
	Header
	Raw []byte
}

func (f *Frame) body() []byte { return f.Raw[HeaderLen:] }

// FramingExtras returns the flexible framing extras (empty for classic magic).
func (f *Frame) FramingExtras() []byte { return f.body()[:f.FrameExtLen] }

// Extras returns the extras.
func (f *Frame) Extras() []byte {
	o := int(f.FrameExtLen)
	return f.body()[o : o+int(f.ExtLen)]
}

// Key returns the key.
func (f *Frame) Key() []byte {
	o := int(f.FrameExtLen) + int(f.ExtLen)
	return f.body()[o : o+int(f.KeyLen)]
}

// Value returns the value.
func (f *Frame) Value() []byte {
	return f.body()[int(f.FrameExtLen)+int(f.ExtLen)+int(f.KeyLen):]
}

// Decode decodes one frame from the start of buf.
//
// It returns the frame and its length n when buf holds a whole frame. When
// buf holds a valid header but not the whole body, it returns n == 0, a nil
// error and the header in f (Raw nil), so the caller knows how many bytes to
// wait for (f.FrameLen()). When buf is shorter than a header it returns
// n == 0 and a zero frame. A header that fails Validate(maxBody) returns the
// header and the error, and the stream cannot be resynchronised.
//
// Decode allocates nothing; f.Raw aliases buf.
func Decode(buf []byte, maxBody int) (f Frame, n int, err error) {
	if len(buf) < HeaderLen {
		return f, 0, nil
	}
	f.Header, _ = ParseHeader(buf)
	if err := f.Header.Validate(maxBody); err != nil {
		return f, 0, err
	}
	n = f.FrameLen()
	if len(buf) < n {
		return f, 0, nil
	}
	f.Raw = buf[:n:n]
	return f, n, nil
}

// AppendFrame appends a frame with header h and the given parts to dst and
// returns the extended slice. It sets h's length fields from the parts.
func AppendFrame(dst []byte, h Header, framingExtras, extras, key, value []byte) []byte {
	h.FrameExtLen = uint8(len(framingExtras))
	h.ExtLen = uint8(len(extras))
	h.KeyLen = uint16(len(key))
	h.BodyLen = uint32(len(framingExtras) + len(extras) + len(key) + len(value))
	n := len(dst)
	dst = grow(dst, HeaderLen)
	h.Put(dst[n:])
	dst = append(dst, framingExtras...)
	dst = append(dst, extras...)
	dst = append(dst, key...)
	return append(dst, value...)
}

// AppendResponse appends a classic response to the request described by req
// with the given status, extras, key and value.
func AppendResponse(dst []byte, req *Header, status Status, extras, key, value []byte) []byte {
	return AppendFrame(dst, Header{
		Magic:   MagicResponse,
		Opcode:  req.Opcode,
		VBucket: uint16(status),
		Opaque:  req.Opaque,
	}, nil, extras, key, value)
}

// AppendError appends a response to req with the given status and a
// human-readable reason as its value.
func AppendError(dst []byte, req *Header, status Status, reason string) []byte {
	n := len(dst)
	dst = AppendResponse(dst, req, status, nil, nil, nil)
	dst = append(dst, reason...)
	binary.BigEndian.PutUint32(dst[n+8:n+12], uint32(len(reason)))
	return dst
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) >= n {
		return b[:len(b)+n]
	}
	nb := make([]byte, len(b)+n, 2*cap(b)+n)
	copy(nb, b)
	return nb
}

// SetOpaque overwrites the opaque field of the encoded header at b[0:24].
func SetOpaque(b []byte, opaque uint32) { binary.BigEndian.PutUint32(b[12:16], opaque) }

// SetStatus overwrites the status field of the encoded response header at b.
func SetStatus(b []byte, s Status) { binary.BigEndian.PutUint16(b[6:8], uint16(s)) }

// FrameInfo is one entry of a frame's flexible framing extras.
type FrameInfo struct {
	ID   uint16
	Data []byte
}

// Framing-info IDs of responses, as Couchbase numbers them (response IDs
// are not request IDs: 1 in a request is a durability requirement).
const (
	FrameInfoServerDuration uint16 = 0x00 // response: server time, 2-byte encoded (not sent by kvthrottle)
	FrameInfoReadUnits      uint16 = 0x01 // response: read units used, uint16
	FrameInfoWriteUnits     uint16 = 0x02 // response: write units used, uint16
	FrameInfoThrottled      uint16 = 0x03 // response: microseconds the command was throttled (not sent by kvthrottle)
)

// ErrBadFramingExtras is the error of flexible framing extras that do not
// parse.
var ErrBadFramingExtras = errors.New("binary: malformed framing extras")

// ParseFramingExtras calls fn for each entry in b, the framing extras of a
// frame. Each entry starts with a byte whose high nibble is the ID and low
// nibble the length; the value 15 in either escapes to one more byte holding
// the value minus 15. It returns ErrBadFramingExtras (wrapped) when an entry
// runs past the end of b.
func ParseFramingExtras(b []byte, fn func(FrameInfo)) error {
	for len(b) > 0 {
		id, ln := uint16(b[0]>>4), int(b[0]&0x0f)
		b = b[1:]
		if id == 15 {
			if len(b) < 1 {
				return fmt.Errorf("%w: truncated escaped id", ErrBadFramingExtras)
			}
			id += uint16(b[0])
			b = b[1:]
		}
		if ln == 15 {
			if len(b) < 1 {
				return fmt.Errorf("%w: truncated escaped length", ErrBadFramingExtras)
			}
			ln += int(b[0])
			b = b[1:]
		}
		if ln > len(b) {
			return fmt.Errorf("%w: entry %d wants %d bytes, %d left", ErrBadFramingExtras, id, ln, len(b))
		}
		if fn != nil {
			fn(FrameInfo{ID: id, Data: b[:ln]})
		}
		b = b[ln:]
	}
	return nil
}

// AppendFrameInfo appends one framing-extras entry to dst.
func AppendFrameInfo(dst []byte, id uint16, data []byte) []byte {
	idn, ln := id, len(data)
	var b0 byte
	var esc []byte
	if idn < 15 {
		b0 = byte(idn) << 4
	} else {
		b0 = 15 << 4
		esc = append(esc, byte(idn-15))
	}
	if ln < 15 {
		b0 |= byte(ln)
	} else {
		b0 |= 15
		esc = append(esc, byte(ln-15))
	}
	dst = append(dst, b0)
	dst = append(dst, esc...)
	return append(dst, data...)
}

// PendingFrameLen returns the length of the frame whose header starts buf
// when buf holds its valid header, and 0 otherwise. Readers use it to skip
// work until a large frame has fully arrived.
func PendingFrameLen(hdr []byte, maxBody int) int {
	if len(hdr) < HeaderLen {
		return 0
	}
	h, _ := ParseHeader(hdr)
	if h.Validate(maxBody) != nil {
		return 0
	}
	return h.FrameLen()
}
