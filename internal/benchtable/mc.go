package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A small memcached binary-protocol client for the load generator and the
// idle connections, on top of the project's codec.

const (
	opGet     = mc.OpGet
	opSet     = mc.OpSet
	opNoop    = mc.OpNoop
	headerLen = mc.HeaderLen
)

// appendRequest appends a classic request frame.
func appendRequest(b []byte, op mc.Opcode, opaque uint32, extras, key, value []byte) []byte {
	return mc.AppendFrame(b, mc.Header{Magic: mc.MagicRequest, Opcode: op, Opaque: opaque}, nil, extras, key, value)
}

// setExtras are SET's flags and expiry (both 0).
var setExtras = make([]byte, 8)

// readResponse reads one response frame into hdr, discarding its body, and
// returns its status and opaque.
func readResponse(r *bufio.Reader, hdr *[headerLen]byte) (status uint16, opaque uint32, err error) {
	if _, err = io.ReadFull(r, hdr[:]); err != nil {
		return 0, 0, err
	}
	h, _ := mc.ParseHeader(hdr[:])
	if h.Magic != mc.MagicResponse {
		return 0, 0, fmt.Errorf("bad response magic 0x%02x", uint8(h.Magic))
	}
	if _, err = r.Discard(int(h.BodyLen)); err != nil {
		return 0, 0, err
	}
	return uint16(h.Status()), h.Opaque, nil
}

// roundTrip sends one request and reads its response.
func roundTrip(c net.Conn, r *bufio.Reader, req []byte) (uint16, error) {
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	var hdr [headerLen]byte
	st, _, err := readResponse(r, &hdr)
	return st, err
}

// dialer opens one client connection (TCP, or TLS with the handshake
// done) within its timeout.
type dialer func() (net.Conn, error)

// tcpDialer dials addr over TCP.
func tcpDialer(addr string) dialer {
	return func() (net.Conn, error) { return net.DialTimeout("tcp", addr, 5*time.Second) }
}

// tlsDialer dials addr over TCP and completes a TLS handshake with conf.
func tlsDialer(addr string, conf *tls.Config) dialer {
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 10 * time.Second}, Config: conf}
	return func() (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return d.DialContext(ctx, "tcp", addr)
	}
}

// smokeTest does a SET and a GET on addr.
func smokeTest(addr string) error { return smokeVia(tcpDialer(addr)) }

// smokeVia does a SET and a GET on a connection dial opens.
func smokeVia(dial dialer) error {
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	key, val := []byte("benchtable:smoke"), []byte("ok")
	if st, err := roundTrip(c, r, appendRequest(nil, opSet, 1, setExtras, key, val)); err != nil || st != 0 {
		return fmt.Errorf("SET: status 0x%x, %v", st, err)
	}
	if st, err := roundTrip(c, r, appendRequest(nil, opGet, 2, nil, key, nil)); err != nil || st != 0 {
		return fmt.Errorf("GET: status 0x%x, %v", st, err)
	}
	return nil
}
