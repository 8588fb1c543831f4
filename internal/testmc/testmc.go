// Package testmc holds the helpers that tests of several packages share:
// real memcached servers, free loopback ports, running a server (such as
// the proxy) for the length of a test, cheap password hashes, and reading
// Prometheus scrapes. It is for tests and the benchmark driver only.
package testmc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := PickPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// PickPort is FreePort for code without a testing.TB (the benchmark
// driver): it returns a loopback TCP port that was free a moment ago, and
// never one it returned before in this process (the kernel may hand the
// same free port to two binds in a row: tests running in parallel, or one
// test asking twice, would then get one port for two listeners).
//
// The port is drawn at random below the kernel's ephemeral range
// (pickLow to pickHigh; Linux hands out 32768-60999 by default), so no
// connection of this or another process can take it as its local port
// between the pick and the bind (make test runs several test processes
// that open thousands of connections: a port from the ephemeral range was
// taken so, and a proxy's listener failed to bind). Should that range be
// full, the kernel picks.
func PickPort() (int, error) {
	for range 64 {
		port := pickLow + rand.IntN(pickHigh-pickLow+1)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			l.Close()
			if claim(port) && claimAcross(port) {
				return port, nil
			}
		}
	}
	for range 64 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if claim(port) {
			return port, nil
		}
	}
	return 0, errors.New("free port: every port the kernel offered was handed out before")
}

// The range PickPort draws from: below Linux's default ephemeral ports.
const pickLow, pickHigh = 20000, 32767

// claim records port as returned by PickPort, and reports false if it was
// before.
func claim(port int) bool {
	picked.Lock()
	defer picked.Unlock()
	if _, seen := picked.ports[port]; seen {
		return false
	}
	picked.ports[port] = struct{}{}
	return true
}

// claimAcross records port in a directory the test processes of this
// machine share, and reports false if another process claimed it less
// than claimLife ago: make test runs several test processes at once, and
// two of them drawing the same port between one's pick and its bind made
// the later bind fail. A claim only has to outlive that moment (the port
// is bound, or given up, by then). Without the directory, it claims.
func claimAcross(port int) bool {
	dir := filepath.Join(os.TempDir(), "kvthrottle-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return true
	}
	name := filepath.Join(dir, strconv.Itoa(port))
	for range 2 {
		f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if err == nil {
			f.Close()
			return true
		}
		if !errors.Is(err, fs.ErrExist) {
			return true
		}
		if st, err := os.Stat(name); err != nil || time.Since(st.ModTime()) < claimLife {
			return false
		}
		_ = os.Remove(name) // stale: claim it anew
	}
	return false
}

// claimLife is how long a port claimed by claimAcross stays another
// process's: far longer than a pick takes to become a bind.
const claimLife = time.Minute

// picked is the ports PickPort has returned.
var picked = struct {
	sync.Mutex
	ports map[int]struct{}
}{ports: map[int]struct{}{}}

// FreeAddr returns "127.0.0.1:PORT" for a free port.
func FreeAddr(t testing.TB) string {
	return "127.0.0.1:" + strconv.Itoa(FreePort(t))
}

// Server is a memcached process started for a test.
type Server struct {
	// Addr is the server's plaintext address, 127.0.0.1:port.
	Addr string
	// TLSAddr is its TLS address when it was started with TLS
	// (StartTLS, or Start with UpstreamTLSEnv set), else "".
	TLSAddr string
	// CAFile is the PEM file of the CA that signed its TLS certificate
	// (with TLSAddr), else "".
	CAFile string

	cmd  *exec.Cmd
	log  *bytes.Buffer
	args []string
}

// Start runs memcached on a free loopback port and waits until it accepts
// connections. The test fails if memcached is not installed (make test
// installs it). The server is stopped when the test ends. With
// UpstreamTLSEnv set it is StartTLS(t, TLSOptions{}, extraArgs...):
// Addr stays plaintext, TLSAddr is added.
func Start(t testing.TB, extraArgs ...string) *Server {
	t.Helper()
	if UpstreamTLS() {
		return StartTLS(t, TLSOptions{}, extraArgs...)
	}
	s := &Server{Addr: FreeAddr(t), args: extraArgs}
	startOrFail(t, s)
	return s
}

// startOrFail starts s for the first time and stops it at the end of
// the test. When another process took its port between PickPort and
// memcached's bind (tests run in several processes at once), it starts
// again on new ports, up to three times.
func startOrFail(t testing.TB, s *Server) {
	t.Helper()
	if _, err := exec.LookPath("memcached"); err != nil {
		t.Fatalf("memcached not found in PATH (make test installs it): %v", err)
	}
	t.Cleanup(s.Stop)
	for try := 1; ; try++ {
		err := s.start()
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || try == 3 {
			t.Fatal(err)
		}
		s.Addr = FreeAddr(t)
		if s.TLSAddr != "" {
			s.TLSAddr = FreeAddr(t)
		}
	}
}

// errPortTaken: the port memcached was given accepts connections, but
// another process listens there.
var errPortTaken = errors.New("port taken by another process")

// start runs memcached and waits until it listens on its ports, and
// that its plaintext port is its own (listensOn);
// on failure the process is stopped.
func (s *Server) start() error {
	args := append(s.listenArgs(), "-U", "0", "-m", "64", "-c", "4096", "-t", "2")
	args = append(args, s.args...)
	if uid := currentUID(); uid == 0 {
		args = append(args, "-u", "root")
	}
	s.log = &bytes.Buffer{}
	s.cmd = exec.Command("memcached", args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start memcached: %w", err)
	}
	for _, addr := range []string{s.Addr, s.TLSAddr} {
		if addr == "" {
			continue
		}
		if err := WaitListening(addr, time.Minute); err != nil { // liveness: a loaded machine starts slowly
			s.Stop()
			return fmt.Errorf("memcached on %s: %w (output: %s)", addr, err, s.log.String())
		}
	}
	pid := s.cmd.Process.Pid
	if own, err := listensOn(pid, s.Addr); err == nil && !own {
		s.Stop()
		return fmt.Errorf("memcached (pid %d) on %s: %w (output: %s)", pid, s.Addr, errPortTaken, s.log.String())
	}
	return nil
}

// listensOn reports whether process pid has a socket listening on addr
// (127.0.0.1:port): the kernel's table of TCP sockets (/proc/net/tcp)
// names the listener's inode, and the process's descriptors
// (/proc/PID/fd) name the inodes of its sockets. An error: it cannot
// tell (no /proc).
func listensOn(pid int, addr string) (bool, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false, err
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return false, err
	}
	table, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return false, err
	}
	local := fmt.Sprintf("0100007F:%04X", p)
	var inode string
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == local && f[3] == "0A" { // 0A: LISTEN
			inode = f[9]
			break
		}
	}
	if inode == "" {
		return false, nil
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false, err
	}
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == "socket:["+inode+"]" {
			return true, nil
		}
	}
	return false, nil
}

// Running reports whether s is a memcached this package started and has
// not stopped (a Server made of an address alone is not).
func (s *Server) Running() bool { return s.cmd != nil && s.cmd.Process != nil }

// Stop kills the server and waits for it to exit. It is safe to call twice.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Freeze stops the server process (SIGSTOP) until the returned function
// is called (SIGCONT), which the test's cleanup also does: its connections
// stay open and what is sent to it waits unanswered. It returns once every
// thread of the process has stopped (waitStopped), so that nothing sent
// afterwards is answered.
func (s *Server) Freeze(t testing.TB) (thaw func()) {
	t.Helper()
	if s.cmd == nil || s.cmd.Process == nil {
		t.Fatal("freeze: memcached is not running")
	}
	proc := s.cmd.Process
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("freeze memcached: %v", err)
	}
	if err := waitStopped(proc.Pid, 5*time.Second); err != nil {
		_ = proc.Signal(syscall.SIGCONT)
		t.Fatalf("freeze memcached: %v", err)
	}
	var once sync.Once
	thaw = func() { once.Do(func() { _ = proc.Signal(syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	return thaw
}

// Restart starts the server again on the same port after Stop.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// WaitListening waits until addr accepts a TCP connection; after timeout
// it returns an error saying so.
func WaitListening(addr string, timeout time.Duration) error {
	return WaitListeningWhile(context.Background(), addr, timeout, nil)
}

// WaitListeningWhile is WaitListening that also gives up when ctx is done,
// returning ctx.Err(), or when alive (if not nil) returns an error (the
// server's process has exited, say), returning that error.
func WaitListeningWhile(ctx context.Context, addr string, timeout time.Duration, alive func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if alive != nil {
			if err := alive(); err != nil {
				return err
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not listening after %v: %w", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Eventually waits until cond holds, checking every 5 ms, and fails the
// test, saying what it waited for, when it does not within d.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitStopped waits until every thread of process pid is stopped by a
// signal (state T in /proc/PID/task/TID/stat): a stop signal is delivered
// to each thread as it next enters the kernel, so a thread busy at the
// moment it is sent still runs for a while. Where /proc has no such files
// it returns at once.
func waitStopped(pid int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
		if err != nil || len(tasks) == 0 {
			return nil
		}
		running := ""
		for _, f := range tasks {
			b, err := os.ReadFile(f)
			if err != nil {
				continue // the thread is gone
			}
			// The state follows the command name, which ends with ") ".
			if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] != 'T' && b[i+2] != 't' {
				running = f
				break
			}
		}
		if running == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not stopped after %v", running, timeout)
		}
		time.Sleep(time.Millisecond)
	}
}
