package proxy

// Test clients of the proxy: binary (dial, login, pipelineGets), text
// (dialText, textDo, metaExchange) and raw (rawDial, countBytes, dialFrom
// a chosen source address, dialDeadline, dialMany); the independent clients the
// tests drive (runClient, runMemccapable, pymemcachePython); reading the
// proxy's stats (statValue, statusFn, bucketUnits); and the latency
// quantiles the tests report.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// clientPatience is how long a test's client waits for an answer before
// it fails: liveness, not a figure. On the fake clock a held command waits
// for as long as the test takes to move the clock, which on a loaded
// machine can pass mcclient's default of 30 s (seen: 0.6 s of fake time in
// 59 s of real time beside a second suite and a CPU hog).
const clientPatience = 5 * time.Minute

// dial connects to addr with a client that waits clientPatience for each
// answer; it is closed when the test ends.
func dial(t testing.TB, addr string) *mcclient.Client {
	t.Helper()
	c, err := mcclient.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Timeout = clientPatience
	t.Cleanup(func() { c.Close() })
	return c
}

func login(t testing.TB, addr, user string) *mcclient.Client {
	t.Helper()
	c := dial(t, addr)
	r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00" + user + "\x00" + user + "-pw")})
	if err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("login %s: %v %+v", user, err, r)
	}
	return c
}

func status(t testing.TB, r *mcclient.Response, err error) mc.Status {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	return r.Status()
}

func adminDo(t testing.TB, c *mcclient.Client, op mc.Opcode, key, body string) *mcclient.Response {
	t.Helper()
	r, err := c.Do(mcclient.Request{Opcode: op, Key: []byte(key), Value: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func hello(t testing.TB, c *mcclient.Client, features ...mc.Feature) {
	t.Helper()
	var v []byte
	for _, f := range features {
		v = append(v, byte(f>>8), byte(f))
	}
	r, err := c.Do(mcclient.Request{Opcode: mc.OpHello, Key: []byte("test"), Value: v})
	if err != nil || r.Status() != mc.StatusSuccess || !bytes.Equal(r.Value, v) {
		t.Fatalf("HELLO %v: %v %+v", features, err, r)
	}
}

// pipelineGets keeps depth GETs of key in flight on c until stop is
// closed, and reports the arrival time of each hit. At stop it closes c
// (without waiting for the GETs still held by the throttle) and returns;
// errors before stop fail t.
func pipelineGets(t testing.TB, c *mcclient.Client, key string, depth int, stop <-chan struct{}, arrived func(time.Time)) {
	timedGets(t, c, key, depth, stop, func(_, got time.Time) { arrived(got) })
}

// timedGets is pipelineGets reporting when each GET was sent and when it
// was answered (a connection's answers come in the order of its requests).
func timedGets(t testing.TB, c *mcclient.Client, key string, depth int, stop <-chan struct{}, answered func(sent, got time.Time)) {
	sent := make(chan time.Time, depth) // a slot taken before a GET is sent
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
		case <-done:
		}
		c.Close() // ends the Read below
	}()
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-done:
				return
			case sent <- time.Now():
			}
			c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte(key)})
			if err := c.Flush(); err != nil {
				return // closed: Read reports what matters
			}
		}
	}()
	for {
		r, err := c.Read()
		select {
		case <-stop:
			return
		default:
		}
		if err != nil {
			t.Errorf("read: %v", err)
			return
		}
		if r.Status() != mc.StatusSuccess {
			t.Errorf("GET %s: status %v %q", key, r.Status(), r.Value)
			return
		}
		answered(<-sent, time.Now())
	}
}

func runMixed(addr string, ci, ops int) error {
	c, err := mcclient.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	counter := []byte(fmt.Sprintf("c%d-counter", ci))
	var count uint64
	for i := 0; i < ops; i++ {
		key := []byte(fmt.Sprintf("c%d-k%d", ci, i%10))
		val := []byte(fmt.Sprintf("client %d value %d %s", ci, i, bytes.Repeat([]byte{'x'}, i%200)))
		switch i % 4 {
		case 0:
			if r, err := c.Set(key, val); err != nil || r.Status() != mc.StatusSuccess {
				return fmt.Errorf("client %d set %d: %v %v", ci, i, err, r)
			}
			r, err := c.Get(key)
			if err != nil || r.Status() != mc.StatusSuccess || !bytes.Equal(r.Value, val) {
				return fmt.Errorf("client %d get %d: got %q want %q (%v)", ci, i, r.Value, val, err)
			}
		case 1:
			r, err := c.Incr(counter, 1, 1)
			if err != nil || r.Status() != mc.StatusSuccess {
				return fmt.Errorf("client %d incr: %v %v", ci, err, r)
			}
			count++
			if got := binary.BigEndian.Uint64(r.Value); got != count {
				return fmt.Errorf("client %d incr: counter %d, want %d", ci, got, count)
			}
		case 2:
			if r, err := c.Delete(key); err != nil || (r.Status() != mc.StatusSuccess && r.Status() != mc.StatusKeyEnoent) {
				return fmt.Errorf("client %d delete: %v %v", ci, err, r)
			}
			if r, err := c.Get(key); err != nil || r.Status() != mc.StatusKeyEnoent {
				return fmt.Errorf("client %d get after delete: %v %v", ci, err, r)
			}
		case 3:
			// A pipelined pair: SET then GETK, answered in order.
			c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(uint32(ci), 0), Key: key, Value: val})
			c.Send(mcclient.Request{Opcode: mc.OpGetK, Key: key})
			if err := c.Flush(); err != nil {
				return err
			}
			r1, err1 := c.Read()
			r2, err2 := c.Read()
			if err1 != nil || err2 != nil || r1.Opcode != mc.OpSet || r2.Opcode != mc.OpGetK ||
				!bytes.Equal(r2.Key, key) || !bytes.Equal(r2.Value, val) || binary.BigEndian.Uint32(r2.Extras) != uint32(ci) {
				return fmt.Errorf("client %d pipelined set/getk: %v %v %+v %+v", ci, err1, err2, r1, r2)
			}
		}
	}
	return nil
}

// readStatus reads one response from conn within d.
func readStatus(t testing.TB, conn net.Conn, d time.Duration) (mc.Header, error) {
	t.Helper()
	_ = conn.SetReadDeadline(time.Now().Add(d))
	var hb [mc.HeaderLen]byte
	if _, err := io.ReadFull(conn, hb[:]); err != nil {
		return mc.Header{}, err
	}
	h, _ := mc.ParseHeader(hb[:])
	if _, err := io.CopyN(io.Discard, conn, int64(h.BodyLen)); err != nil {
		return h, err
	}
	return h, nil
}

// textConn is a text client connection read line by line.
type textConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialText(t *testing.T, addr string) *textConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // liveness, not a figure
	return &textConn{c: c, r: bufio.NewReader(c)}
}

// line reads one line, "" on error (the caller's comparison fails).
func (tc *textConn) line(t *testing.T) string {
	s, _ := tc.r.ReadString('\n')
	return s
}

// textDo writes in on tc and reads the reply up to and including a line
// equal to last (memcached's reply to the last command of in); the test
// fails on an error or a timeout.
func textDo(t *testing.T, tc *textConn, in, last string) string {
	t.Helper()
	_ = tc.c.SetDeadline(time.Now().Add(30 * time.Second)) // liveness, not a figure
	if _, err := io.WriteString(tc.c, in); err != nil {
		t.Fatalf("write %q: %v", in, err)
	}
	var out strings.Builder
	for {
		line, err := tc.r.ReadString('\n')
		out.WriteString(line)
		if err != nil {
			t.Fatalf("reply to %q: %v after %q", in, err, out.String())
		}
		if line == last {
			return out.String()
		}
	}
}

// median is the median of ds (sorted in place).
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// p99 is the 99th percentile of ds, 0 for none; ds is left as it was.
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)*99/100]
}

// byteCounter reads a connection until it closes and counts the bytes
// (n), so that the proxy is never held up by a client that does not read;
// received is for the fake-clock tests' own accounting of what reached
// the client by a reading of the clock (settledOwing).
type byteCounter struct {
	c        net.Conn
	n        atomic.Int64
	received int64 // bytes c's TCP had received at the last settledOwing
}

// countBytes starts a byteCounter reading c.
func countBytes(c net.Conn) *byteCounter {
	bc := &byteCounter{c: c}
	go bc.run()
	return bc
}

func (bc *byteCounter) run() {
	buf := make([]byte, 256<<10)
	for {
		n, err := bc.c.Read(buf)
		bc.n.Add(int64(n))
		if err != nil {
			return
		}
	}
}

func rawDial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dialFrom(t testing.TB, addr, localIP string) *rawConn {
	t.Helper()
	d := net.Dialer{Timeout: time.Minute, LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, localIP, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

// dialDeadline connects to addr with a deadline of clientPatience for
// everything after (liveness); the connection closes when the test ends.
func dialDeadline(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(clientPatience))
	return c
}

// dialMany opens n TCP connections to addr, closed when the test ends.
func dialMany(t testing.TB, addr string, n int) []net.Conn {
	t.Helper()
	raw := make([]net.Conn, n)
	for i := range raw {
		c, err := net.DialTimeout("tcp", addr, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		raw[i] = c
	}
	return raw
}

// runClient runs a client command with a deadline (a liveness bound: a
// client that needs 5 s on a quiet machine was seen to need over 30 on a
// loaded one) and returns its standard output.
func runClient(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, name, args...).Output()
	if ee, ok := err.(*exec.ExitError); ok {
		t.Logf("%s stderr:\n%s", name, ee.Stderr)
	}
	return string(out), err
}

// runLibmemcached is runClient for libmemcached's tools (memccp, memccat):
// they give up after libmemcached's own 5 s and take no option for it, a
// latency bound that a run under -race beside make test's other passes
// missed once. A run that timed out ("A TIMEOUT OCCURRED") is run again,
// for up to clientPatience (liveness: a proxy that never answers still
// fails the test).
func runLibmemcached(t *testing.T, name string, args ...string) (string, error) {
	t.Helper()
	for deadline := time.Now().Add(clientPatience); ; {
		var stdout, stderr bytes.Buffer
		cmd := exec.Command(name, args...)
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if stderr.Len() > 0 {
			t.Logf("%s stderr:\n%s", name, stderr.Bytes())
		}
		if err == nil || !strings.Contains(stderr.String(), "A TIMEOUT OCCURRED") || time.Now().After(deadline) {
			return stdout.String(), err
		}
	}
}

// pymemcachePython returns a python3 that imports pymemcache (Debian's
// first), or skips the test.
func pymemcachePython(t *testing.T) string {
	t.Helper()
	for _, py := range []string{"/usr/bin/python3", "python3"} {
		if exec.Command(py, "-c", "import pymemcache").Run() == nil {
			return py
		}
	}
	t.Skip("python3 with pymemcache not installed (make test installs python3-pymemcache)")
	return ""
}

// statValue returns the value of stat name in kv, "" when absent.
func statValue(kv [][2]string, name string) string {
	for _, p := range kv {
		if p[0] == name {
			return p[1]
		}
	}
	return ""
}

// statusFn returns status bound to t, for status(c.Set(...)).
func statusFn(t *testing.T) func(*mcclient.Response, error) mc.Status {
	return func(r *mcclient.Response, err error) mc.Status {
		t.Helper()
		return status(t, r, err)
	}
}

// closedWithin is waitClosed for any goroutine: it reads conn until it
// closes (EOF or a reset) and returns an error when it is still open after
// d.
func closedWithin(conn net.Conn, d time.Duration) error {
	_ = conn.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, conn)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return fmt.Errorf("connection still open after %v", d)
	}
	return nil
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}

// metaExchange writes in on a text connection and reads lines until the
// reply ends with "MN\r\n" (or the connection's deadline).
func metaExchange(t *testing.T, tc *textConn, in string) string {
	t.Helper()
	if _, err := io.WriteString(tc.c, in); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for !strings.HasSuffix(out.String(), "MN\r\n") {
		l := tc.line(t)
		if l == "" {
			break
		}
		out.WriteString(l)
	}
	return out.String()
}

// runMemccapable runs memccapable against addr in mode ("-b" binary, "-a"
// ascii): every test must pass, and at least want of them.
func runMemccapable(t *testing.T, addr, mode string, want int) {
	t.Helper()
	if _, err := exec.LookPath("memccapable"); err != nil {
		t.Fatalf("memccapable not found (make test installs libmemcached-tools): %v", err)
	}
	host, port, _ := net.SplitHostPort(addr)
	// -t 30: its I/O timeout, 5 s by default, is a latency bound a loaded
	// machine broke (Errno 110 on a binary set over TLS).
	out, err := exec.Command("memccapable", "-h", host, "-p", port, "-t", "30", mode).CombinedOutput()
	t.Logf("memccapable %s:\n%s", mode, out)
	if err != nil {
		t.Fatalf("memccapable %s failed: %v", mode, err)
	}
	passed := len(regexp.MustCompile(`(?m)^(binary|ascii) \S+\s+\[pass\]$`).FindAll(out, -1))
	if bytes.Contains(out, []byte("[FAIL]")) || !bytes.Contains(out, []byte("All tests passed")) {
		t.Fatalf("memccapable %s reported failures", mode)
	}
	if passed < want {
		t.Fatalf("memccapable %s passed %d tests, want %d", mode, passed, want)
	}
	t.Logf("memccapable %s: %d/%d tests passed", mode, passed, passed)
}

func bucketUnits(t *testing.T, p *testProxy, name string) unitCounts {
	t.Helper()
	for _, b := range p.AppendBuckets(nil) {
		if b.Name == name {
			return unitCounts{b.ReadUnits, b.WriteUnits, p.Engine().Bucket(name).Stats().Units}
		}
	}
	t.Fatalf("no bucket %q in the proxy's metrics", name)
	return unitCounts{}
}

// talk sends a NOOP on c and waits for its answer.
func talk(t *testing.T, c net.Conn, when string) {
	t.Helper()
	noop := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpNoop, Opaque: 9}, nil, nil, nil, nil)
	if _, err := c.Write(noop); err != nil {
		t.Fatalf("NOOP %s: %v", when, err)
	}
	if h, err := readStatus(t, c, clientPatience); err != nil || h.Opcode != mc.OpNoop || h.Opaque != 9 {
		t.Fatalf("NOOP %s: %v %+v", when, err, h)
	}
}

// rawConn is a binary-protocol connection dialled from a chosen local
// address (mcclient dials from the default one): 127.0.0.2 is a "remote"
// client for proxy.plain_auth, though Linux routes it over lo.
type rawConn struct {
	t testing.TB
	c net.Conn
	r *bufio.Reader
}

// send writes one request.
func (rc *rawConn) send(op mc.Opcode, extras, key, value []byte) {
	rc.t.Helper()
	b := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: op, Opaque: 7}, nil, extras, key, value)
	if _, err := rc.c.Write(b); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads one response: its status and value. Its deadline, 30 s, is
// a liveness bound: an answer behind a real bcrypt run, under race and
// beside a CPU hog, took over 5 s (TestPenaltyInForceByTheRefusal).
func (rc *rawConn) read() (mc.Status, []byte, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	hdr := make([]byte, mc.HeaderLen)
	if _, err := io.ReadFull(rc.r, hdr); err != nil {
		return 0, nil, err
	}
	h, err := mc.ParseHeader(hdr)
	if err != nil {
		return 0, nil, err
	}
	body := make([]byte, h.BodyLen)
	if _, err := io.ReadFull(rc.r, body); err != nil {
		return 0, nil, err
	}
	return h.Status(), body[int(h.ExtLen)+int(h.KeyLen):], nil
}

// do sends one request and reads its answer.
func (rc *rawConn) do(op mc.Opcode, key, value string) (mc.Status, string) {
	rc.t.Helper()
	var extras []byte
	if op == mc.OpSet {
		extras = mcclient.SetExtras(0, 0)
	}
	rc.send(op, extras, []byte(key), []byte(value))
	st, v, err := rc.read()
	if err != nil {
		rc.t.Fatalf("%s: %v", op, err)
	}
	return st, string(v)
}

// answered waits for an answer (a liveness bound, not a latency check).
func answered(t *testing.T, got <-chan *mcclient.Response, what string) *mcclient.Response {
	t.Helper()
	select {
	case r := <-got:
		if r == nil {
			t.Fatalf("%s: no answer (connection closed)", what)
		}
		return r
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no answer in 30 s", what)
	}
	return nil
}

// setValue sets key to n bytes through c and fails the test unless stored.
func setValue(t *testing.T, c *mcclient.Client, key string, n int) {
	t.Helper()
	if r, err := c.Set([]byte(key), bytes.Repeat([]byte("v"), n)); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatalf("set %s (%d bytes): %v %v", key, n, r, err)
	}
}

// spendBinary sends 1-unit SETs on c (non-blocking mode) until one is
// answered EWouldThrottle, and returns how many were admitted.
func spendBinary(t *testing.T, c *mcclient.Client, key string) int {
	t.Helper()
	for n := 0; n < 1000; n++ {
		r, err := c.Set([]byte(key), []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		switch r.Status() {
		case mc.StatusSuccess:
		case mc.StatusEWouldThrottle:
			return n
		default:
			t.Fatalf("SET %s: %v", key, r.Status())
		}
	}
	t.Fatalf("1000 SETs admitted with the clock standing still: %s is not limited", key)
	return 0
}

// countHits reads meta answers from c until it closes and counts the hits
// ("VA" lines).
func countHits(c net.Conn, hits *atomic.Int64) {
	r := bufio.NewReader(c)
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			return
		}
		if strings.HasPrefix(l, "VA ") {
			hits.Add(1)
		}
	}
}
