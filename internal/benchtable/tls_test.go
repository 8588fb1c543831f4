package main

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"
)

const sampleLimits = `Limit                     Soft Limit           Hard Limit           Units     
Max cpu time              unlimited            unlimited            seconds   
Max processes             unlimited            unlimited            processes 
Max open files            19999                20000                files     
Max locked memory         8388608              8388608              bytes     
`

func TestParseNofileLimits(t *testing.T) {
	soft, hard, err := parseNofileLimits(sampleLimits)
	if err != nil || soft != 19999 || hard != 20000 {
		t.Fatalf("got %d %d %v, want 19999 20000", soft, hard, err)
	}
	soft, hard, err = parseNofileLimits("Max open files            unlimited            unlimited            files\n")
	if err != nil || soft != -1 || hard != -1 {
		t.Fatalf("unlimited: got %d %d %v, want -1 -1", soft, hard, err)
	}
	if _, _, err := parseNofileLimits("Max cpu time unlimited unlimited seconds\n"); err == nil {
		t.Fatal("no Max open files line: want an error")
	}
}

func TestTLSMemPlan(t *testing.T) {
	// This machine: hard limit 20000, 3 descriptors per TLS connection.
	top, reason := tlsMemPlan(10000, 19999, 19, 3, 19000)
	if top != 6000 {
		t.Errorf("20000 fds: top %d, want 6000 (the largest thousand that fits with 1000 fds to spare)", top)
	}
	if !strings.Contains(reason, "RLIMIT_NOFILE is 19,999") || !strings.Contains(reason, "30,019") {
		t.Errorf("reason %q should name the limit and the descriptors needed", reason)
	}
	// Enough descriptors: the requested count, no reason.
	if top, reason := tlsMemPlan(10000, 65536, 19, 3, 60000); top != 10000 || reason != "" {
		t.Errorf("65536 fds: got %d %q, want 10000 and no reason", top, reason)
	}
	if top, reason := tlsMemPlan(10000, -1, 19, 3, 60000); top != 10000 || reason != "" {
		t.Errorf("unlimited: got %d %q, want 10000 and no reason", top, reason)
	}
	// This program's own room limits too.
	if top, reason := tlsMemPlan(10000, 65536, 19, 3, 4500); top != 4000 || !strings.Contains(reason, "this program") {
		t.Errorf("client room 4500: got %d %q, want 4000 and a reason naming this program", top, reason)
	}
	// Small counts are not rounded down to nothing.
	if top, _ := tlsMemPlan(10000, 4000, 19, 3, 60000); top != 993 {
		t.Errorf("4000 fds: got %d, want 993", top)
	}
}

func TestExtrapolate(t *testing.T) {
	est, slope := extrapolate(tlsMemPoint{conns: 3000, rssKB: 100000}, tlsMemPoint{conns: 6000, rssKB: 190000}, 10000)
	if slope != 30 || est != 310000 {
		t.Fatalf("got %d kB at slope %v, want 310000 kB at 30 kB per connection", est, slope)
	}
}

func TestAddedRatio(t *testing.T) {
	us := time.Microsecond
	if r, ok := addedRatio(50*us, 70*us, 80*us); !ok || r != 1.5 {
		t.Errorf("got %v %v, want 1.5", r, ok)
	}
	if _, ok := addedRatio(50*us, 50*us, 80*us); ok {
		t.Error("plaintext adding nothing: want no ratio")
	}
}

// The certificates verify for 127.0.0.1 with the client configuration,
// and the [tls] table names them.
func TestBenchCerts(t *testing.T) {
	c, err := makeBenchCerts(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	done := make(chan error, 1)
	go func() {
		s, err := ln.Accept()
		if err == nil {
			err = s.(*tls.Conn).Handshake()
			s.Close()
		}
		done <- err
	}()
	conn, err := tlsDialer(ln.Addr().String(), c.client)()
	if err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	conn.Close()
	if err := <-done; err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	toml := c.toml("127.0.0.1:1234")
	for _, want := range []string{"[tls]", `listen = "127.0.0.1:1234"`, c.certFile, c.keyFile} {
		if !strings.Contains(toml, want) {
			t.Errorf("[tls] table %q lacks %q", toml, want)
		}
	}
}
