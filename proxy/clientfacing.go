package proxy

import (
	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// textProtocolError is the line a text-protocol client gets before the
// connection closes. memcached decides a connection's protocol from its
// first byte (0x80: binary, anything else: text); the proxy has no text
// front end yet, so it answers the way memcached's text protocol reports
// a server-side inability to serve a well-formed command: SERVER_ERROR
// with a reason (not "ERROR", which says the command name is unknown and
// gives no reason, nor CLIENT_ERROR, which blames valid input). Text
// clients surface the reason (pymemcache raises MemcacheServerError).
const textProtocolError = "SERVER_ERROR only the binary protocol is supported\r\n"

// notRequest answers input that does not start with a binary request
// magic, then closes the connection once earlier responses are out. b is
// the buffered input from the offending byte on (at least one byte; it
// may be shorter than a header). The connection's first byte, unless it is
// a binary response magic, means a text-protocol client: it gets
// textProtocolError. Anything else (a response magic, or garbage after
// binary requests) is a bad frame: Einval, as DESIGN.md section 3 says,
// with the opcode and opaque taken from what arrived.
func (s *session) notRequest(b []byte) {
	if !s.framed && !binary.Magic(b[0]).IsResponse() {
		srv := s.lp.srv
		srv.logBadInput.event(&srv.log, zerolog.InfoLevel).Str("remote", s.remote).Msg("text protocol client; answered SERVER_ERROR and closing connection")
		s.local(func(out []byte) []byte { return append(out, textProtocolError...) })
		s.quit()
		return
	}
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
