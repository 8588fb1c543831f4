package docscheck

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// TestReadmeTour runs the README's tour as a newcomer would, against a
// memcached and a proxy of its own on free loopback ports: every sh block
// in order, in a directory holding config.example.toml and bin/kvthrottle,
// each block's output compared with the text block that follows it. `make
// run [CONFIG=FILE]` (re)starts the test's proxy on that file, as make run
// would; other make commands are only checked against the Makefile (by
// TestDocCommandsExist). The tour's addresses are rewritten to the test's
// ports, ctl gets --addr where the README relies on its default, and top
// runs one frame.
func TestReadmeTour(t *testing.T) {
	needTools(t, "memcached", "nc", "memccp", "memccat", "curl")
	bin := kvthrottleBin(t)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(bin, filepath.Join(dir, "bin", "kvthrottle")); err != nil {
		t.Fatal(err)
	}
	mc := testmc.Start(t)
	proxyAddr, metricsAddr := testmc.FreeAddr(t), testmc.FreeAddr(t)
	host, port, _ := net.SplitHostPort(proxyAddr)
	rw := strings.NewReplacer(
		"127.0.0.1:11311", proxyAddr,
		"127.0.0.1 11311", host+" "+port, // nc HOST PORT
		"127.0.0.1:11211", mc.Addr,
		"127.0.0.1:9150", metricsAddr,
	)
	example := readRepo(t, "config.example.toml")
	if err := os.WriteFile(filepath.Join(dir, "config.example.toml"), []byte(rw.Replace(example)), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &tourProxy{t: t, dir: dir, addr: proxyAddr, metrics: metricsAddr}
	defer p.stop()

	blocks := Blocks(readRepo(t, "README.md"))
	ran := 0
	for i, b := range blocks {
		if b.Lang != "sh" {
			continue
		}
		where := "README.md:" + strconv.Itoa(b.Line)
		if makeWords, ok := makeBlock(b.Body); ok {
			for _, w := range makeWords {
				if len(w) > 0 && w[0] == "run" {
					p.restart(configOf(w[1:]), where)
				}
			}
			continue
		}
		if p.cmd == nil {
			t.Fatalf("%s: the tour runs a command before `make run`", where)
		}
		out := runBlock(t, dir, rewriteTour(rw.Replace(b.Body), proxyAddr), where)
		ran++
		if i+1 < len(blocks) && blocks[i+1].Lang == "text" {
			if got, want := normalize(out), normalize(blocks[i+1].Body); got != want {
				t.Errorf("%s: output\n%s\nwant (README.md:%d)\n%s", where, got, blocks[i+1].Line, want)
			}
		}
	}
	if ran < 5 {
		t.Errorf("ran %d blocks of the README's tour; expected the whole tour (5 or more)", ran)
	}
}

// makeBlock reports whether every command line of body is a make
// command, and returns their words after "make".
func makeBlock(body string) ([][]string, bool) {
	var out [][]string
	for _, line := range strings.Split(body, "\n") {
		w := shellWords(line)
		if len(w) == 0 {
			continue
		}
		if w[0] != "make" {
			return nil, false
		}
		out = append(out, w[1:])
	}
	return out, len(out) > 0
}

// configOf returns the CONFIG=FILE of make's words, or make run's default.
func configOf(words []string) string {
	for _, w := range words {
		if v, ok := strings.CutPrefix(w, "CONFIG="); ok {
			return v
		}
	}
	return "config.example.toml"
}

var (
	ctlWord = regexp.MustCompile(`(kvthrottle ctl)( |$)`)
	topLine = regexp.MustCompile(`(?m)(kvthrottle ctl .*\btop)[ \t]*$`)
)

// rewriteTour points ctl commands without --addr at the test's proxy and
// makes top stop after one frame.
func rewriteTour(script, addr string) string {
	lines := strings.Split(script, "\n")
	for i, l := range lines {
		if !strings.Contains(l, "--addr") {
			lines[i] = ctlWord.ReplaceAllString(l, "$1 --addr "+addr+"$2")
		}
	}
	return topLine.ReplaceAllString(strings.Join(lines, "\n"), "$1 --iterations 1")
}

// runBlock runs script with bash in dir and returns its standard output;
// the test fails if it fails.
func runBlock(t *testing.T, dir, script, where string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Dir = dir
	cmd.Env = withoutEnv(os.Environ(), "KVTHROTTLE_PASSWORD")
	cmd.WaitDelay = time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nscript:\n%s\nstdout:\n%s\nstderr:\n%s", where, err, script, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// normalize makes outputs comparable: CRLF as LF, no trailing blanks on a
// line, no blank lines at the end.
func normalize(s string) string {
	lines := strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n")
	for i, l := range lines {
		lines[i] = strings.TrimRight(l, " \t")
	}
	return strings.TrimRight(strings.Join(lines, "\n"), "\n")
}

func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, e := range env {
		if !strings.HasPrefix(e, name+"=") {
			out = append(out, e)
		}
	}
	return out
}

// tourProxy is the proxy `make run` would run: bin/kvthrottle serve in the
// tour's directory.
type tourProxy struct {
	t             *testing.T
	dir           string
	addr, metrics string
	cmd           *exec.Cmd
	log           *testmc.LockedBuffer // written by exec's copier, read by the test
}

// restart stops the running proxy, if any, and starts one on config (a
// path relative to the tour's directory), waiting until it is ready.
func (p *tourProxy) restart(config, where string) {
	p.t.Helper()
	p.stop()
	p.log = &testmc.LockedBuffer{}
	p.cmd = exec.Command(filepath.Join("bin", "kvthrottle"), "serve", "--config", config)
	p.cmd.Dir = p.dir
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("%s: start the proxy: %v", where, err)
	}
	ready := func() bool {
		resp, err := http.Get("http://" + p.metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.Now().Add(10 * time.Second)
	for !ready() {
		if time.Now().After(deadline) {
			p.t.Fatalf("%s: the proxy on %s is not ready after 10s; its log:\n%s", where, config, p.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the proxy as Ctrl-C would, and kills it if it does not exit.
func (p *tourProxy) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			p.t.Errorf("the proxy exited with %v after SIGINT; its log:\n%s", err, p.log.String())
		}
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		p.t.Errorf("the proxy did not exit within 10s of SIGINT; its log:\n%s", p.log.String())
	}
	p.cmd = nil
}
