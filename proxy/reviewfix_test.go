package proxy

import (
	"bytes"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A refused SASL re-authentication logs the connection out, and with no
// default bucket it is back under the pre-authentication bounds: a large
// frame gets Einval and the connection closes, as before it had
// authenticated.
func TestFailedReauthRestoresPreAuthBounds(t *testing.T) {
	p := startProxy(t, testConfig{proxy: "default_bucket = \"\"", tail: tenantTail(t)})
	c := login(t, p.Addr, "alice")
	if r, err := c.Set([]byte("big"), bytes.Repeat([]byte("x"), 100<<10)); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("100 KB SET when authenticated: %s", r.Status())
	}
	if err := c.AuthPlain("alice", "wrong"); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	r, err := c.Set([]byte("big"), bytes.Repeat([]byte("x"), 100<<10))
	if err != nil || r.Status() != mc.StatusEinval {
		t.Fatalf("100 KB SET after a refused re-authentication: %v %+v, want Einval", err, r)
	}
	c.Timeout = 2 * time.Second
	if _, err := c.Read(); err == nil {
		t.Fatal("the connection stayed open after Einval for a frame too large before authentication")
	}
}

// Log lines any client can cause at will are sampled: the first and every
// thousandth at their level, the rest at debug.
func TestLogSample(t *testing.T) {
	var buf bytes.Buffer
	l := zerolog.New(&buf).Level(zerolog.InfoLevel)
	var ls logSample
	for i := 0; i < 2001; i++ {
		ls.event(&l, zerolog.WarnLevel).Msg("authentication failed")
	}
	lines := strings.Count(buf.String(), "\n")
	if lines != 3 || !strings.Contains(buf.String(), `"total":2001`) {
		t.Fatalf("%d lines at warn for 2001 events, want 3 (the 1st, 1001st and 2001st): %s", lines, buf.String())
	}
}

// One source may hold only a quarter of a loop's unauthenticated share
// (at least 4): a host opening connections it never authenticates pushes
// out its own oldest past that, never another host's, and a client from
// another host gets in and authenticates.
func TestUnauthenticatedPerSource(t *testing.T) {
	const maxConns = 40 // share 36 on the one loop, a source 9
	p := startProxy(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 40", tail: tenantTail(t), loops: 1})
	limit := unauthSourceLimit(int(unauthLimit(maxConns)))
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 3 * limit {
		c, err := d.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	eventually(t, 5*time.Second, "the proxy to take in every connection from 127.0.0.2", func() bool {
		return p.unauthConns.Load()+int64(p.unauthEvicted.Load()+p.refusedSource.Load()) == int64(3*limit)
	})
	if n := p.unauthConns.Load(); n != int64(limit) {
		t.Fatalf("%d unauthenticated connections from one source, want its limit %d", n, limit)
	}
	a := login(t, p.Addr, "alice") // from 127.0.0.1
	if r, err := a.Set([]byte("k"), []byte("v")); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("SET by a client from another host: %s", r.Status())
	}
	if n := p.unauthConns.Load(); n != int64(limit) {
		t.Fatalf("%d unauthenticated connections after another host's login, want %d (none of 127.0.0.2's pushed out)", n, limit)
	}
}

// Among one source's unauthenticated connections, those that have sent
// nothing are pushed out before one that has begun talking: a client
// behind the same address as a host flooding silent connections (NAT, a
// shared application host) keeps its connection while it authenticates.
func TestSilentConnectionsGoFirst(t *testing.T) {
	const maxConns = 40 // share 36 on the one loop, a source 9
	p := startProxy(t, testConfig{proxy: "default_bucket = \"\"\nmax_connections = 40", tail: tenantTail(t), loops: 1})
	limit := unauthSourceLimit(int(unauthLimit(maxConns)))
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	client, err := d.Dial("tcp", p.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	noop := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpNoop, Opaque: 9}, nil, nil, nil, nil)
	talk := func(when string) {
		t.Helper()
		if _, err := client.Write(noop); err != nil {
			t.Fatalf("NOOP %s: %v", when, err)
		}
		if h, err := readStatus(t, client, 5*time.Second); err != nil || h.Opcode != mc.OpNoop || h.Opaque != 9 {
			t.Fatalf("NOOP %s: %v %+v", when, err, h)
		}
	}
	talk("on opening")
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			_ = c.Close()
		}
	}()
	for range 3 * limit {
		c, err := d.Dial("tcp", p.Addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
	}
	eventually(t, 5*time.Second, "the proxy to take in every connection from 127.0.0.2", func() bool {
		return p.unauthConns.Load()+int64(p.unauthEvicted.Load()+p.refusedSource.Load()) == int64(1+3*limit)
	})
	if n := p.unauthEvicted.Load(); n != uint64(2*limit+1) {
		t.Fatalf("%d connections pushed out, want %d", n, 2*limit+1)
	}
	talk(fmt.Sprintf("after %d silent connections from the same address", 3*limit))
}
