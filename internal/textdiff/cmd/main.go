// Command textdiff sends one generated stream of memcached text and meta
// commands to two servers and reports the first difference between their
// replies:
//
//	go run ./internal/textdiff/cmd -a 127.0.0.1:11211 -b 127.0.0.1:11311 -seed 1 -n 20000
//
// Both servers must start empty, and memcached ones with the options in
// textdiff.MemcachedFlags (-o no_lru_maintainer). With -fail, the stream
// also holds failure batches, which the second server gets at those
// addresses (where it fails them) and the first, memcached, made to fail
// as it fails commands. It exits 0 when every reply matched, 1 on a
// difference, 2 on any other failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/textdiff"
)

func main() {
	a := flag.String("a", "127.0.0.1:11211", "first server, host:port")
	b := flag.String("b", "", "second server, host:port")
	seed := flag.Uint64("seed", 1, "stream seed")
	n := flag.Int("n", 10000, "number of commands")
	flush := flag.Bool("flush", false, "include flush_all commands")
	noHuge := flag.Bool("nohuge", false, "leave out huge and too-large values")
	keyMax := flag.Int("keymax", 0, "the longest key the servers take (0: 250)")
	noMeta := flag.Bool("nometa", false, "leave out well-formed meta commands other than mn")
	keepTTL := flag.Bool("keepttl", false, "compare meta t tokens exactly instead of rounded to thousands")
	casID := flag.Bool("casid", false, "compare CAS values by identity (for a proxy that carries out flush_all itself; see Options.CASByIdentity)")
	timeout := flag.Duration("timeout", 10*time.Second, "deadline for each batch's replies")
	show := flag.String("show", "", "print commands FROM-TO of the stream (quoted, long ones cut) instead of running it")
	fail := flag.String("fail", "", "comma-separated addresses where the second server fails every command that needs its backend: adds failure batches (see the textdiff package doc)")
	flag.Parse()
	var failAddrs []string
	if *fail != "" {
		failAddrs = strings.Split(*fail, ",")
	}
	gen := textdiff.GenOptions{Seed: *seed, Commands: *n, FlushAll: *flush, NoHuge: *noHuge, NoMeta: *noMeta, KeyMax: *keyMax, Failures: len(failAddrs) > 0}
	if *show != "" {
		s := textdiff.Generate(gen)
		if err := printCommands(os.Stdout, s, *show); err != nil {
			fmt.Fprintln(os.Stderr, "textdiff:", err)
			os.Exit(2)
		}
		return
	}
	if *b == "" {
		fmt.Fprintln(os.Stderr, "textdiff: -b is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	s := textdiff.Generate(gen)
	start := time.Now()
	rep, err := textdiff.Run(ctx, *a, *b, s, textdiff.Options{Timeout: *timeout, KeepTTL: *keepTTL, CASByIdentity: *casID, FailAddrs: failAddrs})
	fmt.Printf("%d commands in %d batches on %d connections, %d bytes sent, %d/%d reply bytes, %v\n",
		rep.Commands, rep.Batches, rep.Conns, rep.BytesSent, rep.RepliesA, rep.RepliesB, time.Since(start).Round(time.Millisecond))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	if rep.Diff != nil {
		fmt.Println(rep.Diff)
		os.Exit(1)
	}
	fmt.Println("no difference")
}

// printCommands prints the commands of s numbered from-to ("FROM-TO"),
// each with its batch, kind and text, long texts and data cut.
func printCommands(w io.Writer, s *textdiff.Stream, fromTo string) error {
	var from, to int
	if _, err := fmt.Sscanf(fromTo, "%d-%d", &from, &to); err != nil {
		return fmt.Errorf("-show %q: want FROM-TO: %w", fromTo, err)
	}
	cut := func(b []byte) string {
		if len(b) > 200 {
			return fmt.Sprintf("%q...(%d bytes)", b[:200], len(b))
		}
		return fmt.Sprintf("%q", b)
	}
	i := 0
	for bi, b := range s.Batches {
		for _, c := range b.Cmds {
			if i >= from && i <= to {
				fmt.Fprintf(w, "%d batch %d new-conn %v [%s] %s", i, bi, b.NewConn, c.Kind, cut(c.Text))
				if c.Data != nil {
					fmt.Fprintf(w, " data %s", cut(c.Data))
				}
				if c.Alt != nil {
					fmt.Fprintf(w, " first server: %s", cut(c.Alt))
				}
				if c.CASKey != "" {
					fmt.Fprintf(w, " cas-of %s%+d", c.CASKey, c.CASDelta)
				}
				fmt.Fprintln(w)
			}
			i++
		}
	}
	return nil
}
