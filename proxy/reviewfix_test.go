package proxy

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// A refused SASL re-authentication logs the connection out, and with no
// default bucket it is back under the pre-authentication bounds: a large
// frame gets Einval and the connection closes, as before it had
// authenticated.
func TestFailedReauthRestoresPreAuthBounds(t *testing.T) {
	p := startProxy(t, testConfig{proxy: "default_bucket = \"\"", tail: tenantTail(t)})
	c := login(t, p.Addr, "alice")
	if r, err := c.Set([]byte("big"), bytes.Repeat([]byte("x"), 100<<10)); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("100 KB SET when authenticated: %s", r.Status())
	}
	if err := c.AuthPlain("alice", "wrong"); err == nil {
		t.Fatal("a wrong password was accepted")
	}
	r, err := c.Set([]byte("big"), bytes.Repeat([]byte("x"), 100<<10))
	if err != nil || r.Status() != mc.StatusEinval {
		t.Fatalf("100 KB SET after a refused re-authentication: %v %+v, want Einval", err, r)
	}
	c.Timeout = 2 * time.Second
	if _, err := c.Read(); err == nil {
		t.Fatal("the connection stayed open after Einval for a frame too large before authentication")
	}
}

// Log lines any client can cause at will are sampled: the first and every
// thousandth at their level, the rest at debug.
func TestLogSample(t *testing.T) {
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
