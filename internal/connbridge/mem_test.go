package connbridge

import (
	"crypto/tls"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testcerts"
)

// BenchmarkIdleBridgeMemory measures what an idle bridge costs beyond its
// TLS connection: it makes b.N TLS connections over loopback, then bridges
// each and passes one request and its answer through, and reports the
// growth of the heap and of goroutine stacks per bridge once idle.
// (Each connection holds 4 file descriptors in this process.)
func BenchmarkIdleBridgeMemory(b *testing.B) {
	ca := testcerts.NewCA(b, "bench CA")
	cert := ca.Server(b).TLS(b)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	sconf := &tls.Config{Certificates: []tls.Certificate{cert}}
	cconf := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
	n := b.N
	servers := make([]*tls.Conn, 0, n)
	clients := make([]*tls.Conn, 0, n)
	for i := 0; i < n; i++ {
		ch := make(chan *tls.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				ch <- nil
				return
			}
			tc := tls.Server(c, sconf)
			if tc.Handshake() != nil {
				ch <- nil
				return
			}
			ch <- tc
		}()
		cc, err := tls.Dial("tcp", ln.Addr().String(), cconf)
		if err != nil {
			b.Fatal(err)
		}
		sc := <-ch
		if sc == nil {
			b.Fatal("server handshake failed")
		}
		servers, clients = append(servers, sc), append(clients, cc)
	}
	before := memNow()
	bridges := make([]*Bridge, 0, n)
	buf := make([]byte, 64)
	b.ResetTimer()
	for i := 0; i < n; i++ {
		br, err := New(servers[i], Options{})
		if err != nil {
			b.Fatal(err)
		}
		bridges = append(bridges, br)
		if _, err := clients[i].Write(buf[:24]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(br.Loop(), buf[:24]); err != nil {
			b.Fatal(err)
		}
		if _, err := br.Loop().Write(buf[:30]); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(clients[i], buf[:30]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	time.Sleep(100 * time.Millisecond)
	after := memNow()
	b.ReportMetric(float64(after.heap-before.heap)/float64(n), "heap-B/bridge")
	b.ReportMetric(float64(after.stack-before.stack)/float64(n), "stack-B/bridge")
	for i := range bridges {
		bridges[i].Loop().Close()
		clients[i].Close()
		<-bridges[i].Done()
	}
}

type memSample struct{ heap, stack uint64 }

func memNow() memSample {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return memSample{heap: m.HeapInuse, stack: m.StackInuse}
}
