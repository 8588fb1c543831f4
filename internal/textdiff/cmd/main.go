// Command textdiff sends one generated stream of memcached text and meta
// commands to two servers and reports the first difference between their
// replies:
//
//	go run ./internal/textdiff/cmd -a 127.0.0.1:11211 -b 127.0.0.1:11311 -seed 1 -n 20000
//
// Both servers must start empty, and memcached ones with the options in
// textdiff.MemcachedFlags (-o no_lru_maintainer). It exits 0 when every
// reply matched, 1 on a difference, 2 on any other failure.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
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
	timeout := flag.Duration("timeout", 10*time.Second, "deadline for each batch's replies")
	flag.Parse()
	if *b == "" {
		fmt.Fprintln(os.Stderr, "textdiff: -b is required")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	s := textdiff.Generate(textdiff.GenOptions{Seed: *seed, Commands: *n, FlushAll: *flush, NoHuge: *noHuge, NoMeta: *noMeta, KeyMax: *keyMax})
	start := time.Now()
	rep, err := textdiff.Run(ctx, *a, *b, s, textdiff.Options{Timeout: *timeout, KeepTTL: *keepTTL})
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
