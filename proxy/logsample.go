package proxy

import (
	"sync/atomic"

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
