package connbridge

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
)

// tlsPair returns a server-side *tls.Conn with its handshake done and the
// client's end.
func tlsPair(t *testing.T) (server, client *tls.Conn) {
	t.Helper()
	ca := testcerts.NewCA(t, "bridge CA")
	cert := ca.Server(t).TLS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   *tls.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			ch <- res{nil, err}
			return
		}
		tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{cert}})
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		err = tc.Handshake()
		_ = tc.SetDeadline(time.Time{})
		ch <- res{tc, err}
	}()
	client, err = tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { client.Close(); r.c.Close() })
	return r.c, client
}

// echo copies the loop side back to itself until EOF, then closes it.
func echo(c net.Conn) {
	_, _ = io.Copy(c, c)
	c.Close()
}

func waitDone(t *testing.T, b *Bridge) {
	t.Helper()
	select {
	case <-b.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("bridge did not end")
	}
}

// TestBridgeEcho sends through the bridge, in both directions, a large
// payload and a burst of small TLS records (which the TLS layer reads from
// the socket together: the pump must empty them all without the socket
// becoming readable again), then closes the client: the loop side reads
// EOF, and the bridge ends, holding no buffer.
func TestBridgeEcho(t *testing.T) {
	server, client := tlsPair(t)
	b, err := New(server, Options{})
	if err != nil {
		t.Fatal(err)
	}
	go echo(b.Loop())

	// A burst of small records, written together.
	var burst bytes.Buffer
	for i := 0; i < 200; i++ {
		burst.WriteString("0123456789")
	}
	bw := &recordWriter{c: client, size: 10}
	if _, err := bw.Write(burst.Bytes()); err != nil {
		t.Fatal(err)
	}
	readBack(t, client, burst.Bytes())

	big := make([]byte, 1<<20+123)
	_, _ = rand.Read(big)
	go func() { _, _ = client.Write(big) }()
	readBack(t, client, big)

	// Idle: no pump holds a buffer.
	deadline := time.Now().Add(5 * time.Second)
	for buffersOut.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d buffers held by an idle bridge", buffersOut.Load())
		}
		time.Sleep(time.Millisecond)
	}

	_ = client.CloseWrite() // close_notify: the loop side reads EOF, echo closes it
	waitDone(t, b)
	// The bridge closed the TLS connection cleanly: the client reads EOF.
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("client read after the bridge ended: %v, want EOF", err)
	}
}

// recordWriter writes p as TLS records of size bytes each, back to back.
type recordWriter struct {
	c    *tls.Conn
	size int
}

func (w *recordWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += w.size {
		if _, err := w.c.Write(p[off:min(off+w.size, len(p))]); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

func readBack(t *testing.T, c *tls.Conn, want []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read back %d bytes: %v", len(want), err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("echoed bytes differ")
	}
}

// TestBridgeLoopCloses: when the loop side closes, the client gets a clean
// TLS close (EOF) and the bridge ends.
func TestBridgeLoopCloses(t *testing.T) {
	server, client := tlsPair(t)
	b, err := New(server, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Loop().Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	b.Loop().Close()
	readBack(t, client, []byte("bye"))
	if _, err := client.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("client read: %v, want EOF", err)
	}
	waitDone(t, b)
}

// TestBridgeClose: Close ends a bridge whose peers are both silent, and
// OnDone runs; no goroutine is left.
func TestBridgeClose(t *testing.T) {
	server, client := tlsPair(t)
	before := runtime.NumGoroutine()
	called := make(chan struct{})
	b, err := New(server, Options{OnDone: func() { close(called) }})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	waitDone(t, b)
	<-called
	b.Loop().Close()
	_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); err == nil {
		t.Fatal("client read succeeded after Close")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before the bridge", runtime.NumGoroutine(), before)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestBridgeBufferedInput: input the TLS connection holds already when the
// bridge starts (its socket empty) reaches the loop side without waiting
// for more.
func TestBridgeBufferedInput(t *testing.T) {
	server, client := tlsPair(t)
	if _, err := client.Write([]byte("abcdef")); err != nil {
		t.Fatal(err)
	}
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	head := make([]byte, 2)
	if _, err := io.ReadFull(server, head); err != nil || string(head) != "ab" {
		t.Fatalf("server read %q %v", head, err)
	}
	_ = server.SetReadDeadline(time.Time{})
	b, err := New(server, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	_ = b.Loop().SetReadDeadline(time.Now().Add(5 * time.Second))
	rest := make([]byte, 4)
	if _, err := io.ReadFull(b.Loop(), rest); err != nil || string(rest) != "cdef" {
		t.Fatalf("loop side read %q %v, want the buffered \"cdef\"", rest, err)
	}
}
