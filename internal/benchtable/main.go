// Command benchtable runs the benchmarks of DESIGN.md section 9 side by side
// on this machine and prints one markdown table (also written to
// bench-results.md): memcaslap throughput directly against memcached and
// through kvthrottle (and, for reference, through bareforward, the cheapest
// forwarder we know how to write), added latency at a moderate fixed rate, the Go
// benchmarks with -benchmem, the proxy's resident memory holding 10,000
// idle client connections, memcaslap's text-protocol load directly,
// through kvthrottle and through twemproxy (nutcracker), and the proxy's
// TLS listener against its plaintext one (throughput, added latency,
// memory of idle TLS connections; issue 15).
//
// `make bench` runs it (after `make deps build`) from the module root;
// `make bench BENCHFLAGS=-quick` runs a shorter version, and
// BENCHFLAGS="-sections 1" only the throughput comparison (see -help for the
// other flags). The table is also written to bench-results.md at the module
// root. Progress goes to stderr, the table to stdout.
//
// Everything it starts (memcached, the proxy, nutcracker, memcaslap, go test, client
// connections, a temporary directory) is stopped or removed when it exits,
// also on error and on Ctrl-C; children run in their own process groups
// and are killed by the kernel should this program die (Pdeathsig).
//
// The machine may be shared: the CPU used by other processes during each
// measurement is reported, and verdicts measured while it was high are
// flagged as unreliable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

type options struct {
	quick bool

	rounds   int           // rounds of direct, kvthrottle, bare forwarder runs per throughput case
	duration time.Duration // length of one memcaslap run
	threads  int           // memcaslap threads
	window   string        // memcaslap -w

	latRate  int           // requests/s of the latency load generator
	latConns int           // its connections
	latDur   time.Duration // measured seconds per side

	benchCount int
	benchTime  string

	idleConns int

	tlsIdleConns int // idle TLS connections for section 6's memory test
	tlsDepth     int // requests at once per connection in section 6's pipelined throughput case
	tlsLatRounds int // rounds of section 6's latency test

	sections string // which of 1-6 to run

	bin       string // kvthrottle binary
	beforeBin string // a second kvthrottle binary measured beside bin in sections 1 and 2 ("": none)
	out       string // markdown copy

	bareForwarder string // internal: "LISTEN UPSTREAM", run as the reference forwarder
}

func main() {
	var o options
	flag.BoolVar(&o.quick, "quick", false, "short run: 2 rounds of 2 s runs, 2 s latency, -count 2 -benchtime 100ms")
	flag.IntVar(&o.rounds, "rounds", 0, "rounds of memcaslap runs per throughput case, one run per side (default 5, -quick 2)")
	flag.DurationVar(&o.duration, "duration", 0, "length of one memcaslap run, whole seconds (default 4s, -quick 2s)")
	flag.IntVar(&o.threads, "threads", 2, "memcaslap threads (-T)")
	flag.StringVar(&o.window, "window", "1k", "memcaslap task window per concurrency (-w)")
	flag.IntVar(&o.latRate, "lat-rate", 2000, "requests/s of the latency load generator")
	flag.IntVar(&o.latConns, "lat-conns", 4, "connections of the latency load generator")
	flag.DurationVar(&o.latDur, "lat-duration", 0, "measured time per side of the latency test (default 5s, -quick 2s)")
	flag.IntVar(&o.benchCount, "count", 0, "go test -count (default 5, -quick 2)")
	flag.StringVar(&o.benchTime, "benchtime", "", "go test -benchtime (default 200ms, -quick 100ms)")
	flag.IntVar(&o.idleConns, "idle-conns", 10000, "idle client connections for the memory test")
	flag.IntVar(&o.tlsIdleConns, "tls-idle-conns", 10000, "idle TLS client connections for section 6's memory test (fewer are measured, and the rest extrapolated, when they do not fit in the proxy's RLIMIT_NOFILE)")
	flag.IntVar(&o.tlsDepth, "tls-depth", 16, "requests written at once per connection in section 6's extra pipelined throughput case, 32 connections (1: no such case)")
	flag.IntVar(&o.tlsLatRounds, "tls-lat-rounds", 0, "rounds of section 6's latency test, one -lat-duration run per side each (default 2, -quick 1)")
	flag.StringVar(&o.sections, "sections", "123456", "the sections to run: 1 throughput, 2 latency, 3 Go benchmarks, 4 memory, 5 text-protocol throughput (with twemproxy), 6 TLS against plaintext (throughput, latency, memory)")
	flag.StringVar(&o.bin, "bin", "bin/kvthrottle", "kvthrottle binary (relative to the module root)")
	flag.StringVar(&o.beforeBin, "before-bin", "", "a second kvthrottle binary (built from an earlier commit, say) measured in the same rounds as -bin in sections 1 and 2, as \"kvthrottle before\": before and after figures from one run")
	flag.StringVar(&o.out, "out", "bench-results.md", "where the markdown table is also written (relative to the module root); \"\" for nowhere")
	flag.StringVar(&o.bareForwarder, "bare-forwarder", "", "internal: run only the reference forwarder, \"LISTEN UPSTREAM\" (benchtable starts itself this way)")
	flag.Parse()
	if o.bareForwarder != "" {
		os.Exit(serveBareForwarder(o.bareForwarder))
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "benchtable: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	o.defaults()

	cl := &cleaner{}
	ctx, cancel := context.WithCancel(context.Background())
	sigc := make(chan os.Signal, 2)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-sigc
		logf("%v: stopping everything this program started", s)
		cancel()
		// main stops everything on its way out; should it be stuck, stop
		// everything from here (a second signal does that at once).
		select {
		case <-sigc:
		case <-time.After(15 * time.Second):
		}
		cl.run()
		os.Exit(130)
	}()

	err := run(ctx, &o, cl)
	cl.run()
	signal.Stop(sigc)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "benchtable: interrupted")
			os.Exit(130)
		}
		fmt.Fprintf(os.Stderr, "benchtable: %v\n", err)
		os.Exit(1)
	}
}

func (o *options) defaults() {
	pick := func(v *int, normal, quick int) {
		if *v == 0 {
			*v = normal
			if o.quick {
				*v = quick
			}
		}
	}
	pickD := func(v *time.Duration, normal, quick time.Duration) {
		if *v == 0 {
			*v = normal
			if o.quick {
				*v = quick
			}
		}
	}
	pick(&o.rounds, 5, 2)
	pick(&o.benchCount, 5, 2)
	pick(&o.tlsLatRounds, 2, 1)
	o.tlsDepth = max(o.tlsDepth, 1)
	pickD(&o.duration, 4*time.Second, 2*time.Second)
	pickD(&o.latDur, 5*time.Second, 2*time.Second)
	if o.benchTime == "" {
		o.benchTime = "200ms"
		if o.quick {
			o.benchTime = "100ms"
		}
	}
	if o.duration < time.Second {
		o.duration = time.Second
	}
	o.duration = o.duration.Round(time.Second)
}

func (o *options) has(section byte) bool { return strings.IndexByte(o.sections, section) >= 0 }

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "benchtable %s: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// moduleRoot is the nearest directory at or above the working directory
// holding go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod at or above the working directory: run from the kvthrottle module")
		}
		dir = parent
	}
}

func run(ctx context.Context, o *options, cl *cleaner) error {
	began := time.Now()
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	if !filepath.IsAbs(o.bin) {
		o.bin = filepath.Join(root, o.bin)
	}
	if _, err := os.Stat(o.bin); err != nil {
		return fmt.Errorf("kvthrottle binary: %v (run `make build` first, or use `make bench`)", err)
	}
	if o.beforeBin != "" {
		if !filepath.IsAbs(o.beforeBin) {
			o.beforeBin = filepath.Join(root, o.beforeBin)
		}
		if _, err := os.Stat(o.beforeBin); err != nil {
			return fmt.Errorf("-before-bin: %v", err)
		}
	}
	tools, err := findTools()
	if err != nil {
		return err
	}
	if o.has('5') && tools.nutcracker == "" {
		return errors.New("nutcracker (twemproxy) not found, needed for section 5 (`make deps` installs Debian's nutcracker; -sections 1234 leaves it out)")
	}
	var wantNofile uint64 // section 6 fits its connections in whatever limit there is
	if o.has('4') {
		wantNofile = uint64(o.idleConns) + 10000
	}
	nofile, err := raiseNofile(wantNofile)
	if err != nil {
		return err
	}
	logf("RLIMIT_NOFILE raised to %d (inherited by memcached and the proxy)", nofile)

	tmp, err := os.MkdirTemp("", "kvthrottle-bench-")
	if err != nil {
		return err
	}
	cl.add(func() { _ = os.RemoveAll(tmp) })

	rep := &report{opts: o, began: began, nofile: nofile, machine: describeMachine(), tools: tools,
		tls: &tlsBench{depth: o.tlsDepth, latRounds: o.tlsLatRounds}}
	rep.version = commandOutput(ctx, o.bin, "version")
	if o.beforeBin != "" {
		rep.beforeVersion = commandOutput(ctx, o.beforeBin, "version")
	}
	rep.mcVersion = commandOutput(ctx, tools.memcached, "-V")
	rep.maslapVersion = commandOutput(ctx, tools.memaslap, "-V")
	rep.goVersion = commandOutputIn(ctx, root, tools.goCmd, "version")
	if o.has('5') {
		rep.twemVersion = strings.TrimPrefix(commandOutput(ctx, tools.nutcracker, "-V"), "This is ")
	}

	// How busy is the machine before we start?
	idle := takeCPU()
	time.Sleep(time.Second)
	rep.startLoad = loadBetween(idle, takeCPU())
	logf("CPU used by other processes over the last second: %s", rep.startLoad)

	if o.has('1') || o.has('2') || o.has('4') || o.has('5') || o.has('6') {
		mc, err := startMemcached(ctx, cl, tools.memcached)
		if err != nil {
			return err
		}
		rep.mcArgs = mc.args
		if o.has('1') || o.has('2') || o.has('5') {
			// A proxy in front of memcached for sections 1, 2 and 5.
			px, err := startProxy(ctx, cl, o.bin, tmp, "throughput", mc.addr, nil)
			if err != nil {
				return err
			}
			rep.proxyConfig = px.config
			if o.has('1') || o.has('2') {
				bare, err := startBareForwarder(ctx, cl, mc.addr)
				if err != nil {
					return err
				}
				var before *proxyProc // -before-bin, beside the proxy
				if o.beforeBin != "" {
					if before, err = startProxy(ctx, cl, o.beforeBin, tmp, "before", mc.addr, nil); err != nil {
						return err
					}
				}
				if o.has('1') {
					if err := runThroughput(ctx, o, tools, mc, px, bare, before, rep); err != nil {
						return err
					}
				}
				if o.has('2') {
					if err := runLatency(ctx, o, mc, px, bare, before, rep); err != nil {
						return err
					}
				}
				if before != nil {
					if err := before.ensureAlive(); err != nil {
						return err
					}
					before.stop()
				}
				if err := bare.ensureAlive(); err != nil {
					return err
				}
				bare.stop()
			}
			if o.has('5') {
				// twemproxy in front of the same memcached, for the text
				// protocol, after the binary sections (which it would
				// otherwise share the machine with, idle).
				twem, err := startNutcracker(ctx, cl, tools.nutcracker, tmp, mc.addr)
				if err != nil {
					return err
				}
				rep.twemConfig = twem.config
				if err := runTextThroughput(ctx, o, tools, mc, px, twem, rep); err != nil {
					return err
				}
				if err := twem.ensureAlive(); err != nil {
					return err
				}
				twem.stop()
			}
			if err := px.ensureAlive(); err != nil {
				return err
			}
			px.stop()
		}
		if o.has('4') {
			// A fresh proxy, so the memory it reports is that of idle
			// connections and not of buffers grown under load.
			px, err := startProxy(ctx, cl, o.bin, tmp, "memory", mc.addr, nil)
			if err != nil {
				return err
			}
			rep.proxyConfig = px.config
			if err := runMemory(ctx, o, px, cl, rep); err != nil {
				return err
			}
			px.stop()
		}
		if o.has('6') {
			if err := runTLSSection(ctx, o, mc, tmp, cl, rep); err != nil {
				return err
			}
		}
		mc.stop()
	}

	// Section 3 last, with nothing else of ours running.
	if o.has('3') {
		if err := runGoBench(ctx, o, root, rep); err != nil {
			return err
		}
	}

	rep.took = time.Since(began)
	md := rep.markdown()
	fmt.Print(md)
	if o.out != "" {
		path := o.out
		if !filepath.IsAbs(path) {
			path = filepath.Join(root, path)
		}
		if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		logf("table also written to %s", path)
	}
	return nil
}

// commandOutput runs a short command and returns its trimmed first line, or
// "?" when it fails.
func commandOutput(ctx context.Context, name string, args ...string) string {
	return commandOutputIn(ctx, "", name, args...)
}

// commandOutputIn is commandOutput in directory dir.
func commandOutputIn(ctx context.Context, dir, name string, args ...string) string {
	out, err := shortCommandIn(ctx, dir, name, args...)
	if err != nil {
		return "?"
	}
	line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
	return strings.TrimSpace(line)
}
