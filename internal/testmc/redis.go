package testmc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Redis is a redis-server process started for a test by StartRedis: on a
// loopback port, without persistence (a restart comes back empty), with a
// temporary directory of its own.
type Redis struct {
	// Addr is "127.0.0.1:PORT"; it stays the same across Restart.
	Addr string
	// TLSAddr is the TLS port's "127.0.0.1:PORT" (StartRedisTLS), and
	// CAFile the PEM file of the CA that issued the server's certificate;
	// both "" otherwise.
	TLSAddr, CAFile string

	dir  string
	conf string     // a configuration file, redis-server's first argument (a sentinel's)
	args []string   // extra arguments of redis-server (a cluster node's)
	mu   sync.Mutex // guards cmd, exited, log
	cmd  *exec.Cmd
	// exited is closed when the process started last has exited and been
	// waited for.
	exited chan struct{}
	log    *LockedBuffer
}

// StartRedis runs redis-server on a free loopback port, with no
// persistence (no RDB snapshots, no AOF), protected mode off and its own
// temporary directory, and waits until it answers PING. The test fails
// at once if redis-server is not installed (make test installs it) or it
// does not answer within 5 s. The server is stopped when the test ends.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found in PATH (make test installs it: Debian package redis-server): %v", err)
	}
	r := &Redis{Addr: FreeAddr(t), dir: t.TempDir()}
	t.Cleanup(r.Stop)
	r.start(t)
	return r
}

// URL returns the server's address as a go-redis URL for database 0:
// "redis://127.0.0.1:PORT/0".
func (r *Redis) URL() string { return "redis://" + r.Addr + "/0" }

func (r *Redis) start(t testing.TB) {
	t.Helper()
	_, port, _ := net.SplitHostPort(r.Addr)
	args := []string{"--bind", "127.0.0.1", "--port", port,
		"--save", "", "--appendonly", "no",
		"--protected-mode", "no", "--daemonize", "no",
		"--dir", r.dir, "--logfile", "", "--loglevel", "warning"}
	if r.conf != "" {
		args = append([]string{r.conf}, args...)
	}
	cmd := exec.Command("redis-server", append(args, r.args...)...)
	log := &LockedBuffer{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	exited := make(chan struct{})
	// This goroutine is owned by the process: it ends when the process
	// exits, which Stop and Kill (and the test's cleanup) make sure of.
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	r.mu.Lock()
	r.cmd, r.exited, r.log = cmd, exited, log
	r.mu.Unlock()

	alive := func() error {
		select {
		case <-exited:
			return errors.New("redis-server exited")
		default:
			return nil
		}
	}
	deadline := time.Now().Add(time.Minute) // liveness: a loaded machine starts slowly
	err := WaitListeningWhile(t.Context(), r.Addr, time.Minute, alive)
	for err == nil {
		perr := pingRedis(r.Addr)
		if perr == nil {
			return
		}
		if err = alive(); err != nil {
			break
		}
		if time.Now().After(deadline) {
			err = perr
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.Kill()
	t.Fatalf("redis-server on %s: %v (output: %s)", r.Addr, err, log.String())
}

// pingRedis sends one inline PING to addr and wants "+PONG" back.
func pingRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	if line = strings.TrimRight(line, "\r\n"); line != "+PONG" {
		return fmt.Errorf("ping: answered %q", line)
	}
	return nil
}

// process returns the running process and the channel closed when it has
// exited, or nil when none was started or it has been stopped.
func (r *Redis) process() (*exec.Cmd, chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cmd, r.exited
}

// Stop ends the server (SIGTERM, after a SIGCONT in case it is frozen;
// SIGKILL if it has not exited within 5 s) and waits for it. Its data is
// lost. Safe to call twice, and from any goroutine.
func (r *Redis) Stop() {
	cmd, exited := r.process()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	r.forget(cmd)
}

// Kill ends the server at once (SIGKILL), as a crash would, and waits for
// it. Its data is lost. Safe to call twice, and from any goroutine.
func (r *Redis) Kill() {
	cmd, exited := r.process()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
	r.forget(cmd)
}

func (r *Redis) forget(cmd *exec.Cmd) {
	r.mu.Lock()
	if r.cmd == cmd {
		r.cmd, r.exited = nil, nil
	}
	r.mu.Unlock()
}

// Freeze stops the server process (SIGSTOP) until the returned function
// is called (SIGCONT), which the test's cleanup also does: its connections
// stay open and what is sent to it waits unanswered. It returns once the
// process has stopped, as Server.Freeze does.
func (r *Redis) Freeze(t testing.TB) (thaw func()) {
	t.Helper()
	cmd, _ := r.process()
	if cmd == nil {
		t.Fatal("freeze: redis-server is not running")
	}
	proc := cmd.Process
	if err := proc.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("freeze redis-server: %v", err)
	}
	if err := waitStopped(proc.Pid, 5*time.Second); err != nil {
		_ = proc.Signal(syscall.SIGCONT)
		t.Fatalf("freeze redis-server: %v", err)
	}
	var once sync.Once
	thaw = func() { once.Do(func() { _ = proc.Signal(syscall.SIGCONT) }) }
	t.Cleanup(thaw)
	return thaw
}

// Restart starts the server again on the same port, stopping it first if
// it still runs. Without persistence it comes back empty. The test fails
// if it does not answer PING within 5 s.
func (r *Redis) Restart(t testing.TB) {
	t.Helper()
	r.Stop()
	r.start(t)
}

// LockedBuffer is a bytes.Buffer that a process's output copier and a
// test may use at once.
type LockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Output returns what the server started last has written (its log, at
// level warning unless its arguments say otherwise).
func (r *Redis) Output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.log == nil {
		return ""
	}
	return r.log.String()
}

// StartRedisReplica runs a redis-server as StartRedis does, replicating
// primary (--replicaof), and waits until it has synchronised with it
// (master_link_status:up, within 20 s).
func StartRedisReplica(t testing.TB, primary *Redis) *Redis {
	t.Helper()
	host, port := splitAddr(primary.Addr)
	r := &Redis{Addr: FreeAddr(t), dir: t.TempDir(), args: []string{"--replicaof", host, port, "--repl-diskless-sync-delay", "0"}}
	t.Cleanup(r.Stop)
	r.start(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := Cli(r.Addr, "info", "replication")
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis replica %s not synchronised with %s: %s %v", r.Addr, primary.Addr, info, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartRedisConf runs redis-server as StartRedis does, on addr, with the
// configuration file conf (redis-server's first argument; the options of
// StartRedis and args come after it and override it) and args (e.g.
// "--sentinel").
func StartRedisConf(t testing.TB, conf, addr string, args ...string) *Redis {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found in PATH (make test installs it: Debian package redis-server): %v", err)
	}
	r := &Redis{Addr: addr, dir: t.TempDir(), conf: conf, args: args}
	t.Cleanup(r.Stop)
	r.start(t)
	return r
}
