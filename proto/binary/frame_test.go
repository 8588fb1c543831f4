package binary

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	raw := setReq("hello", "world!", 0xdeadbeef)
	f, n, err := Decode(raw, 1024)
	if err != nil || n != len(raw) {
		t.Fatalf("Decode = n %d err %v, want %d nil", n, err, len(raw))
	}
	if f.Opcode != OpSet || f.Opaque != 0xdeadbeef || f.CAS != 42 {
		t.Fatalf("header mismatch: %+v", f.Header)
	}
	if string(f.Key()) != "hello" || string(f.Value()) != "world!" || len(f.Extras()) != 8 {
		t.Fatalf("parts: key %q value %q extras %d", f.Key(), f.Value(), len(f.Extras()))
	}
	if f.Extras()[3] != 7 {
		t.Fatalf("extras not preserved: %v", f.Extras())
	}
}

func TestPartialFrames(t *testing.T) {
	raw := setReq("k", "some value", 1)
	for i := 0; i < len(raw); i++ {
		f, n, err := Decode(raw[:i], 1024)
		if err != nil || n != 0 || f.Raw != nil {
			t.Fatalf("prefix %d: n %d err %v raw %v, want need-more", i, n, err, f.Raw)
		}
		if i >= HeaderLen && f.FrameLen() != len(raw) {
			t.Fatalf("prefix %d: FrameLen %d, want %d", i, f.FrameLen(), len(raw))
		}
	}
}

func TestBackToBack(t *testing.T) {
	var stream []byte
	for i := 0; i < 100; i++ {
		stream = append(stream, getReq("key", uint32(i))...)
		stream = append(stream, setReq("k2", "v", uint32(1000+i))...)
	}
	stream = append(stream, getReq("tail", 7)[:26]...) // a partial one at the end
	var got []uint32
	for {
		f, n, err := Decode(stream, 1024)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		got = append(got, f.Opaque)
		stream = stream[n:]
	}
	if len(got) != 200 || got[0] != 0 || got[1] != 1000 || got[199] != 1099 {
		t.Fatalf("got %d frames: %v...", len(got), got[:4])
	}
	if len(stream) != 26 {
		t.Fatalf("leftover %d bytes, want 26", len(stream))
	}
}

func TestBodyOverLimit(t *testing.T) {
	h := Header{Magic: MagicRequest, Opcode: OpSet, BodyLen: 1<<32 - 1}
	b := make([]byte, HeaderLen)
	h.Put(b)
	_, n, err := Decode(b, 20<<20)
	if !errors.Is(err, ErrFrameTooLarge) || n != 0 {
		t.Fatalf("4 GiB body: n %d err %v, want ErrFrameTooLarge", n, err)
	}
}

func TestBadHeaders(t *testing.T) {
	cases := map[string]Header{
		"magic":       {Magic: 0x42},
		"lengths":     {Magic: MagicRequest, KeyLen: 10, BodyLen: 5},
		"alt lengths": {Magic: MagicAltRequest, FrameExtLen: 3, ExtLen: 2, BodyLen: 4},
	}
	for name, h := range cases {
		b := make([]byte, HeaderLen+16)
		h.Put(b)
		if _, _, err := Decode(b, 1024); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestFlexibleFraming(t *testing.T) {
	fe := AppendFrameInfo(nil, 0x02, []byte{0, 0, 0, 9})      // some id with 4 bytes
	fe = AppendFrameInfo(fe, 20, bytes.Repeat([]byte{1}, 20)) // escaped id and length
	raw := AppendFrame(nil, Header{Magic: MagicAltRequest, Opcode: OpGet, Opaque: 5}, fe, nil, []byte("key"), nil)
	f, n, err := Decode(raw, 1024)
	if err != nil || n != len(raw) {
		t.Fatal(n, err)
	}
	if string(f.Key()) != "key" || !bytes.Equal(f.FramingExtras(), fe) {
		t.Fatalf("key %q fe %v", f.Key(), f.FramingExtras())
	}
	var ids []uint16
	var lens []int
	if err := ParseFramingExtras(f.FramingExtras(), func(fi FrameInfo) { ids = append(ids, fi.ID); lens = append(lens, len(fi.Data)) }); err != nil {
		t.Fatal(err)
	}
	if len(ids) != 2 || ids[0] != 2 || ids[1] != 20 || lens[0] != 4 || lens[1] != 20 {
		t.Fatalf("ids %v lens %v", ids, lens)
	}
	if err := ParseFramingExtras([]byte{0x25, 1}, nil); !errors.Is(err, ErrBadFramingExtras) {
		t.Fatalf("truncated entry: %v", err)
	}
}

func TestAppendError(t *testing.T) {
	req := Header{Magic: MagicRequest, Opcode: OpSet, Opaque: 99}
	b := AppendError(nil, &req, StatusEinval, "bad thing")
	f, n, err := Decode(b, 0)
	if err != nil || n != len(b) {
		t.Fatal(err)
	}
	if f.Magic != MagicResponse || f.Status() != StatusEinval || f.Opaque != 99 || string(f.Value()) != "bad thing" {
		t.Fatalf("%+v %q", f.Header, f.Value())
	}
}

func TestOpcodeTable(t *testing.T) {
	if !OpGetQ.Quiet() || OpGetQ.Loud() != OpGet || OpGet.Quiet() || OpGet.Loud() != OpGet {
		t.Fatal("quiet table wrong for GETQ/GET")
	}
	if OpHello.Memcached() || !OpGATKQ.Memcached() || OpGATKQ.Class() != ClassReadWrite {
		t.Fatal("class table wrong")
	}
	if Opcode(0xee).Known() || Opcode(0xee).String() != "0xee" {
		t.Fatal("unknown opcode handling")
	}
}

func BenchmarkDecode(b *testing.B) {
	raw := setReq("some:key:1234", string(bytes.Repeat([]byte("x"), 100)), 1)
	b.ReportAllocs()
	b.SetBytes(int64(len(raw)))
	for i := 0; i < b.N; i++ {
		f, n, err := Decode(raw, 1<<20)
		if err != nil || n != len(raw) || len(f.Key()) == 0 {
			b.Fatal("decode")
		}
	}
}

func BenchmarkEncodeResponse(b *testing.B) {
	req := Header{Magic: MagicRequest, Opcode: OpGet, Opaque: 1}
	val := bytes.Repeat([]byte("x"), 100)
	extras := []byte{0, 0, 0, 0}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = AppendResponse(buf[:0], &req, StatusSuccess, extras, nil, val)
	}
}

func TestValidateRequest(t *testing.T) {
	mk := func(op Opcode, extras, key, value []byte) *Frame {
		raw := AppendFrame(nil, Header{Magic: MagicRequest, Opcode: op}, nil, extras, key, value)
		f, _, err := Decode(raw, 0)
		if err != nil {
			t.Fatal(err)
		}
		return &f
	}
	k, v := []byte("k"), []byte("v")
	ok := []*Frame{
		mk(OpGet, nil, k, nil), mk(OpSet, make([]byte, 8), k, v), mk(OpSet, make([]byte, 8), k, nil),
		mk(OpAppend, nil, k, v), mk(OpIncrement, make([]byte, 20), k, nil), mk(OpTouch, make([]byte, 4), k, nil),
		mk(OpFlush, nil, nil, nil), mk(OpFlush, make([]byte, 4), nil, nil), mk(OpStat, nil, nil, nil),
		mk(OpStat, nil, []byte("items"), nil), mk(OpVersion, nil, nil, nil), mk(OpHello, nil, []byte("x"), v),
	}
	for _, f := range ok {
		if err := ValidateRequest(f); err != nil {
			t.Errorf("%s: %v", f.Opcode, err)
		}
	}
	bad := []*Frame{
		mk(OpGet, []byte{1}, k, nil), mk(OpGet, nil, nil, nil), mk(OpGet, nil, k, v), mk(OpSet, make([]byte, 4), k, v),
		mk(OpSet, make([]byte, 8), nil, v), mk(OpDelete, []byte{1}, k, nil), mk(OpIncrement, make([]byte, 8), k, nil),
		mk(OpVersion, nil, k, nil), mk(OpNoop, nil, nil, v), mk(OpVerbosity, nil, nil, nil), mk(OpStat, []byte{1}, nil, nil),
	}
	for _, f := range bad {
		err := ValidateRequest(f)
		if !errors.Is(err, ErrMalformedRequest) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s ext %d key %d value %d: %v, want ErrMalformedRequest", f.Opcode, f.ExtLen, f.KeyLen, f.ValueLen(), err)
		}
	}
}
