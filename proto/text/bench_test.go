package text

import "testing"

func benchParse(b *testing.B, in string) {
	buf := []byte(in)
	var c Command
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		n, err := Parse(buf, 1<<20, &c)
		if err != nil || n != len(buf) {
			b.Fatalf("n %d err %v", n, err)
		}
	}
}

func BenchmarkParseGet(b *testing.B) { benchParse(b, "get user:1234:profile\r\n") }

func BenchmarkParseGetMulti(b *testing.B) {
	benchParse(b, "get user:1 user:2 user:3 user:4 user:5 user:6 user:7 user:8 user:9 user:10\r\n")
}

func BenchmarkParseSet(b *testing.B) {
	benchParse(b, "set user:1234:profile 0 300 100\r\n"+string(make([]byte, 100))+"\r\n")
}

func BenchmarkParseMetaGet(b *testing.B) { benchParse(b, "mg user:1234:profile v f t c k O123\r\n") }

func BenchmarkParseMetaSet(b *testing.B) {
	benchParse(b, "ms user:1234:profile 100 T300 F5 c q\r\n"+string(make([]byte, 100))+"\r\n")
}

func BenchmarkAppendValue(b *testing.B) {
	key, val := []byte("user:1234:profile"), make([]byte, 100)
	dst := make([]byte, 0, 256)
	b.ReportAllocs()
	for b.Loop() {
		dst = AppendValueCAS(dst[:0], key, 5, val, 123456)
	}
}
