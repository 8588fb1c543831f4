package textdiff

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/testmc"
)

// TestFailureAltsAreRefused: memcached answers every failure batch's Alt
// commands as the generator says a failure is framed: a retrieval's mn,
// then one error line alone; one error line for every other command, or
// nothing with noreply (quiet meta commands get theirs); so a server under
// test that fails the batch's commands must answer just that.
func TestFailureAltsAreRefused(t *testing.T) {
	m := testmc.Start(t, MemcachedFlags...)
	s := Generate(GenOptions{Seed: 9, Commands: 2000, Failures: true, FailEvery: 3})
	sd := newSide(m.Addr)
	if err := sd.dial(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	defer sd.conn.Close()
	kinds := map[string]int{}
	for bi := range s.Batches {
		b := &s.Batches[bi]
		if !b.Fails {
			continue
		}
		var want strings.Builder
		for _, c := range b.Cmds {
			kinds[c.Kind]++
			if c.Alt == nil || !strings.HasPrefix(c.Kind, "failing ") {
				t.Fatalf("batch %d: command %q of a failure batch has no Alt", bi, c.Text)
			}
			if c.isMN() {
				want.WriteString("MN\r\n")
			}
			if c.Replies > 0 {
				want.WriteString(failureLine)
			}
		}
		want.WriteString("MN\r\n") // the fence
		o := sd.exec(b, true, time.Now().Add(10*time.Second), &Options{})
		if got := string(o.reply); got != want.String() || o.end != "fenced" {
			t.Fatalf("batch %d (%s): memcached answered %q (%s), want %q", bi, clip(b.Cmds[0].Alt, 200), got, o.end, want.String())
		}
	}
	for _, k := range []string{"get", "gets", "gat", "gats", "incr", "decr", "delete", "touch", "mg", "md", "ma", "ms",
		"set", "add", "replace", "append", "prepend", "cas"} {
		if kinds["failing "+k] == 0 {
			t.Errorf("no failing %s generated: %v", k, kinds)
		}
	}
}

// TestRunNeedsFailAddrs: a stream with failure batches and no address
// where the second server fails them is an error, not a difference.
func TestRunNeedsFailAddrs(t *testing.T) {
	m := testmc.Start(t, MemcachedFlags...)
	s := Generate(GenOptions{Seed: 1, Commands: 200, Failures: true, FailEvery: 2, NoHuge: true})
	rep, err := Run(context.Background(), m.Addr, m.Addr, s, Options{Timeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "FailAddrs") || rep.Diff != nil {
		t.Fatalf("Run without FailAddrs: %v, diff %v", err, rep.Diff)
	}
}
