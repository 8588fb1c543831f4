package proxy

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// flood runs n connections looping SASL PLAIN with a wrong password,
// reconnecting whenever the proxy closes one, until stop is called. A
// password with a %d verb is a format: each attempt fills in a new number,
// so that every attempt is a new guess (a repeated wrong password is known
// wrong and costs no check: authbad.go).
type flood struct {
	stopping atomic.Bool
	wg       sync.WaitGroup

	pauseGate // paused: each attacker finishes the attempt it has sent, then waits

	mu    sync.Mutex
	conns map[*mcclient.Client]bool

	sent, attempts, authErrors, tmpfails, closes atomic.Int64
}

func startFlood(addr string, n int, user, password string) *flood {
	f := &flood{conns: map[*mcclient.Client]bool{}}
	distinct := strings.Contains(password, "%d")
	var seq atomic.Int64
	for i := 0; i < n; i++ {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			req := mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00" + user + "\x00" + password)}
			for !f.stopping.Load() {
				c, err := mcclient.Dial(addr)
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				f.mu.Lock()
				f.conns[c] = true
				f.mu.Unlock()
				for !f.stopping.Load() {
					f.waitRunning()
					f.sent.Add(1)
					if distinct {
						req.Value = fmt.Appendf(req.Value[:0], "\x00%s\x00"+password, user, seq.Add(1))
					}
					r, err := c.Do(req)
					if err != nil {
						f.closes.Add(1)
						break
					}
					f.attempts.Add(1)
					switch r.Status() {
					case mc.StatusAuthError:
						f.authErrors.Add(1)
					case mc.StatusEtmpfail:
						f.tmpfails.Add(1)
					}
				}
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
				c.Close()
			}
		}()
	}
	return f
}

// stop ends the flood: it closes every attacking connection (some wait
// for a delayed answer) and waits for the attackers to return.
func (f *flood) stop() {
	f.stopping.Store(true)
	f.setPaused(false)
	f.mu.Lock()
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}

// pauseGate pauses and resumes goroutines that look at it between their
// steps (the floods of these tests). Its zero value runs. Safe for
// concurrent use.
type pauseGate struct {
	gmu    sync.Mutex
	gate   chan struct{} // while paused: closed when resumed
	paused bool
}

// setPaused pauses (p) or resumes the goroutines.
func (g *pauseGate) setPaused(p bool) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	if p == g.paused {
		return
	}
	if p {
		g.gate = make(chan struct{})
	} else {
		close(g.gate)
	}
	g.paused = p
}

// pausedGate reports whether the goroutines are paused, and if so the
// channel closed when they resume.
func (g *pauseGate) pausedGate() (<-chan struct{}, bool) {
	g.gmu.Lock()
	defer g.gmu.Unlock()
	return g.gate, g.paused
}

// waitRunning returns at once while running; paused, it blocks until
// resumed, without polling.
func (g *pauseGate) waitRunning() {
	if gate, paused := g.pausedGate(); paused {
		<-gate
	}
}

// floodStats are a flood's counters.
type floodStats struct{ sent, attempts, authErrors, tmpfails, closes int64 }

func (f *flood) stats() floodStats {
	return floodStats{f.sent.Load(), f.attempts.Load(), f.authErrors.Load(), f.tmpfails.Load(), f.closes.Load()}
}

// TestAuthFloodHelper is not a test: TestAuthFloodSparesKnownUsersAndTenants
// runs its flood in a child process (this test binary, with
// KVTHROTTLE_FLOOD=addr,connections,user,password), so that the attackers'
// goroutines do not share this process's scheduler with the client being
// measured, as remote attackers would not. Commands, one per line on
// standard input: p (pause), r (resume), s (print the counters), q (stop,
// print the counters, exit); end of input stops it too.
func TestAuthFloodHelper(t *testing.T) {
	spec := os.Getenv("KVTHROTTLE_FLOOD")
	if spec == "" {
		t.Skip("the flood process of TestAuthFloodSparesKnownUsersAndTenants")
	}
	parts := strings.SplitN(spec, ",", 4)
	if len(parts) != 4 {
		t.Fatalf("KVTHROTTLE_FLOOD=%q: want addr,connections,user,password", spec)
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	f := startFlood(parts[0], n, parts[2], parts[3])
	defer f.stop()
	report := func() {
		st := f.stats()
		fmt.Printf("flood %d %d %d %d %d\n", st.sent, st.attempts, st.authErrors, st.tmpfails, st.closes)
	}
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		switch sc.Text() {
		case "p":
			f.setPaused(true)
		case "r":
			f.setPaused(false)
		case "s":
			report()
		case "q":
			f.stop()
			report()
			return
		}
	}
}

// floodProc drives a flood in a child process (TestAuthFloodHelper).
type floodProc struct {
	t    testing.TB
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Scanner
	done bool
}

func startFloodProc(t testing.TB, addr string, n int, user, password string) *floodProc {
	t.Helper()
	// In the benchmark the attackers run at the lowest CPU priority: on a
	// small machine they share the proxy's cores, and what is measured is
	// what the flood costs the proxy, not what generating it costs. (An
	// attacker elsewhere costs this machine nothing but the proxy's work.)
	// The test runs them at normal priority: beside make test's other
	// passes a niced flood hardly runs at all, and the test judges the
	// latencies only at ten times their targets.
	args := []string{os.Args[0], "-test.run=^TestAuthFloodHelper$", "-test.count=1"}
	if _, bench := t.(*testing.B); bench {
		if nice, err := exec.LookPath("nice"); err == nil {
			args = append([]string{nice, "-n", "19"}, args...)
		}
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), fmt.Sprintf("KVTHROTTLE_FLOOD=%s,%d,%s,%s", addr, n, user, password))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the flood process: %v", err)
	}
	f := &floodProc{t: t, cmd: cmd, in: in, out: bufio.NewScanner(out)}
	t.Cleanup(func() { f.stop() })
	return f
}

func (f *floodProc) send(c string) {
	if _, err := fmt.Fprintln(f.in, c); err != nil {
		f.t.Fatalf("flood process: %v", err)
	}
}

func (f *floodProc) pause()  { f.send("p") }
func (f *floodProc) resume() { f.send("r") }

// read returns the next counters line (test framework lines are skipped).
func (f *floodProc) read() floodStats {
	for f.out.Scan() {
		var st floodStats
		if _, err := fmt.Sscanf(f.out.Text(), "flood %d %d %d %d %d", &st.sent, &st.attempts, &st.authErrors, &st.tmpfails, &st.closes); err == nil {
			return st
		}
	}
	f.t.Fatalf("flood process ended: %v", f.out.Err())
	return floodStats{}
}

func (f *floodProc) stats() floodStats {
	f.send("s")
	return f.read()
}

// stop ends the flood and returns its final counters; safe to call twice.
func (f *floodProc) stop() floodStats {
	if f.done {
		return floodStats{}
	}
	f.done = true
	var st floodStats
	if _, err := fmt.Fprintln(f.in, "q"); err == nil {
		st = f.read()
	}
	_ = f.in.Close()
	waited := make(chan error, 1)
	go func() { waited <- f.cmd.Wait() }()
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		_ = f.cmd.Process.Kill()
		<-waited
	}
	return st
}

// getLatencies times sequential GETs of key on c for d.
func getLatencies(t testing.TB, c *mcclient.Client, key []byte, d time.Duration) []time.Duration {
	t.Helper()
	var ds []time.Duration
	for end := time.Now().Add(d); time.Now().Before(end); {
		start := time.Now()
		r, err := c.Get(key)
		ds = append(ds, time.Since(start))
		if err != nil || r.Status() != mc.StatusSuccess {
			t.Fatalf("tenant GET: %v %+v", err, r)
		}
	}
	return ds
}

// TestAuthFloodSparesKnownUsersAndTenants: 100 connections looping wrong
// passwords (from the same address as everyone else: loopback) neither lock
// out a user whose password was verified recently (every login succeeds,
// from the cache, p99 <= 10 ms) nor slow an authenticated tenant's GETs (p99
// within 2x of the same test's baseline). Before the cache and the
// per-source budget, logins got Etmpfail and the GET p99 rose 20x and more.
// The latency targets are checked without the race detector only (it slows
// every path by a different factor): make test runs the test again without
// it (PROXY_NORACE_TESTS); the numbers are logged either way.
//
// Those latency targets are BenchmarkAuthFlood's, on the real clock; the
// test asserts what the machine's speed cannot change (every login of the
// known user succeeds, the flood is refused all three ways) and catches a
// breakage of the latencies (ten times their targets).
func TestAuthFloodSparesKnownUsersAndTenants(t *testing.T) {
	r := authFlood(t)
	if judged := testmc.UnderRace(true, false); !judged {
		return // the race detector slows every path by a different factor
	}
	if limit := 10 * max(10*time.Millisecond, 2*r.loginBase); r.loginFlooded > limit {
		t.Errorf("login of a recently verified user took %v during the flood (%v without), ten times the target (10 ms)", r.loginFlooded, r.loginBase)
	}
	if r.getFlooded > 10*2*r.getBase {
		t.Errorf("tenant GET p99 = %v during the flood, %v alone: ten times the target (2x)", r.getFlooded, r.getBase)
	}
}

// BenchmarkAuthFlood reports TestAuthFloodSparesKnownUsersAndTenants's
// latencies with their targets: a recently verified user's login within
// 10 ms during the flood, a tenant's GET p99 within 2x of its baseline.
// The b.N loop is not used: run it with -benchtime 1x.
func BenchmarkAuthFlood(b *testing.B) {
	r := authFlood(b)
	b.ReportMetric(float64(r.loginFlooded)/1e6, "login_flooded_ms")
	b.ReportMetric(float64(r.getFlooded)/float64(r.getBase), "get_p99_rise_x")
	if r.loginFlooded > max(10*time.Millisecond, 2*r.loginBase) || r.getFlooded > 2*r.getBase {
		b.Logf("a target missed: login %v during the flood (10 ms), GET p99 %v against %v alone (2x)", r.loginFlooded, r.getFlooded, r.getBase)
	}
}

// authFloodResult is what authFlood measured: medians over its windows of
// the slowest login of a recently verified user and of a tenant's GET p99,
// without and with the flood.
type authFloodResult struct {
	loginBase, loginFlooded time.Duration
	getBase, getFlooded     time.Duration
}

// authFlood runs a flood of wrong passwords from 100 connections against a
// proxy beside a tenant's GETs and a known user's logins, and fails t if a
// known user's login fails or the flood is not refused.
func authFlood(t testing.TB) authFloodResult {
	p := startProxy(t, testConfig{tail: tenantTail(t)})
	login(t, p.Addr, "alice").Close() // verified once: remembered
	bob := login(t, p.Addr, "bob")
	key := []byte("flood-key")
	if r, err := bob.Set(key, make([]byte, 100)); status(t, r, err) != mc.StatusSuccess {
		t.Fatalf("set: %s", r.Status())
	}
	getLatencies(t, bob, key, 100*time.Millisecond) // warm up
	logins := func(n int) []time.Duration {
		var ds []time.Duration
		for i := 0; i < n; i++ {
			c, err := mcclient.Dial(p.Addr)
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			r, err := c.Do(mcclient.Request{Opcode: mc.OpSASLAuth, Key: []byte("PLAIN"), Value: []byte("\x00alice\x00alice-pw")})
			ds = append(ds, time.Since(start))
			c.Close()
			if err != nil || r.Status() != mc.StatusSuccess {
				t.Fatalf("login of a recently verified user: %v %+v", err, r)
			}
		}
		return ds
	}

	const attackers = 100
	f := startFloodProc(t, p.Addr, attackers, "bob", "wrong-pw-%d")
	// One guess is refused by bcrypt; the others wait their turns, one per
	// penalty (a user's guesses at an address are bounded by the
	// connections that wait for them, not refused for a full queue).
	eventually(t, time.Minute, "the flood to be refused and to wait", func() bool {
		n, _ := queuedChecks(p, authPair("127.0.0.1", "bob"))
		return f.stats().authErrors >= 1 && n >= attackers/2
	})
	// Windows with and without the flood alternate, so that whatever else
	// the machine does weighs on both alike. Each window times GETs, then
	// 20 logins; the verdicts take the median over windows of each
	// window's p99 (of the logins: their maximum), which a burst of
	// outside load in a few windows does not move.
	const perWindow = 20
	windows := 12
	if testmc.RaceEnabled {
		windows = 4 // the latencies are not judged: save time
	}
	if _, bench := t.(*testing.B); bench {
		windows = 24
	}
	var getAlone, getFlood, loginAlone, loginFlood []time.Duration
	var allLogins []time.Duration
	for i := 0; i < windows; i++ {
		f.pause()
		time.Sleep(30 * time.Millisecond) // the checks under way finish
		getAlone = append(getAlone, p99(getLatencies(t, bob, key, 100*time.Millisecond)))
		loginAlone = append(loginAlone, p99(logins(perWindow)))
		before := f.stats().sent
		f.resume()
		// Resumed: 50 guesses sent, or half the attackers' guesses queued
		// already (they wait for their answers, which come one per
		// penalty: on a loaded machine, too slowly for 50 new ones).
		eventually(t, time.Minute, "the flood to resume", func() bool {
			n, _ := queuedChecks(p, authPair("127.0.0.1", "bob"))
			return f.stats().sent > before+50 || n >= attackers/2
		})
		getFlood = append(getFlood, p99(getLatencies(t, bob, key, 100*time.Millisecond)))
		ls := logins(perWindow)
		allLogins = append(allLogins, ls...)
		loginFlood = append(loginFlood, p99(ls))
	}
	st := f.stop()
	getBase, getFlooded := median(getAlone), median(getFlood)
	loginBase, loginFlooded := median(loginAlone), median(loginFlood)
	t.Logf("flood: %d attempts (%d AuthError, %d Etmpfail), %d connections closed by the proxy",
		st.attempts, st.authErrors, st.tmpfails, st.closes)
	t.Logf("tenant GET p99 (median of %d windows): %v alone, %v during the flood (%.2fx)",
		windows, getBase, getFlooded, float64(getFlooded)/float64(getBase))
	t.Logf("recently verified user's login, slowest of %d (median of %d windows): %v alone, %v during the flood; all %d during the flood: p50 %v, p99 %v",
		perWindow, windows, loginBase, loginFlooded, len(allLogins), median(allLogins), p99(allLogins))
	if st.authErrors == 0 {
		t.Error("the flood was not refused by bcrypt")
	}
	return authFloodResult{loginBase: loginBase, loginFlooded: loginFlooded, getBase: getBase, getFlooded: getFlooded}
}
