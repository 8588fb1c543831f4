package proxy

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// logSample keeps a log line that any client can cause at will (a refused
// password, a malformed frame) from flooding the log: the first such
// event, and then every sampleEvery-th, is logged at the level asked for,
// with the running total; the others at debug level. The zero value is
// ready; safe for concurrent use.
type logSample struct{ n atomic.Uint64 }

// sampleEvery is how many events of one kind share one line at the level
// asked for.
const sampleEvery = 1000

// event returns the logger event for one more occurrence: lvl for the
// first and every sampleEvery-th (with the field "total"), debug
// otherwise.
func (ls *logSample) event(l *zerolog.Logger, lvl zerolog.Level) *zerolog.Event {
	n := ls.n.Add(1)
	if n%sampleEvery != 1 {
		return l.Debug()
	}
	return l.WithLevel(lvl).Uint64("total", n)
}

// perKeyLog lets one line per key (an upstream server) through per
// perKeyEvery at the level asked for: one memcached going away takes down
// a connection per event loop and bucket, and the operator needs one line
// per server, not thousands. The zero value is ready; safe for concurrent
// use.
type perKeyLog struct {
	mu   sync.Mutex
	keys map[string]*perKeyState
}

type perKeyState struct {
	last time.Time
	n    int // events since the last line let through
}

// perKeyEvery is how often one key may log at the level asked for.
const perKeyEvery = time.Second

// allow reports whether an event of key at now gets a line at the level
// asked for, with how many events of key (this one included) it stands
// for; the others go to debug.
func (l *perKeyLog) allow(key string, now time.Time) (int, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = make(map[string]*perKeyState)
	}
	st := l.keys[key]
	if st == nil {
		st = &perKeyState{}
		l.keys[key] = st
	}
	st.n++
	if !st.last.IsZero() && now.Sub(st.last) < perKeyEvery {
		return 0, false
	}
	n := st.n
	st.last, st.n = now, 0
	return n, true
}
