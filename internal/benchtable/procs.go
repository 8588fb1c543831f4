package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/bareforward"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// cleaner runs registered functions once, last registered first. It is safe
// to call run from several goroutines: the later callers wait for the first.
type cleaner struct {
	mu   sync.Mutex
	fns  []func()
	done bool
}

func (c *cleaner) add(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		f()
		return
	}
	c.fns = append(c.fns, f)
}

func (c *cleaner) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
	c.done = true
}

type tools struct {
	memcached  string
	memaslap   string
	goCmd      string
	nutcracker string // "" when not installed (only section 5 needs it)
}

func findTools() (tools, error) {
	var t tools
	var err error
	if t.memcached, err = exec.LookPath("memcached"); err != nil {
		return t, fmt.Errorf("memcached not found (`make deps` installs it): %v", err)
	}
	for _, name := range []string{"memcaslap", "memaslap"} {
		if t.memaslap, err = exec.LookPath(name); err == nil {
			break
		}
	}
	if t.memaslap == "" {
		return t, fmt.Errorf("memcaslap not found (Debian's libmemcached-tools; `make deps` installs it)")
	}
	// Debian installs nutcracker in /usr/sbin, which may not be on PATH.
	if t.nutcracker, err = exec.LookPath("nutcracker"); err != nil {
		if _, err := os.Stat("/usr/sbin/nutcracker"); err == nil {
			t.nutcracker = "/usr/sbin/nutcracker"
		}
	}
	t.goCmd = os.Getenv("GO") // the go command; GO=... overrides it
	if t.goCmd == "" {
		t.goCmd = "go"
	}
	return t, nil
}

// raiseNofile raises RLIMIT_NOFILE to at least want (to the hard limit, or
// above it when privileged). Calling syscall.Setrlimit also makes the
// children started afterwards inherit the raised limit.
func raiseNofile(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if lim.Max < want {
		raised := syscall.Rlimit{Cur: want, Max: want}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised); err == nil {
			return want, nil
		}
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("setrlimit: %w", err)
	}
	if lim.Cur < want {
		return lim.Cur, fmt.Errorf("RLIMIT_NOFILE hard limit is %d, %d needed for the idle-connection test: raise it (ulimit -Hn) or run as root", lim.Cur, want)
	}
	return lim.Cur, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// proc is a long-running child (memcached, the proxy) in its own process
// group, killed with the group on stop and when this program dies.
type proc struct {
	name     string
	args     []string
	cmd      *exec.Cmd
	out      *tailBuffer
	done     chan struct{}
	waitErr  error
	stopOnce sync.Once
}

func startProc(cl *cleaner, name, path string, args ...string) (*proc, error) {
	p := &proc{name: name, args: append([]string{path}, args...), out: &tailBuffer{max: 16 << 10}, done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.waitErr = p.cmd.Wait()
		close(p.done)
	}()
	cl.add(p.stop)
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) ensureAlive() error {
	if p.exited() {
		return fmt.Errorf("%s exited (%v); its output:\n%s", p.name, p.waitErr, p.out.String())
	}
	return nil
}

// stop sends SIGTERM to the process group, then SIGKILL after 5 s.
func (p *proc) stop() {
	p.stopOnce.Do(func() {
		pid := p.cmd.Process.Pid
		_ = syscall.Kill(-pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			logf("%s did not stop within 5 s of SIGTERM: killing it", p.name)
			_ = syscall.Kill(-pid, syscall.SIGKILL)
			<-p.done
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL) // anything left in the group
	})
}

// shortCommandIn runs a command in directory dir to completion (killed with
// its process group when ctx ends) and returns its combined output.
func shortCommandIn(ctx context.Context, dir, name string, args ...string) (string, error) {
	out, _, err := runCommand(ctx, dir, name, args...)
	return out, err
}

// runCommand is shortCommandIn that also returns the process state (nil if
// it did not start), for its CPU time.
func runCommand(ctx context.Context, dir, name string, args ...string) (string, *os.ProcessState, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	setGroupKill(cmd)
	err := cmd.Run()
	return out.String(), cmd.ProcessState, err
}

// setGroupKill puts cmd in its own process group and makes cancellation of
// its context kill the whole group (go test's test binary, for one).
func setGroupKill(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
}

// waitListening waits until p listens on addr, giving up when ctx ends,
// when p exits or after timeout.
func waitListening(ctx context.Context, p *proc, addr string, timeout time.Duration) error {
	err := testmc.WaitListeningWhile(ctx, addr, timeout, p.ensureAlive)
	if err == nil || ctx.Err() != nil || p.exited() {
		return err
	}
	return fmt.Errorf("%s: %s: %w; its output:\n%s", p.name, addr, err, p.out.String())
}

type memcached struct {
	*proc
	addr string
}

func startMemcached(ctx context.Context, cl *cleaner, path string) (*memcached, error) {
	port, err := testmc.PickPort()
	if err != nil {
		return nil, err
	}
	args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-t", "2", "-m", "1024", "-c", "20000"}
	if os.Getuid() == 0 {
		args = append(args, "-u", "root")
	}
	p, err := startProc(cl, "memcached", path, args...)
	if err != nil {
		return nil, err
	}
	m := &memcached{proc: p, addr: "127.0.0.1:" + strconv.Itoa(port)}
	if err := waitListening(ctx, p, m.addr, 10*time.Second); err != nil {
		return nil, err
	}
	logf("memcached listening on %s (pid %d)", m.addr, p.pid())
	return m, nil
}

type proxyProc struct {
	*proc
	addr    string
	tlsAddr string // its [tls] listener; "" when it has none
	config  string
}

// proxyConfig is the generated configuration: throttling on, limits far
// above what any benchmark reaches.
func proxyConfig(listen, upstream, stateFile string) string {
	return fmt.Sprintf(`# generated by internal/benchtable
[proxy]
listen = %q
default_bucket = "default"
max_connections = 20000

[upstream]
servers = [%q]

[throttle]
capacity = 100000000
default_throttle_reserved_units = 0
default_throttle_hard_limit = "unlimited"
state_file = %q

[metrics]
listen = ""

[log]
level = "warn"
format = "console"

[[bucket]]
name = "default"
reserved = 0
hard_limit = "unlimited"
`, listen, upstream, stateFile)
}

// startProxy starts kvthrottle in front of upstream with proxyConfig and,
// when certs is not nil, a [tls] listener too, and checks that a SET and a
// GET go through each listener.
func startProxy(ctx context.Context, cl *cleaner, bin, dir, tag, upstream string, certs *benchCerts) (*proxyProc, error) {
	port, err := testmc.PickPort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	cfg := proxyConfig(addr, upstream, "state-"+tag+".json")
	tlsAddr := ""
	if certs != nil {
		if port, err = testmc.PickPort(); err != nil {
			return nil, err
		}
		tlsAddr = "127.0.0.1:" + strconv.Itoa(port)
		cfg += certs.toml(tlsAddr)
	}
	path := filepath.Join(dir, "kvthrottle-"+tag+".toml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	p, err := startProc(cl, "kvthrottle ("+tag+")", bin, "serve", "--config", path)
	if err != nil {
		return nil, err
	}
	px := &proxyProc{proc: p, addr: addr, tlsAddr: tlsAddr, config: cfg}
	if err := waitListening(ctx, p, addr, 10*time.Second); err != nil {
		return nil, err
	}
	// One SET and one GET through it: the proxy reaches memcached.
	if err := smokeTest(addr); err != nil {
		return nil, fmt.Errorf("%s on %s: %v; its output:\n%s", p.name, addr, err, p.out.String())
	}
	if tlsAddr != "" {
		if err := waitListening(ctx, p, tlsAddr, 10*time.Second); err != nil {
			return nil, err
		}
		if err := smokeVia(tlsDialer(tlsAddr, certs.client)); err != nil {
			return nil, fmt.Errorf("%s on %s (TLS): %v; its output:\n%s", p.name, tlsAddr, err, p.out.String())
		}
		logf("kvthrottle (%s) listening on %s and %s (TLS) (pid %d), upstream %s", tag, addr, tlsAddr, p.pid(), upstream)
		return px, nil
	}
	logf("kvthrottle (%s) listening on %s (pid %d), upstream %s", tag, addr, p.pid(), upstream)
	return px, nil
}

// procStatus returns a field of /proc/PID/status in kB (VmRSS, VmHWM).
func procStatusKB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			return strconv.ParseInt(f[0], 10, 64)
		}
	}
	return 0, fmt.Errorf("no %s in /proc/%d/status", field, pid)
}

// openFDs counts the file descriptors of a process.
func openFDs(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

type machine struct {
	cpu    string
	cores  int
	kernel string
	memGB  float64
}

func describeMachine() machine {
	m := machine{cpu: "?", cores: runtime.NumCPU(), kernel: "?"}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		n := 0
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "model name":
				if m.cpu == "?" {
					m.cpu = strings.TrimSpace(v)
				}
			case "processor":
				n++
			}
		}
		if n > 0 {
			m.cores = n
		}
	}
	ostype, err1 := os.ReadFile("/proc/sys/kernel/ostype")
	release, err2 := os.ReadFile("/proc/sys/kernel/osrelease")
	if err1 == nil && err2 == nil {
		m.kernel = strings.TrimSpace(string(ostype)) + " " + strings.TrimSpace(string(release))
	}
	if kb, err := procMeminfoKB("MemTotal"); err == nil {
		m.memGB = float64(kb) / (1 << 20)
	}
	return m
}

func procMeminfoKB(field string) (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s in /proc/meminfo", field)
}

// serveBareForwarder is the child mode started by startBareForwarder: it
// forwards until SIGTERM or SIGINT, with as many loops as the proxy has
// (GOMAXPROCS), and returns the exit status.
func serveBareForwarder(spec string) int {
	listen, upstream, ok := strings.Cut(spec, " ")
	if !ok {
		fmt.Fprintf(os.Stderr, "benchtable: -bare-forwarder %q: want \"LISTEN UPSTREAM\"\n", spec)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := bareforward.Serve(ctx, listen, upstream, runtime.GOMAXPROCS(0)); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		return 1
	}
	return 0
}

// startBareForwarder starts this program again as the reference forwarder
// in front of upstream.
func startBareForwarder(ctx context.Context, cl *cleaner, upstream string) (*proxyProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bare forwarder: %w", err)
	}
	port, err := testmc.PickPort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := startProc(cl, "bare forwarder", self, "-bare-forwarder", addr+" "+upstream)
	if err != nil {
		return nil, err
	}
	bf := &proxyProc{proc: p, addr: addr}
	if err := waitListening(ctx, p, addr, 10*time.Second); err != nil {
		return nil, err
	}
	if err := smokeTest(addr); err != nil {
		return nil, fmt.Errorf("%s on %s: %v; its output:\n%s", p.name, addr, err, p.out.String())
	}
	logf("bare forwarder listening on %s (pid %d), upstream %s", addr, p.pid(), upstream)
	return bf, nil
}
