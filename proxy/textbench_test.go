package proxy

import (
	"bytes"
	"testing"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// BenchmarkTextRequest measures one text command through the text codec as
// a session drives it: the command line parsed (proto/text), translated to
// the binary request that goes upstream (buildTextRequest), and
// memcached's answer encoded as the text reply, with 100-byte values as
// memcaslap's text load uses. get: "get KEY" becomes a GETKQ and an END
// (a NOOP), answered "VALUE ... END"; set: "set KEY 0 0 100" becomes a
// SET, answered "STORED". Its allocs/op is what the bench table holds to
// 0 for the text hot path (TestTextCodecAllocatesNothing asserts it).
func BenchmarkTextRequest(b *testing.B) {
	value := bytes.Repeat([]byte("v"), 100)
	flags := []byte{0, 0, 0, 0}
	b.Run("get", func(b *testing.B) {
		in := []byte("get memcaslap:key:0000000001\r\n")
		want := "VALUE memcaslap:key:0000000001 0 100\r\n" + string(value) + "\r\nEND\r\n"
		benchText(b, in, want, func(c *textCodec, dst []byte, r *request) []byte {
			return c.appendResponse(dst, r.head(), response{op: r.op, status: binary.StatusSuccess, extras: flags, key: r.key, value: value})
		})
	})
	b.Run("set", func(b *testing.B) {
		in := append([]byte("set memcaslap:key:0000000001 0 0 100\r\n"), value...)
		in = append(in, "\r\n"...)
		benchText(b, in, "STORED\r\n", func(c *textCodec, dst []byte, r *request) []byte {
			return c.appendResponse(dst, r.head(), response{op: r.op, status: binary.StatusSuccess})
		})
	})
}

// benchText decodes in, one whole command, part by part as a session does,
// and appends each part's answer (answer gives a hit's or a success's
// text; a retrieval's END part is answered as the session answers its
// NOOP); the replies to one command must be want.
func benchText(b *testing.B, in []byte, want string, answer func(c *textCodec, dst []byte, r *request) []byte) {
	type state struct {
		c   textCodec
		r   request
		out []byte
	}
	st := &state{out: make([]byte, 0, 4096)}
	c := &st.c
	one := func() {
		st.out = st.out[:0]
		for {
			n, err := c.decode(in, codecCtx{maxBody: 1 << 20, prefix: -1}, &st.r)
			if err != nil {
				b.Fatal(err)
			}
			if st.r.op == binary.OpNoop {
				st.out = c.appendError(st.out, st.r.head(), binary.StatusSuccess, "")
			} else {
				st.out = answer(c, st.out, &st.r)
			}
			if st.r.more || st.r.last {
				c.partDone(st.r.last)
			}
			if n > 0 {
				if n != len(in) {
					b.Fatalf("decoded %d of %d bytes", n, len(in))
				}
				return
			}
		}
	}
	one() // grow the codec's buffers
	if string(st.out) != want {
		b.Fatalf("reply %q, want %q", st.out, want)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(in)))
	for b.Loop() {
		one()
	}
}
