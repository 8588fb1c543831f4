package text

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"unsafe"
)

// fuzzLimit is the value bound of the fuzz targets.
const fuzzLimit = 4096

// FuzzParse feeds arbitrary streams to Parse, command after command as a
// codec would: it must never panic, n and Swallow must stay within bounds,
// every slice of a Command must lie within its command's bytes, and a
// command Parse accepts, re-encoded with AppendCommand, must parse back to
// the same command. The seed corpus (testdata/fuzz/FuzzParse) holds every
// command form, valid and invalid.
func FuzzParse(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var c, d Command
		for len(data) > 0 {
			n, err := Parse(data, fuzzLimit, &c)
			if n < 0 || n > len(data) {
				t.Fatalf("n %d of %d bytes", n, len(data))
			}
			if err != nil {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("error %v is no *Error", err)
				}
				if e.Close {
					return
				}
				if n == 0 || e.Swallow < 0 || e.Line == "" {
					t.Fatalf("refusal without close: n %d %+v", n, *e)
				}
				if e.TooLarge && (e.Swallow != c.DataLen+2 || c.DataLen <= fuzzLimit || !c.Kind.IsStorage() || len(c.Key) == 0) {
					t.Fatalf("too large: %+v, data length %d, kind %v, key %q", *e, c.DataLen, c.Kind, c.Key)
				}
				if n+e.Swallow > len(data) {
					return
				}
				data = data[n+e.Swallow:]
				continue
			}
			if n == 0 {
				if c.Need > 0 && (!c.Kind.IsStorage() || c.Need < c.DataLen+2 || c.DataLen > fuzzLimit) {
					t.Fatalf("need %d for data of %d bytes, kind %v", c.Need, c.DataLen, c.Kind)
				}
				return
			}
			checkWithin(t, &c, data[:n])
			if c.Kind.IsStorage() && (len(c.Value) > fuzzLimit || c.DataLen != len(c.Value)) {
				t.Fatalf("value of %d bytes (data length %d) over the limit", len(c.Value), c.DataLen)
			}
			enc := AppendCommand(nil, &c)
			n2, err := Parse(enc, fuzzLimit, &d)
			if err != nil || n2 != len(enc) {
				t.Fatalf("%q re-encoded %q: n %d err %v", data[:n], enc, n2, err)
			}
			if a, b := summary(&c), summary(&d); a != b {
				t.Fatalf("%q re-encoded %q:\n %s\n %s", data[:n], enc, a, b)
			}
			data = data[n:]
		}
	})
}

// checkWithin fails unless every slice of c lies within cmd.
func checkWithin(t *testing.T, c *Command, cmd []byte) {
	t.Helper()
	in := func(what string, b []byte) {
		if len(b) == 0 {
			return
		}
		lo, hi := uintptr(unsafe.Pointer(&cmd[0])), uintptr(unsafe.Pointer(&cmd[len(cmd)-1]))
		if p, q := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&b[len(b)-1])); p < lo || q > hi {
			t.Fatalf("%s %q lies outside the command", what, b)
		}
	}
	in("key", c.Key)
	in("value", c.Value)
	in("line", c.Line)
	for _, k := range c.Keys {
		in("key", k)
		if len(k) > MaxKeyLen {
			t.Fatalf("key of %d bytes", len(k))
		}
	}
	for _, a := range c.Args {
		in("arg", a)
	}
	for _, m := range c.Meta {
		in("meta flag", m.Token)
	}
	if len(c.Key) > MaxKeyLen {
		t.Fatalf("key of %d bytes", len(c.Key))
	}
}

// FuzzParseMetaResponse feeds arbitrary bytes to ParseMetaResponse: no
// panic, n within bounds, and a flagged reply re-encodes to its own bytes
// once its spacing is canonical.
func FuzzParseMetaResponse(f *testing.F) {
	for _, s := range []string{
		"VA 5 f0 s5 kfoo\r\nhello\r\n", "HD O1 kZm9v b\r\n", "EN\r\n", "NF O5\r\n", "NS\r\n", "EX c5\r\n",
		"MN\r\n", "ME foo exp=-1 la=1 cas=2 fetch=no cls=1 size=63\r\n", "CLIENT_ERROR bad command line format\r\n",
		"VA x\r\n", "VA 2\r\nabc\r\n", "VA 1\nx\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r MetaResponse
		for len(data) > 0 {
			n, err := ParseMetaResponse(data, &r)
			if err != nil || n == 0 {
				return
			}
			if n > len(data) {
				t.Fatalf("n %d of %d", n, len(data))
			}
			data = data[n:]
		}
	})
}

// FuzzParseMetaReply feeds arbitrary bytes to ParseMetaReply with an
// expected raw key length: no panic, n within bounds, the echoed key
// within the line, and no reply found complete in a prefix of its bytes
// (a reply read early would shift every later one: the property a proxy's
// shared connection depends on).
func FuzzParseMetaReply(f *testing.F) {
	for _, s := range []string{
		"VA 5 f0 s5 kfoo\r\nhello\r\n", "HD O1 kZm9v b\r\n", "HD ka:x\r\nZ c5\r\n", "VA 2 ka: b c1\r\nab\r\n",
		"ME a:x y exp=-1 size=5\r\n", "EN\r\n", "MN\r\n", "CLIENT_ERROR bad command line format\r\n",
	} {
		f.Add([]byte(s), uint8(6))
	}
	f.Fuzz(func(t *testing.T, data []byte, raw uint8) {
		var r, r2 MetaResponse
		n, err := ParseMetaReply(data, int(raw), &r)
		if err != nil || n == 0 {
			return
		}
		if n > len(data) {
			t.Fatalf("n %d of %d", n, len(data))
		}
		if r.KeyStart >= 0 && (r.KeyStart > r.KeyEnd || r.KeyEnd > len(r.Line)) {
			t.Fatalf("key at %d..%d of a %d-byte line", r.KeyStart, r.KeyEnd, len(r.Line))
		}
		for j := 0; j < n; j++ {
			if m, err := ParseMetaReply(data[:j], int(raw), &r2); m != 0 && err == nil {
				t.Fatalf("%q: a reply of %d bytes found in its first %d", data[:n], m, j)
			}
		}
	})
}

// fuzzSeeds are the seed inputs: every valid form, every refusal the
// memcached tests check (the short ones), and pipelines of them.
func fuzzSeeds() []string {
	var seeds []string
	seeds = append(seeds, validInputs...)
	for _, tc := range mcCases {
		if len(tc.in) <= fuzzLimit {
			seeds = append(seeds, tc.in)
		}
	}
	seeds = append(seeds,
		"get a\r\nset k 0 0 1\r\nx\r\nmg k v\r\nbogus\r\nmn\r\n",
		"set k 0 0 5000\r\n", "ms k 5000 T1\r\n", "set k 0 0 3\r\nab",
		"cas k 0 0 5000 0 noreply\r\nmn\r\n", "ms azE= 5000 b MA q\r\n", "append k 0 0 2000\r\nab",
		"get "+string(make([]byte, 10))+"\r\n",
	)
	return seeds
}

// TestWriteFuzzCorpus writes the seeds into testdata/fuzz/FuzzParse when
// KVT_WRITE_FUZZ_CORPUS is set (go test -run TestWriteFuzzCorpus), so that
// `go test -fuzz` starts from them and plain `go test` runs them.
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("KVT_WRITE_FUZZ_CORPUS") == "" {
		t.Skip("set KVT_WRITE_FUZZ_CORPUS to write the corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParse")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range fuzzSeeds() {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", s)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed%03d", i)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
