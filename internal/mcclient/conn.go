package mcclient

import (
	"bufio"
	"net"
)

// New returns a Client speaking over conn, an established connection (for
// example a *tls.Conn), which the Client owns from now on: Close closes
// it.
func New(conn net.Conn) *Client {
	return &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10), w: bufio.NewWriterSize(conn, 64<<10), Timeout: DefaultTimeout}
}
