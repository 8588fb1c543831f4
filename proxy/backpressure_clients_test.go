package proxy

import (
	"bytes"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/throttle"
)

// Back-pressure (readgate.go) on the other pause states, over TLS, and
// with pymemcache.

// TestUpstreamWaitBackPressure: with memcached stopped, a client's
// noreply sets fill the upstream connection (its requests in flight) and
// the session waits for room; the proxy stops reading it and its writes
// block, the session holding at most max_held_input_bytes and one read.
// When memcached runs again every set is stored, on the same connection.
func TestUpstreamWaitBackPressure(t *testing.T) {
	frozenBackPressure(t, "up", waitingUpstream, func(b *bytes.Buffer, i, valueLen int) {
		fmt.Fprintf(b, "set up%d 0 0 %d noreply\r\n%s\r\n", i, valueLen, bpValue(i, valueLen))
	})
}

// TestOrderWaitBackPressure: with memcached stopped, a client's classic
// set is in flight and its meta sets behind it (quiet, ms with q) wait
// for it (waitingOrder: the two kinds go upstream on different
// connections); the proxy stops reading the client and its writes block.
// When memcached runs again every set is stored, on the same connection.
func TestOrderWaitBackPressure(t *testing.T) {
	frozenBackPressure(t, "ord", waitingOrder, func(b *bytes.Buffer, i, valueLen int) {
		if i == 0 {
			fmt.Fprintf(b, "set ord0 0 0 %d noreply\r\n%s\r\n", valueLen, bpValue(0, valueLen))
			return
		}
		fmt.Fprintf(b, "ms ord%d %d q\r\n%s\r\n", i, valueLen, bpValue(i, valueLen))
	})
}

// frozenBackPressure stops memcached and pipelines 16 MB of quiet sets of
// keys prefix0 up (cmd appends the i-th) on a connection, which must pause
// in state want and stop being read; then runs memcached again and checks
// that every set is stored and the connection is in step.
func frozenBackPressure(t *testing.T, prefix string, want pauseState, cmd func(b *bytes.Buffer, i, valueLen int)) {
	const n, valueLen = 16384, 1000
	tc := bpConfig(1, time.Second)
	tc.tail = "[[bucket]]\nname = \"default\"\n"
	tc.upstream = `timeout = "60s"`
	p := startProxy(t, tc)
	textDo(t, dialText(t, p.Addr), "get none\r\nmg none v\r\n", "EN\r\n") // opens the loop's upstream connections
	thaw := p.MC.Freeze(t)
	c := rawDial(t, p.Addr)
	w := startPipeWriterOf(t, c, n, func(b *bytes.Buffer, i int) { cmd(b, i, valueLen) })
	blockedSession(t, p, w, want)
	thaw()
	w.wait(t, clientPatience)
	checkInStep(t, c)
	checkStored(t, p.MC.Addr, "default", prefix, n, valueLen)
}

// TestTLSHeldWriterBackPressure: the same over TLS, whose records gnet
// reads and the loop decrypts (tlsconn.go): a TLS client pipelining 16
// MiB of noreply sets into a bucket limited to 1 unit/s is not read past
// the bound, its writes block, and when the limit is lifted every set is
// stored, on the same connection.
func TestTLSHeldWriterBackPressure(t *testing.T) {
	const n, valueLen = 4096, 4000
	tc := bpConfig(1, 10*time.Millisecond)
	tc.tail = "[[bucket]]\nname = \"default\"\nhard_limit = 1\n"
	s := startTLSProxyWith(t, false, tc)
	c, err := s.dialTLS(t, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := startPipeWriter(t, c, "tls", n, valueLen)
	blockedSession(t, s.p, w, held)
	s.p.Engine().Bucket("default").SetLimits(0, -1)
	w.wait(t, clientPatience)
	checkInStep(t, c)
	checkStored(t, s.p.MC.Addr, "default", "tls", n, valueLen)
}

// pymemcacheWriter writes argv[2] keys py0.. with values as bpValue
// (argv[3] bytes) with pymemcache's default set (noreply), then one set
// that waits for its reply, and checks that all of it went over the one
// connection it opened (pymemcache reconnects silently after an error).
// It prints how many sets returned True.
const pymemcacheWriter = `
import sys
from pymemcache.client.base import Client
host, port = sys.argv[1].rsplit(":", 1)
n, size = int(sys.argv[2]), int(sys.argv[3])
c = Client((host, int(port)), connect_timeout=5, timeout=60)
ok, sock = 0, None
for i in range(n):
    s = str(i).encode()
    if c.set("py%d" % i, s + bytes([97 + i % 26]) * (size - len(s))) is True:
        ok += 1
    if sock is None:
        sock = c.sock
assert c.set("py-done", b"1", noreply=False) is True, "the set with a reply failed"
assert c.sock is sock, "pymemcache had to reconnect"
print(ok)
`

// TestPymemcacheHeldBackPressure: pymemcache's default (noreply) sets,
// 16 MB of them, into a bucket at a hard limit of 1000 units/s on the
// engine's fake clock. The proxy stops reading the client instead of
// closing it; each second the clock advances admits the limit's worth;
// the client ends on the connection it opened, and every key is stored
// (read through a second connection). Before back-pressure the proxy
// closed the connection at max_held_input_bytes and the sets behind it
// were lost (issue 27: 480 of 234,364 stored).
func TestPymemcacheHeldBackPressure(t *testing.T) {
	python := pymemcachePython(t)
	const limit, n, valueLen = 1000, 4000, 4000 // 1 unit per set
	burst := time.Second
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, bpConfig(limit, burst), clock)
	b := p.Engine().Bucket("default")

	cmd := exec.Command(python, "-c", pymemcacheWriter, p.Addr, strconv.Itoa(n), strconv.Itoa(valueLen))
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var err error
	exited := make(chan struct{})
	go func() {
		err = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	pyFailed := func() {
		t.Helper()
		select {
		case <-exited:
			t.Fatalf("pymemcache ended while held: %v, printed %q\n%s", err, out.String(), stderr.String())
		default:
		}
	}
	eventually(t, 20*time.Second, "the client to be held and not read, or to fail", func() bool {
		in := clientInputs(t, p)
		select {
		case <-exited:
			return true
		default:
		}
		return len(in) == 1 && in[0].readOff && in[0].pause == held && in[0].unread > 0
	})
	pyFailed()
	checkInputBound(t, p)
	for i := 0; i < 2; i++ {
		if got := admitted(t, p, clock, b, time.Second); got != limit {
			t.Fatalf("advancing the clock 1 s admitted %d sets, want %d (the hard limit)", got, limit)
		}
		checkInputBound(t, p)
		pyFailed()
	}
	for done := false; !done; {
		clock.Advance(burst)
		select {
		case <-exited:
			done = true
		case <-time.After(100 * time.Millisecond):
		}
		checkInputBound(t, p)
	}
	if err != nil || strings.TrimSpace(out.String()) != strconv.Itoa(n) {
		t.Fatalf("pymemcache: %v, printed %q\n%s", err, out.String(), stderr.String())
	}
	if got := b.Stats().Commands; got != n+1 {
		t.Errorf("%d commands admitted, want %d", got, n+1)
	}
	b.SetLimits(0, -1)
	checkStored(t, p.MC.Addr, "default", "py", n, valueLen)
}
