package proxy

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// A text command the proxy cannot carry out is answered as memcached
// answers a command it cannot: one error line instead of the rest of the
// reply. A retrieval (get, gets, gat, gats) sends nothing after it, no END
// and none of the later keys' VALUE blocks, so that the client reads one
// reply and stays in step (issue 27). These tests fail when a failed key
// is answered with its error line and the retrieval goes on to END.

// upstreamFailure matches the error line of a command whose upstream
// timed out or was lost, or was found down (the connection is re-dialled
// after a short backoff).
var upstreamFailure = regexp.MustCompile(`SERVER_ERROR upstream ((timed out|connection lost); the command may have run|unavailable)\r\n`)

// textBatch is metaExchange (the replies to in, up to the "MN" it must
// end with) with every upstream failure line read as
// "SERVER_ERROR <upstream>".
func textBatch(t *testing.T, tc *textConn, in string) string {
	t.Helper()
	return upstreamFailure.ReplaceAllString(metaExchange(t, tc, in), "SERVER_ERROR <upstream>\r\n")
}

// TestTextUpstreamFailureFraming: two memcached servers, one of them
// stopped (SIGSTOP) so that the proxy's 1 s upstream timeout fires.
// Each command is answered as memcached frames a failure of it: a
// retrieval whose key lives on the stopped server ends with the error
// line, after the VALUE blocks of the keys before it (already sent) and
// without those of the keys after it or END; a storage or other classic
// command gets the error line, or nothing with noreply; a meta command
// gets the error line even in quiet mode. The connection stays in step:
// the commands after each failure get their own replies.
func TestTextUpstreamFailureFraming(t *testing.T) {
	t.Parallel()
	p, a, b := startTwoServerProxy(t, `timeout = "1s"`) // a failure on the stopped server only, not on a loaded machine
	tc := dialText(t, p.Addr)
	_ = tc.c.SetDeadline(time.Now().Add(30 * time.Second))
	// Keys on each server.
	var onA, onB []string
	for i := 0; len(onA) < 3 || len(onB) < 2; i++ {
		k := "k" + string(rune('a'+i%26)) + strings.Repeat("x", i/26)
		if got := textBatch(t, tc, "set "+k+" 0 0 2\r\nv"+k[1:2]+"\r\nmn\r\n"); got != "STORED\r\nMN\r\n" {
			t.Fatalf("set %s: %q", k, got)
		}
		switch {
		case onServer(t, a, k):
			onA = append(onA, k)
		case onServer(t, b, k):
			onB = append(onB, k)
		}
	}
	value := func(k string) string { return "VALUE " + k + " 0 2\r\nv" + k[1:2] + "\r\n" }
	a1, a2, a3, b1, b2 := onA[0], onA[1], onA[2], onB[0], onB[1]
	b.Freeze(t)

	fail := "SERVER_ERROR <upstream>\r\n"
	cases := []struct{ name, in, want string }{
		{"get: keys before the failed one answered, none after, no END",
			"get " + a1 + " " + b1 + " " + a2 + "\r\n", value(a1) + fail},
		{"gets: the first key fails", "gets " + b1 + " " + a1 + "\r\n", fail},
		{"gat: two failing keys, one error line", "gat 0 " + a1 + " " + b1 + " " + b2 + " " + a3 + "\r\n", value(a1) + fail},
		{"gats", "gats 0 " + b2 + "\r\n", fail},
		{"get in step after the failures", "get " + a1 + " " + a2 + "\r\n", value(a1) + value(a2) + "END\r\n"},
		{"set", "set " + b1 + " 0 0 1\r\nx\r\n", fail},
		{"set noreply: nothing", "set " + b1 + " 0 0 1 noreply\r\nx\r\n", ""},
		{"delete", "delete " + b1 + "\r\n", fail},
		{"incr", "incr " + b1 + " 1\r\n", fail},
		{"touch noreply: nothing", "touch " + b1 + " 0 noreply\r\n", ""},
		{"mg quiet: the error is sent", "mg " + b1 + " v q\r\n", fail},
		{"ms quiet: the error is sent", "ms " + b1 + " 1 q\r\nx\r\n", fail},
		{"mg quiet on the live server: a hit", "mg " + a1 + " v q\r\n", "VA 2\r\nv" + a1[1:2] + "\r\n"},
		{"get after everything", "get " + a3 + "\r\n", value(a3) + "END\r\n"},
	}
	var in, want strings.Builder
	for _, c := range cases {
		in.WriteString(c.in)
		want.WriteString(c.want)
		// One batch per case too, so that a difference names its case.
		if got := textBatch(t, tc, c.in+"mn\r\n"); got != c.want+"MN\r\n" {
			t.Errorf("%s: %q\n got %q\nwant %q", c.name, c.in, got, c.want+"MN\r\n")
		}
	}
	// All of them pipelined.
	if got := textBatch(t, tc, in.String()+"mn\r\n"); got != want.String()+"MN\r\n" {
		t.Errorf("pipelined:\n got %q\nwant %q", got, want.String()+"MN\r\n")
	}
}

// TestTextMaxHoldRefusalFraming: a text command that throttle.max_hold
// refuses gets one error line (memcached has no throttling: a SERVER_ERROR
// with the wait, {"next_tick_us":N}); a refused retrieval sends nothing
// after it. With the engine's clock standing still the refusals are
// certain; once it moves on, the same connection reads every key's value.
func TestTextMaxHoldRefusalFraming(t *testing.T) {
	t.Parallel()
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{
		throttle: "capacity = \"unlimited\"\nburst_ms = 0\nmax_hold = \"50ms\"",
		tail:     "[[bucket]]\nname = \"default\"\nhard_limit = 10\n",
	}, clock)
	tc := dialText(t, p.Addr)
	// A set of 10 units last: a second of the bucket's limit, spent
	// while the clock stands still.
	big := strings.Repeat("x", 10*4096-10)
	for _, in := range []string{"set a 0 0 1\r\nA\r\n", "set b 0 0 1\r\nB\r\n", "set big 0 0 " + strconv.Itoa(len(big)) + "\r\n" + big + "\r\n"} {
		clock.Advance(10 * time.Second)
		if got := textBatch(t, tc, in+"mn\r\n"); got != "STORED\r\nMN\r\n" {
			t.Fatalf("%.20q: %q", in, got)
		}
	}
	refused := regexp.MustCompile(`^SERVER_ERROR \{"next_tick_us":\d+\}\r\n$`)
	for _, in := range []string{"get a b\r\n", "gets b\r\n", "gat 0 a b\r\n", "set a 0 0 1\r\nZ\r\n", "mg a v q\r\n"} {
		got := textBatch(t, tc, in+"mn\r\n")
		if !refused.MatchString(strings.TrimSuffix(got, "MN\r\n")) {
			t.Errorf("%q refused by max_hold: %q, want one SERVER_ERROR line", in, got)
		}
	}
	// Noreply: nothing, as memcached sends no error either.
	if got := textBatch(t, tc, "set a 0 0 1 noreply\r\nZ\r\nmn\r\n"); got != "MN\r\n" {
		t.Errorf("refused set noreply: %q, want nothing", got)
	}
	for _, k := range []string{"b", "a"} {
		clock.Advance(10 * time.Second)
		want := "VALUE " + k + " 0 1\r\n" + strings.ToUpper(k) + "\r\nEND\r\nMN\r\n"
		if got := textBatch(t, tc, "get "+k+"\r\nmn\r\n"); got != want {
			t.Errorf("get %s after the refusals: %q, want %q", k, got, want)
		}
	}
}

// TestTextErrorLineWording: a key the bucket's namespace makes too long
// for memcached, found at dispatch (the namespace grew since the codec
// checked), is refused in memcached's words for a key over 250 bytes,
// silently with noreply, and always for a meta command (memcached sends
// meta errors in quiet mode too).
func TestTextErrorLineWording(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		k       text.Kind
		noreply bool
		want    string
	}{
		{text.KindSet, false, "CLIENT_ERROR bad command line format\r\n"},
		{text.KindGet, false, "CLIENT_ERROR bad command line format\r\n"},
		{text.KindDelete, true, ""},
		{text.KindMetaGet, false, "CLIENT_ERROR bad command line format\r\n"},
	} {
		q := reqHead{opaque: textTag(c.k, partCommand, c.noreply)}
		if got := string(appendTextError(nil, q, binary.StatusEinval, reasonKeyTooLong)); got != c.want {
			t.Errorf("kind %d noreply %v: %q, want %q", c.k, c.noreply, got, c.want)
		}
	}
}

// TestTextAdminRefusalNoreply: memcached's administrative commands are
// refused with one error line, except that those memcached reads noreply
// on (cache_memlimit, lru, extstore, slabs automove, watch) are refused
// silently when they end in noreply, since memcached sends nothing then,
// not even an error: the client reads no reply for them.
func TestTextAdminRefusalNoreply(t *testing.T) {
	t.Parallel()
	p := startProxy(t, testConfig{})
	tc := dialText(t, p.Addr)
	refused := "SERVER_ERROR command not supported through kvthrottle\r\n"
	for in, want := range map[string]string{
		"cache_memlimit 100 noreply\r\n": "",
		"lru mode flat noreply\r\n":      "",
		"slabs automove 0 noreply\r\n":   "",
		"watch noreply\r\n":              "",
		"extstore x noreply\r\n":         "",
		"cache_memlimit 100\r\n":         refused,
		"slabs reassign 1 2 noreply\r\n": refused,
		"shutdown\r\n":                   refused,
	} {
		if got := metaExchange(t, tc, in+"get k\r\nmn\r\n"); got != want+"END\r\nMN\r\n" {
			t.Errorf("%q: %q, want %q", in, got, want+"END\r\nMN\r\n")
		}
	}
}
