package proxy

import (
	"net"
	"net/netip"
	"strconv"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
)

// listenerTable tells, from the local address a client connection
// reached, which [[listener]] it came through, if any: a connection to a
// listener belongs to the listener's bucket without authenticating
// (DESIGN.md section 12). Built at start, read-only after.
type listenerTable []listenerEntry

type listenerEntry struct {
	ip     netip.Addr // unset: any address (empty host or a DNS name)
	port   uint16
	bucket string
}

func newListenerTable(ls []bucketcfg.Listener) listenerTable {
	var t listenerTable
	for _, l := range ls {
		host, port, err := net.SplitHostPort(l.Listen)
		p, perr := strconv.ParseUint(port, 10, 16)
		if err != nil || perr != nil {
			continue // not reached: bucketcfg validated it
		}
		e := listenerEntry{port: uint16(p), bucket: l.Bucket}
		if ip, err := netip.ParseAddr(host); err == nil {
			e.ip = ip.Unmap()
		}
		t = append(t, e)
	}
	return t
}

// bucketOf returns the bucket of the listener whose address local is, or
// "" for proxy.listen. An entry naming its IP address wins over one bound
// to every address on the same port.
func (t listenerTable) bucketOf(local net.Addr) string {
	if len(t) == 0 {
		return ""
	}
	ta, ok := local.(*net.TCPAddr)
	if !ok {
		return ""
	}
	ip, _ := netip.AddrFromSlice(ta.IP)
	ip = ip.Unmap()
	found := ""
	for _, e := range t {
		if int(e.port) != ta.Port {
			continue
		}
		if e.ip.IsValid() {
			if e.ip == ip {
				return e.bucket
			}
			continue
		}
		found = e.bucket
	}
	return found
}

// addrs returns the gnet addresses to serve: proxy.listen first, then the
// listeners.
func listenAddrs(cfg *bucketcfg.Config) []string {
	out := []string{"tcp://" + cfg.Proxy.Listen}
	for _, l := range cfg.Listeners {
		out = append(out, "tcp://"+l.Listen)
	}
	return out
}

// sameListeners reports whether two configurations have the same
// [[listener]] tables, which a reload may not change.
func sameListeners(a, b []bucketcfg.Listener) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// homeBucket returns the name of the bucket an unauthenticated session
// uses: its listener's, else proxy.default_bucket ("" for none); none
// once a SASL login of the session has failed, until one succeeds
// (session.logout), and none while a SCRAM login is between its AUTH and
// its STEP.
func (s *session) homeBucket(ten *tenants) string {
	if s.authFailed || s.scram != nil {
		return ""
	}
	if s.listenerBucket != "" {
		return s.listenerBucket
	}
	return ten.cfg.Proxy.DefaultBucket
}
