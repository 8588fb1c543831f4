package proxy

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Log lines any client can cause at will are sampled: the first and every
// thousandth at their level, the rest at debug.
func TestLogSample(t *testing.T) {
	t.Parallel()
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

// One line per server per second for upstream connections going down: a
// memcached restart takes down a connection per loop and bucket, and the
// line that gets through says how many it stands for.
func TestPerKeyLog(t *testing.T) {
	t.Parallel()
	var l perKeyLog
	t0 := time.Unix(1000, 0)
	if n, ok := l.allow("a:1", t0); !ok || n != 1 {
		t.Fatalf("first event: %d %v, want 1 true", n, ok)
	}
	for i := range 99 {
		if _, ok := l.allow("a:1", t0.Add(time.Duration(i)*time.Millisecond)); ok {
			t.Fatalf("event %d within the second got a line", i+2)
		}
	}
	if n, ok := l.allow("b:2", t0); !ok || n != 1 {
		t.Fatalf("another server's first event: %d %v", n, ok)
	}
	if n, ok := l.allow("a:1", t0.Add(perKeyEvery)); !ok || n != 100 {
		t.Fatalf("after a second: %d %v, want the 100 events since the last line", n, ok)
	}
}
