package binary

import "testing"

// FuzzDecode feeds arbitrary streams to the decoder: it must never panic,
// never return a frame that does not fit its input, and re-encoding a
// decoded frame's header must reproduce its bytes.
func FuzzDecode(f *testing.F) {
	f.Add(getReq("key", 1))
	f.Add(setReq("k", "v", 2))
	f.Add(append(getReq("a", 1), setReq("b", "c", 2)...))
	f.Add([]byte{0x80})
	f.Add(make([]byte, HeaderLen))
	f.Fuzz(func(t *testing.T, data []byte) {
		const limit = 1 << 16
		for len(data) > 0 {
			fr, n, err := Decode(data, limit)
			if err != nil || n == 0 {
				return
			}
			if n > len(data) || n != fr.FrameLen() || fr.BodyLen > limit {
				t.Fatalf("n %d len %d framelen %d", n, len(data), fr.FrameLen())
			}
			_ = fr.FramingExtras()
			_ = fr.Extras()
			_ = fr.Key()
			_ = fr.Value()
			_ = ParseFramingExtras(fr.FramingExtras(), nil)
			var hb [HeaderLen]byte
			fr.Header.Put(hb[:])
			if string(hb[:]) != string(fr.Raw[:HeaderLen]) {
				t.Fatalf("header round trip: %x vs %x", hb, fr.Raw[:HeaderLen])
			}
			data = data[n:]
		}
	})
}
