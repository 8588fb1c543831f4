package textdiff

import (
	"math/rand/v2"
	"strconv"
	"strings"

	"github.com/kvthrottle/kvthrottle/proto/text"
)

// GenOptions configures Generate. The zero value of every field but Seed
// picks a default.
type GenOptions struct {
	// Seed makes the stream: the same GenOptions give the same stream.
	Seed uint64
	// Commands is the number of commands to generate (default 1000).
	Commands int
	// FlushAll allows flush_all commands (which empty the whole server;
	// through a proxy they may be refused or scoped to a tenant).
	FlushAll bool
	// HugeMax is the largest huge value, in bytes (default 1 MiB + 4 KiB,
	// so that some huge values exceed memcached's default 1 MiB item size
	// limit and some do not).
	HugeMax int
	// TooLarge is the size of the values meant to be refused as too large
	// (default 1 MiB + 16 KiB; up to 1000 bytes are added at random).
	// Memcached swallows their data.
	TooLarge int
	// NoHuge leaves out huge and too-large values (for quick runs).
	NoHuge bool
	// KeyMax, when set, is the longest key the server under test takes
	// (a proxy that namespaces keys takes fewer than memcached's 250): the
	// pool's longest key is cut to it. Keys meant to be refused stay over
	// 250 bytes.
	KeyMax int
	// NoMeta leaves out well-formed meta commands other than mn (for a
	// server that speaks only the classic text commands; malformed meta
	// lines, which are refused before they run, stay).
	NoMeta bool
	// Failures adds failure batches (Batch.Fails; see the package doc),
	// about one batch in FailEvery (default 25). Run needs
	// Options.FailAddrs for them. With NoHuge they hold no storage
	// commands, whose memcached equivalent is a value over its limit.
	Failures  bool
	FailEvery int
}

// ttls are the exptimes the generator uses: never, already expired
// (negative, or an absolute time in the past), or relative times of whole
// thousands of seconds, so that nothing expires during a run and a
// reported remaining TTL, rounded to thousands, does not depend on when
// it is asked (see Options.KeepTTL).
var ttls = []string{"0", "0", "0", "-1", "1000", "2000", "5000", "9000", "2592000", "1000000000"}

// plainKeys are ordinary keys of various shapes; numKeys hold counters;
// bigKeys hold huge values. A small pool makes commands interact.
var (
	plainKeys = []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "a:b/c", "x.y-z_1",
		"\u00fc\u00f1\u00ee", strings.Repeat("L", 250)}
	numKeys = []string{"n0", "n1", "n2"}
	bigKeys = []string{"big0", "big1"}
)

// gen holds the generator's state.
type gen struct {
	r     *rand.Rand
	o     GenOptions
	s     *Stream
	n     int  // commands generated
	fresh bool // the next command is the first on a new connection
}

// Generate returns the stream that o describes. It is deterministic: a
// given GenOptions always yields the same stream. Every command in it is
// one whose reply from memcached 1.6 does not depend on the wall clock or
// on the server's identity (given a fresh server and Options' TTL
// rounding); commands that make memcached close the connection end their
// batch, and the next batch opens a new connection.
func Generate(o GenOptions) *Stream {
	if o.Commands <= 0 {
		o.Commands = 1000
	}
	if o.HugeMax <= 0 {
		o.HugeMax = 1<<20 + 4<<10
	}
	if o.TooLarge <= 0 {
		o.TooLarge = 1<<20 + 16<<10
	}
	if o.FailEvery <= 0 {
		o.FailEvery = 25
	}
	g := &gen{r: rand.New(rand.NewPCG(o.Seed, 0x7465787464696666)), o: o, s: &Stream{Seed: o.Seed}}
	prev := map[string]bool{} // keys the previous batch names
	for g.n < o.Commands {
		if o.Failures && len(g.s.Batches) > 0 && g.chance(o.FailEvery) {
			// On keys of its own: prev and the counters are untouched.
			b := g.failureBatch()
			g.s.Batches = append(g.s.Batches, b)
			g.n += len(b.Cmds)
			continue
		}
		b := Batch{NewConn: len(g.s.Batches) == 0 || g.s.Batches[len(g.s.Batches)-1].Closes() || g.r.IntN(50) == 0}
		if b.NewConn {
			g.fresh = true
		}
		// A batch on a new connection may run on another memcached
		// thread while the previous connection's thread has sent its last
		// replies but not yet released the items they hold.
		reads := map[string]bool{}
		if b.NewConn {
			reads = prev
		}
		size := 1
		switch p := g.r.IntN(10); {
		case p < 4:
		case p < 8:
			size = 2 + g.r.IntN(10)
		default:
			size = 10 + g.r.IntN(90)
		}
		for len(b.Cmds) < size && g.n < o.Commands {
			if g.r.IntN(400) == 0 {
				// An over-long line. Unless it is a get or gets,
				// memcached closes the connection without a reply, with
				// a reset that may lose replies still in flight, so it
				// starts a batch of its own.
				if len(b.Cmds) > 0 {
					break
				}
				c := g.longLine()
				for _, k := range c.reads {
					reads[k] = true
				}
				b.Cmds = append(b.Cmds, c)
				g.n++
				if c.Closes {
					break
				}
				continue
			}
			cmds := g.next()
			if conflict(cmds, reads) {
				if len(b.Cmds) > 0 {
					break
				}
				continue
			}
			for _, c := range cmds {
				for _, k := range c.reads {
					reads[k] = true
				}
			}
			b.Cmds = append(b.Cmds, cmds...)
			g.n += len(cmds)
			g.fresh = false
			if b.Closes() {
				break
			}
		}
		g.s.Batches = append(g.s.Batches, b)
		prev = map[string]bool{}
		for _, c := range b.Cmds {
			for _, k := range c.reads {
				prev[k] = true
			}
		}
	}
	return g.s
}

// conflict reports whether one of cmds increments or decrements a key
// that reads, or a command before it in cmds, names. Memcached rewrites a
// counter in place only when nobody else holds a reference to the item,
// and a reply not yet sent, to a command earlier in the same pipelined
// batch, may: whether it is still unsent depends on timing, and so do the
// counter's length (in place it is padded with spaces) and later replies.
// The generator keeps such pairs in separate batches.
func conflict(cmds []Command, reads map[string]bool) bool {
	local := map[string]bool{}
	for _, c := range cmds {
		if c.delta != "" && (reads[c.delta] || local[c.delta]) {
			return true
		}
		for _, k := range c.reads {
			local[k] = true
		}
	}
	return false
}

// pick returns a random element of xs.
func pick[T any](r *rand.Rand, xs []T) T { return xs[r.IntN(len(xs))] }

func (g *gen) chance(n int) bool { return g.r.IntN(n) == 0 }

// key returns a key for reads and most writes.
func (g *gen) key() string {
	switch p := g.r.IntN(100); {
	case p < 2:
		return pick(g.r, bigKeys)
	case p < 14:
		return pick(g.r, numKeys)
	case p < 16:
		return "miss" + strconv.Itoa(g.r.IntN(1000))
	default:
		k := pick(g.r, plainKeys)
		if g.o.KeyMax > 0 && len(k) > g.o.KeyMax {
			k = k[:g.o.KeyMax]
		}
		return k
	}
}

// badKey returns a key longer than memcached's 250 bytes.
func (g *gen) badKey() string { return strings.Repeat("K", 251+g.r.IntN(100)) }

func (g *gen) ttl() string { return pick(g.r, ttls) }

func (g *gen) flags() string {
	switch p := g.r.IntN(20); {
	case p < 12:
		return "0"
	case p < 18:
		return strconv.Itoa(g.r.IntN(70000))
	case p < 19:
		return "4294967295"
	default:
		return "4294967296" // memcached 1.6 accepts and truncates it
	}
}

// eol is the command line terminator: memcached also accepts a bare LF.
func (g *gen) eol() string {
	if g.chance(10) {
		return "\n"
	}
	return "\r\n"
}

// quiet returns " noreply" now and then for the command verb, whose row in
// proto/text's command table says it reads noreply (it panics for one
// that does not), and counts no reply for c then: memcached sends nothing.
func (g *gen) quiet(verb string, c *Command) string {
	if v, ok := text.Lookup(verb); !ok || v.Quiet != text.QuietNoreply {
		panic("textdiff: " + verb + " reads no noreply")
	}
	if !g.chance(6) {
		return ""
	}
	c.Replies = 0
	return " noreply"
}

// next returns the next command, or a few when it makes a quiet run.
func (g *gen) next() []Command {
	p := g.r.IntN(1000)
	if g.o.NoMeta && p >= 510 && p < 800 {
		p = g.r.IntN(510)
	}
	switch {
	case p < 150:
		return []Command{g.get()}
	case p < 330:
		return []Command{g.store()}
	case p < 370:
		return []Command{g.cas()}
	case p < 430:
		return []Command{g.incr()}
	case p < 470:
		return []Command{g.del()}
	case p < 500:
		return []Command{g.touch()}
	case p < 510:
		return []Command{g.misc()}
	case p < 620:
		return []Command{g.mg()}
	case p < 720:
		return []Command{g.ms()}
	case p < 750:
		return []Command{g.md()}
	case p < 800:
		return []Command{g.ma()}
	case p < 815:
		return []Command{{Text: []byte("mn" + g.eol()), Replies: 1, Kind: "mn"}}
	case p < 860:
		return g.quietRun()
	case p < 863:
		return []Command{{Text: []byte("quit" + g.eol()), Closes: true, Replies: 0, Kind: "quit"}}
	case p < 866 && !g.o.NoHuge:
		return g.tooLarge()
	default:
		return []Command{g.bad()}
	}
}
