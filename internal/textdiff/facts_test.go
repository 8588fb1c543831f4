package textdiff

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// converse writes in to a new connection to addr and returns what the
// server answers until it closes the connection (closed) or, if want is
// not empty, sends want. Ten seconds without either fails the test: a
// liveness bound (a local memcached answers in microseconds), not a
// latency check.
func converse(t *testing.T, addr, in, want string) (out string, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	wrote := make(chan struct{})
	defer func() {
		_ = c.Close() // ends the write, if the server stopped reading
		<-wrote
	}()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		defer close(wrote)
		_, _ = c.Write([]byte(in))
	}()
	br := bufio.NewReader(c)
	var sb strings.Builder
	for {
		b, err := br.ReadByte()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("%.40q: no %q and no close within 10 s; got %q", in, want, sb.String())
			}
			return sb.String(), err == io.EOF || strings.Contains(err.Error(), "reset")
		}
		sb.WriteByte(b)
		if want != "" && strings.HasSuffix(sb.String(), want) {
			return sb.String(), false
		}
	}
}

// TestMemcachedFacts checks the behaviours of memcached the generator
// relies on (see the package comment), so that a memcached that behaves
// otherwise fails here rather than as a puzzling difference.
func TestMemcachedFacts(t *testing.T) {
	m := testmc.Start(t, MemcachedFlags...)
	for _, tc := range []struct {
		name, in, want string
		closed         bool
	}{
		{"quit answers what came before", "version\r\nquit\r\nversion\r\n", "VERSION 1.6", true},
		{"line over 16 KiB closes", strings.Repeat("x", 17000) + "\r\nmn\r\n", "", true},
		{"get line over 16 KiB is answered", "get" + strings.Repeat(" k", 10000) + "\r\nmn\r\n", "END\r\nMN\r\n", false},
		{"key too long: data read as a command", "set " + strings.Repeat("K", 251) + " 0 0 3\r\nzab\r\nmn\r\n",
			"CLIENT_ERROR bad command line format\r\nERROR\r\nMN\r\n", false},
		{"bad data chunk: the surplus read as a command", "set k 0 0 3\r\nzabzz\r\nmn\r\n", "CLIENT_ERROR bad data chunk\r\nERROR\r\nMN\r\n", false},
		{"too large: data swallowed", "set k 0 0 2000000\r\n" + strings.Repeat("z", 2000000) + "\r\nmn\r\n",
			"SERVER_ERROR object too large for cache\r\nMN\r\n", false},
		{"bad base64 key: data swallowed", "ms !!!! 3 b\r\nzab\r\nmn\r\n", "CLIENT_ERROR error decoding key\r\nMN\r\n", false},
	} {
		want := tc.want
		if tc.closed {
			want = "" // read to the close
		}
		out, closed := converse(t, m.Addr, tc.in, want)
		if closed != tc.closed || !strings.HasPrefix(out, tc.want) || !tc.closed && out != tc.want {
			t.Errorf("%s: got %q (closed %v), want %q (closed %v)", tc.name, out, closed, tc.want, tc.closed)
		}
		if tc.closed && (strings.Count(out, "\r\n") > 1 || tc.want == "" && out != "") {
			t.Errorf("%s: got %q before the close", tc.name, out)
		}
	}
}
