package proxy

import (
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// notRequest answers input of a binary client that does not start with a
// binary request magic (a response magic first, or garbage after binary
// requests: a text client's first byte picks the text codec instead), then
// closes the connection once earlier responses are out. b is the buffered
// input from the offending byte on (at least one byte; it may be shorter
// than a header). It is a bad frame: Einval, as DESIGN.md section 3 says,
// with the opcode and opaque taken from what arrived.
func (s *session) notRequest(b []byte) {
	var hb [binary.HeaderLen]byte
	copy(hb[:], b)
	h, _ := binary.ParseHeader(hb[:])
	s.badFrame(&request{op: h.Opcode, opaque: h.Opaque}, errNotRequest)
}

// version answers VERSION with the version of the memcached servers behind
// the proxy as the pool's health prober last read it (upstream.Pool.Version).
// Clients parse it as memcached's (libmemcached fails on anything but
// digits and dots), and a flood of VERSION, which is not metered, never
// reaches memcached. While no answering server's version is known (the
// first probe has not answered yet, or every server is down) the request
// is forwarded, as before.
func (s *session) version(r *request) bool {
	if err := binary.ValidateRequest(&r.frame); err != nil {
		s.localStatus(r, binary.StatusEinval, err.Error())
		return true
	}
	v := s.lp.srv.pool.Version()
	if v == nil {
		return s.forward(r, nil)
	}
	s.localValue(r, binary.StatusSuccess, v)
	return true
}
