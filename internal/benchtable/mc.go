package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// A minimal memcached binary-protocol client, just enough for the load
// generator and the idle connections (kept here so the benchmark does not
// depend on packages being edited).

const (
	opGet  = 0x00
	opSet  = 0x01
	opNoop = 0x0a

	headerLen = 24
)

// appendRequest appends a classic request frame.
func appendRequest(b []byte, op byte, opaque uint32, extras, key, value []byte) []byte {
	var h [headerLen]byte
	h[0] = 0x80
	h[1] = op
	binary.BigEndian.PutUint16(h[2:4], uint16(len(key)))
	h[4] = byte(len(extras))
	binary.BigEndian.PutUint32(h[8:12], uint32(len(extras)+len(key)+len(value)))
	binary.BigEndian.PutUint32(h[12:16], opaque)
	b = append(b, h[:]...)
	b = append(b, extras...)
	b = append(b, key...)
	return append(b, value...)
}

// setExtras are SET's flags and expiry (both 0).
var setExtras = make([]byte, 8)

// readResponse reads one response frame into hdr, discarding its body, and
// returns its status and opaque.
func readResponse(r *bufio.Reader, hdr *[headerLen]byte) (status uint16, opaque uint32, err error) {
	if _, err = io.ReadFull(r, hdr[:]); err != nil {
		return 0, 0, err
	}
	if hdr[0] != 0x81 {
		return 0, 0, fmt.Errorf("bad response magic 0x%02x", hdr[0])
	}
	body := binary.BigEndian.Uint32(hdr[8:12])
	if _, err = r.Discard(int(body)); err != nil {
		return 0, 0, err
	}
	return binary.BigEndian.Uint16(hdr[6:8]), binary.BigEndian.Uint32(hdr[12:16]), nil
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

// smokeTest does a SET and a GET on addr.
func smokeTest(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
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
