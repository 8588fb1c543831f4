package proxy

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// textExchange writes in to the proxy at addr and reads until the reply
// ends with want's last line, or the deadline.
func textExchange(t *testing.T, addr, in string, wantLen int) string {
	t.Helper()
	c := dialDeadline(t, addr)
	if _, err := io.WriteString(c, in); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var out strings.Builder
	buf := make([]byte, 4096)
	for out.Len() < wantLen {
		n, err := r.Read(buf)
		out.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return out.String()
}

// TestTextClientThroughProxy: a text client (first byte not a binary
// magic) is served through the proxy with memcached's replies: storage,
// multi-key get with hits and misses, gets, incr, delete, errors answered
// as memcached answers them, noreply, version.
func TestTextClientThroughProxy(t *testing.T) {
	p := startProxy(t, testConfig{})
	in := "set a 0 0 5\r\nhello\r\n" +
		"get a missing a\r\n" +
		"bogus\r\n" +
		"set n 3 0 1 noreply\r\n7\r\n" +
		"incr n 5\r\n" +
		"incr a 1\r\n" +
		"add a 0 0 1\r\nx\r\n" +
		"delete a\r\n" +
		"delete a\r\n" +
		"get n\r\n"
	want := "STORED\r\n" +
		"VALUE a 0 5\r\nhello\r\nVALUE a 0 5\r\nhello\r\nEND\r\n" +
		"ERROR\r\n" +
		"12\r\n" +
		"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n" +
		"NOT_STORED\r\n" +
		"DELETED\r\n" +
		"NOT_FOUND\r\n" +
		"VALUE n 3 2\r\n12\r\nEND\r\n"
	if got := textExchange(t, p.Addr, in, len(want)); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}

// TestTextAuthentication: with authentication required, a text client
// authenticates as memcached's -Y does (a set carrying "user password")
// and lands in its user's bucket; other commands before that, and wrong
// passwords, get memcached's replies.
func TestTextAuthentication(t *testing.T) {
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tenantTail(t)})
	in := "get k\r\n" +
		"set x 0 0 15\r\nalice wrong-pw1\r\n" +
		"set x 0 0 14\r\nalice alice-pw\r\n" +
		"set k 0 0 3\r\nabc\r\n" +
		"get k\r\n"
	want := "CLIENT_ERROR unauthenticated\r\n" +
		"CLIENT_ERROR authentication failure\r\n" +
		"STORED\r\n" +
		"STORED\r\n" +
		"VALUE k 0 3\r\nabc\r\nEND\r\n"
	if got := textExchange(t, p.Addr, in, len(want)); got != want {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
	bob := login(t, p.Addr, "bob")
	defer bob.Close()
	if r, err := bob.Get([]byte("k")); err != nil || r.Status() != 1 {
		t.Errorf("bob reads alice's key: %v %v", r, err)
	}
	alice := login(t, p.Addr, "alice")
	defer alice.Close()
	if r, err := alice.Get([]byte("k")); err != nil || string(r.Value) != "abc" {
		t.Errorf("alice (binary) reads %v %v, want the text client's value", r, err)
	}
}

// TestTextCodecAllocatesNothing: decoding a get or a set and writing their
// replies allocate nothing once the codec's buffers have grown.
func TestTextCodecAllocatesNothing(t *testing.T) {
	c := &textCodec{}
	cx := codecCtx{maxBody: 1 << 20, prefix: -1}
	get := []byte("get key1 key2\r\n")
	set := []byte("set key 1 0 5\r\nhello\r\n")
	var r request
	out := make([]byte, 0, 4096)
	run := func() {
		for {
			n, err := c.decode(get, cx, &r)
			if err != nil {
				t.Fatal(err)
			}
			out = c.appendResponse(out[:0], r.head(), response{status: binary.StatusSuccess, key: r.key, value: []byte("v"), extras: []byte{0, 0, 0, 1}})
			c.partDone(r.last)
			if n > 0 {
				break
			}
		}
		if _, err := c.decode(set, cx, &r); err != nil {
			t.Fatal(err)
		}
		out = c.appendResponse(out[:0], r.head(), response{status: binary.StatusSuccess})
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("%v allocations per get and set", n)
	}
}

// TestTextRefusalsBoundedBeforeAuth: an unauthenticated text client that
// sends line after refused line and never reads is closed once its
// answers pile up, as a binary client sending commands would be: refusals
// are answers like any other.
func TestTextRefusalsBoundedBeforeAuth(t *testing.T) {
	p := startProxy(t, testConfig{proxy: `default_bucket = ""`, tail: tenantTail(t)})
	c, err := net.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	line := []byte(strings.Repeat("x\r\n", 64<<10/3))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.SetWriteDeadline(time.Now().Add(clientPatience))
		for i := 0; i < 256; i++ { // 16 MiB of refused lines
			if _, err := c.Write(line); err != nil {
				return // closed by the proxy
			}
		}
	}()
	<-done
	_ = c.SetReadDeadline(time.Now().Add(clientPatience))
	n, err := io.Copy(io.Discard, c)
	if err != nil {
		t.Fatalf("the connection was not closed (read %d bytes of answers): %v", n, err)
	}
	if n > 64<<20 {
		t.Errorf("%d bytes of answers before the close", n)
	}
}

// TestFlushOrdersLaterCommands: a flush_all is ordered before every
// command read after it, on any connection, as in memcached. One client
// sends flush_all; while its epoch is being persisted (held there by a test
// hook) another client sends a set: the set must wait for the flush and
// land in the new namespace, where a get then finds it. Before the bucket
// waited for its FLUSH, the set was answered at once in the old namespace
// and lost when the flush took effect: gomemcache's own test suite, which
// sends flush_all on one connection and closes it, failed that way.
func TestFlushOrdersLaterCommands(t *testing.T) {
	entered, release, waited := make(chan struct{}), make(chan struct{}), make(chan struct{}, 1)
	var once sync.Once
	testHookFlushSave = func() {
		once.Do(func() { close(entered); <-release })
	}
	testHookFlushWait = func() {
		select {
		case waited <- struct{}{}:
		default:
		}
	}
	t.Cleanup(func() { testHookFlushSave, testHookFlushWait = nil, nil })
	p := startProxy(t, testConfig{})
	defer once.Do(func() {})
	a, b := dialText(t, p.Addr), dialText(t, p.Addr)
	if _, err := io.WriteString(b.c, "set old 0 0 1\r\no\r\n"); err != nil {
		t.Fatal(err)
	}
	if line := b.line(t); line != "STORED\r\n" {
		t.Fatalf("set old: %q", line)
	}
	if _, err := io.WriteString(a.c, "flush_all\r\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the FLUSH never reached its state file write")
	}
	if _, err := io.WriteString(b.c, "set k 0 0 1\r\nx\r\nget k old\r\n"); err != nil {
		t.Fatal(err)
	}
	answered := make(chan string, 1)
	go func() { answered <- b.line(t) }()
	select {
	case <-waited:
	case line := <-answered:
		close(release)
		t.Fatalf("set answered %q before the flush was in effect", line)
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("the set neither waited nor was answered")
	}
	close(release)
	if line := a.line(t); line != "OK\r\n" {
		t.Fatalf("flush_all: %q", line)
	}
	var got strings.Builder
	got.WriteString(<-answered)
	for !strings.HasSuffix(got.String(), "END\r\n") {
		got.WriteString(b.line(t))
	}
	if want := "STORED\r\nVALUE k 0 1\r\nx\r\nEND\r\n"; got.String() != want {
		t.Errorf("after the flush got %q, want %q", got.String(), want)
	}
}
