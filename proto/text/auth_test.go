package text

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

var authCases = []struct{ name, in string }{
	{"good", "set k 0 0 9\r\nuser pass\r\nmn\r\n"},
	{"good then commands", "set k 0 0 9\r\nuser pass\r\nget a\r\nbogus\r\n"},
	{"wrong password", "set k 0 0 9\r\nuser nope\r\nmn\r\n"},
	{"wrong then good", "set k 0 0 9\r\nuser nope\r\nset x 1 2 9\r\nuser pass\r\nmn\r\n"},
	{"noreply ignored", "set k 0 0 9 noreply\r\nuser pass\r\n"},
	{"extra words", "set k 0 0 13\r\nuser pass xyz\r\n"},
	{"bare newline", "set k 0 0 9\nuser pass\r\n"},
	{"other command", "get k\r\n"},
	{"version", "version\r\n"},
	{"mn", "mn\r\n"},
	{"too few tokens", "set k 0 0\r\n"},
	{"bad length", "set k 0 0 x\r\n"},
	{"negative length", "set k 0 0 -1\r\n"},
	{"not set", "add k 0 0 9\r\nuser pass\r\n"},
	{"one word", "set k 0 0 4\r\nuser\r\n"},
	{"empty block", "set k 0 0 0\r\n\r\n"},
	{"bad termination", "set k 0 0 9\r\nuser passXX\r\n"},
	{"empty line", "\r\n"},
	{"long line closes", strings.Repeat("x", 3000)},
	{"long get line closes", "get " + strings.Repeat("k ", 1500)},
}

// TestAuthMatchesMemcached checks ParseAuth against a memcached that
// requires text authentication (-Y) with the user "user", password "pass".
func TestAuthMatchesMemcached(t *testing.T) {
	authFile := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(authFile, []byte("user:pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := testmc.Start(t, "-Y", authFile)
	for _, tc := range authCases {
		t.Run(tc.name, func(t *testing.T) {
			want, closes := modelAuth(t, []byte(tc.in))
			conn, err := net.DialTimeout("tcp", srv.Addr, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			go func() { _, _ = conn.Write([]byte(tc.in)) }()
			var got []byte
			closed := false
			if closes {
				got, err = io.ReadAll(conn)
				closed = err == nil
			} else {
				got = make([]byte, len(want))
				var m int
				m, err = io.ReadFull(conn, got)
				got = got[:m]
				closed = errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
			}
			if !bytes.Equal(got, want) || closed != closes {
				t.Errorf("input %.80q\nmemcached: %q closed %v\nParseAuth: %q closed %v", tc.in, got, closed, want, closes)
			}
		})
	}
}

// modelAuth runs ParseAuth, then Parse once authenticated, over in and
// returns memcached's replies by them. While a connection is
// unauthenticated memcached keeps a single reply and overwrites it with
// each attempt's (proto_text.c only starts a new reply object when it has
// none), so of attempts it reads in one batch, as the test sends them, only
// the last one's reply is sent.
func modelAuth(t *testing.T, in []byte) ([]byte, bool) {
	t.Helper()
	var a Auth
	var last []byte
	for len(in) > 0 {
		n, err := ParseAuth(in, testMaxValue, &a)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is no *Error", err)
			}
			if e.Close {
				return e.AppendReply(last), true
			}
			last = e.AppendReply(nil)
			in = in[n:]
			continue
		}
		if n == 0 {
			t.Fatalf("input ends inside an attempt: %q", in)
		}
		in = in[n:]
		if string(a.User) == "user" && string(a.Password) == "pass" {
			rest, closes := modelReplies(t, in)
			return append([]byte(AuthStored), rest...), closes
		}
		last = []byte(AuthFailure)
	}
	return last, false
}

// TestAuthOneByOneMatchesMemcached sends attempts one at a time, waiting
// for each answer, as clients do: then every attempt is answered.
func TestAuthOneByOneMatchesMemcached(t *testing.T) {
	authFile := filepath.Join(t.TempDir(), "auth")
	if err := os.WriteFile(authFile, []byte("user:pass\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := testmc.Start(t, "-Y", authFile)
	conn, err := net.DialTimeout("tcp", srv.Addr, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	steps := []string{
		"set k 0 0 9\r\nuser nope\r\n", "get k\r\n", "set k 0 0 9\r\nuser passXX", "\r\n",
		"set k 0 0 4\r\nuser\r\n", "set k 0 0 x\r\n", "set k 0 0 9\r\nuser pass\r\n",
	}
	for _, in := range steps {
		want, _ := modelAuth(t, []byte(in))
		if _, err := conn.Write([]byte(in)); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%q: memcached %q (%v), ParseAuth %q", in, got, err, want)
		}
	}
}

func TestParseAuth(t *testing.T) {
	in := []byte("set k 0 0 12 noreply\r\nalice s3cret\r\n")
	var a Auth
	for i := 0; i < len(in); i++ {
		if n, err := ParseAuth(in[:i], 0, &a); n != 0 || err != nil {
			t.Fatalf("prefix %d: n %d err %v", i, n, err)
		}
		if i >= 22 && a.Need != len(in) {
			t.Fatalf("prefix %d: need %d", i, a.Need)
		}
	}
	n, err := ParseAuth(in, 0, &a)
	if n != len(in) || err != nil || string(a.User) != "alice" || string(a.Password) != "s3cret" {
		t.Fatalf("n %d err %v user %q password %q", n, err, a.User, a.Password)
	}
	if a := testing.AllocsPerRun(100, func() { _, _ = ParseAuth(in, 0, &a) }); a != 0 {
		t.Errorf("%v allocs per ParseAuth", a)
	}
	var e *Error
	if _, err := ParseAuth([]byte("set k 0 0 100\r\n"), 10, &a); !errors.As(err, &e) || !e.Close || !e.Limit {
		t.Errorf("block over the bound: %v", err)
	}
}
