package proxy

// A text session's classic commands go upstream as binary requests and its
// meta commands as meta commands, on two connections to the server
// (upstream.Conn and its Meta sibling). memcached answers each connection
// in order but runs the two independently, so a meta command sent while
// classic commands of the same client are in flight could run before them
// (an mg overtaking the set before it). A session therefore sends on one
// kind of connection at a time: a command for the other kind waits
// (waitingOrder) until the session's commands on the first have
// completed. Clients rarely mix the two, so the wait is rare; a binary
// session only ever uses one kind.

// upPath is the kind of upstream connection a command went on.
type upPath uint8

const (
	pathNone    upPath = iota // answered by the proxy
	pathClassic               // a binary request on upstream.Conn
	pathMeta                  // a meta command on Conn.Meta
	numPaths
)

// mustWaitOrder reports whether a command for the meta connection (meta)
// or the binary one must wait for the session's commands in flight on the
// other, and if so pauses the session (waitingOrder). On the loop.
func (s *session) mustWaitOrder(meta bool) bool {
	other := pathMeta
	if meta {
		other = pathClassic
	}
	if s.pathOut[other] == 0 {
		return false
	}
	s.setPause(waitingOrder)
	return true
}

// enterPath counts sl, just sent, in flight on its kind of connection.
func (s *session) enterPath(sl *slot, meta bool) {
	sl.path = pathClassic
	if meta {
		sl.path = pathMeta
	}
	s.pathOut[sl.path]++
}

// leavePath counts sl out when it completes, and queues the session for a
// re-try (lp.retry) when it waits for order and nothing of the kind it
// waits for is in flight any more.
func (s *session) leavePath(sl *slot) {
	if sl.path == pathNone {
		return
	}
	s.pathOut[sl.path]--
	sl.path = pathNone
	if s.pause == waitingOrder && !s.closed && (s.pathOut[pathClassic] == 0 || s.pathOut[pathMeta] == 0) {
		s.lp.retry = append(s.lp.retry, s)
	}
}
