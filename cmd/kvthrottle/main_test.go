package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// buildBinary returns the kvthrottle binary of this tree
// (testmc.KvthrottleBin).
func buildBinary(t *testing.T) string {
	t.Helper()
	return testmc.KvthrottleBin(t, ".", t.TempDir())
}

func writeConfig(t *testing.T, dir, body string) string {
	t.Helper()
	p := filepath.Join(dir, "kvthrottle.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func baseConfig(listen, server string) string {
	return fmt.Sprintf(`
[proxy]
listen = %q
[upstream]
servers = [%q]
[metrics]
listen = ""
[log]
level = "info"
format = "json"
[[bucket]]
name = "default"
`, listen, server)
}

// TestServeDrainsOnSIGTERM: SIGTERM stops accepting, answers the commands
// in flight, and exits 0.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	bin := buildBinary(t)
	m := testmc.Start(t)
	dir := t.TempDir()
	listen := testmc.FreeAddr(t)
	cfg := writeConfig(t, dir, baseConfig(listen, m.Addr))
	var logs bytes.Buffer
	cmd := exec.Command(bin, "serve", "--config", cfg)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if err := testmc.WaitListening(listen, 10*time.Second); err != nil {
		t.Fatalf("proxy not listening: %v\n%s", err, logs.String())
	}
	c, err := mcclient.Dial(listen)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A pipelined batch in flight when the signal arrives.
	val := bytes.Repeat([]byte("v"), 10000)
	var ops []uint32
	for i := 0; i < 500; i++ {
		ops = append(ops, c.Send(mcclient.Request{Opcode: mc.OpSet, Extras: mcclient.SetExtras(0, 0), Key: []byte(fmt.Sprintf("k%d", i)), Value: val}))
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		r, err := c.Read()
		if err != nil {
			t.Fatalf("response %d of %d lost during drain: %v", i, len(ops), err)
		}
		if r.Opaque != op || r.Status() != mc.StatusSuccess {
			t.Fatalf("response %d: opaque %d status %s", i, r.Opaque, r.Status())
		}
	}
	errc := make(chan error, 1)
	go func() { errc <- cmd.Wait() }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("proxy did not exit after SIGTERM\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "drained") {
		t.Errorf("no drain log line:\n%s", logs.String())
	}
}

// TestServeRejectsBadConfig: an unknown key or bad value stops the start
// with a message naming the key.
func TestServeRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	for name, tc := range map[string]struct{ body, want string }{
		"unknown key": {"[proxy]\nlisten = \"127.0.0.1:1\"\nlisen = \"x\"\n", "lisen"},
		"bad value":   {"[throttle]\ncapacity = \"lots\"\n", "throttle.capacity"},
		"bad timeout": {"[upstream]\ntimeout = \"soon\"\n", "upstream.timeout"},
	} {
		t.Run(name, func(t *testing.T) {
			p := writeConfig(t, dir, tc.body)
			var stderr bytes.Buffer
			code := run([]string{"serve", "--config", p}, nil, &bytes.Buffer{}, &stderr)
			if code == 0 || !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("exit %d, stderr %q: want failure naming %q", code, stderr.String(), tc.want)
			}
		})
	}
}

func TestHashPasswordAndVersion(t *testing.T) {
	testmc.SkipUnderRace(t) // bcrypt and SCRAM at their default costs, on one goroutine
	var out, errb bytes.Buffer
	if code := run([]string{"hash-password"}, strings.NewReader("s3cret\n"), &out, &errb); code != 0 {
		t.Fatalf("hash-password: exit %d: %s", code, errb.String())
	}
	// The output is the SCRAM lines, ready to paste, and last the bare
	// password_hash value (the contract scripts rely on): a user with them
	// parses, and logs in with the password (PLAIN and SCRAM both).
	if strings.Contains(out.String(), "s3cret") || strings.Count(out.String(), "\n") != 3 {
		t.Fatalf("hash-password output %q: want 3 lines without the password", out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	last := lines[len(lines)-1]
	if !strings.HasPrefix(last, "$2") {
		t.Errorf("last line %q: want the bare password_hash value", last)
	}
	user := strings.Join(lines[:len(lines)-1], "\n") + fmt.Sprintf("\npassword_hash = %q\n", last)
	cfg, err := bucketcfg.Parse([]byte("[[user]]\nname = \"u\"\n" + user))
	if err != nil {
		t.Fatalf("the printed lines do not parse as a [[user]]: %v", err)
	}
	u := cfg.User("u")
	if _, err := cfg.Authenticate("u", "s3cret"); err != nil || !u.HasSCRAM(bucketcfg.SCRAMSHA256) || !u.HasSCRAM(bucketcfg.SCRAMSHA512) {
		t.Fatalf("printed credentials: PLAIN %v, SCRAM-SHA-256 %v, SCRAM-SHA-512 %v", err, u.HasSCRAM(bucketcfg.SCRAMSHA256), u.HasSCRAM(bucketcfg.SCRAMSHA512))
	}
	for _, h := range []bucketcfg.SCRAMHash{bucketcfg.SCRAMSHA256, bucketcfg.SCRAMSHA512} {
		if sc, _ := cfg.SCRAMCredentials(h, "u"); sc.Iters != bucketcfg.DefaultSCRAMIterations {
			t.Errorf("%s iterations %d, want %d", h, sc.Iters, bucketcfg.DefaultSCRAMIterations)
		}
	}
	out.Reset()
	if code := run([]string{"version"}, nil, &out, &errb); code != 0 || !strings.HasPrefix(out.String(), "kvthrottle ") {
		t.Fatalf("version: %d %q", code, out.String())
	}
}
