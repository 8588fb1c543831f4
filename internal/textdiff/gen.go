package textdiff

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
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

// value returns data for key: counters for numeric keys, huge values for
// big keys now and then, small values (binary ones sometimes) otherwise.
func (g *gen) value(key string) []byte {
	for _, k := range numKeys {
		if k == key && !g.chance(8) {
			// No counter reaches 2^63: memcached 1.6's safe_strtoull
			// looks for a '-' in such a number with strchr, which reads
			// on past the value into whatever bytes follow it in slab
			// memory, so whether incr calls the value numeric is chance.
			return []byte(pick(g.r, []string{"0", "1", "42", "99", "100", "4611686018427387904",
				"4611686018427387903", "007", "12a", strconv.Itoa(g.r.IntN(1 << 30))}))
		}
	}
	if !g.o.NoHuge {
		for _, k := range bigKeys {
			if k == key && g.chance(6) {
				return g.shared(100<<10+g.r.IntN(g.o.HugeMax-100<<10+1), true)
			}
		}
	}
	n := g.r.IntN(64)
	if g.chance(20) {
		n = 64 + g.r.IntN(4096)
	}
	return g.shared(n, g.chance(5))
}

// affix returns the data to append or prepend to key: for a counter,
// letters (after a space, now and then), so that no concatenation makes a
// number of 2^63 or more (see value).
func (g *gen) affix(key string, data []byte) []byte {
	for _, k := range numKeys {
		if k == key {
			b := g.bytes(1+g.r.IntN(8), false)
			if g.chance(3) {
				b[0] = ' '
			}
			return b
		}
	}
	return data
}

// pools of random letters and random bytes that values are cut from
// (cheaper than drawing every byte), made once from a fixed seed.
var (
	poolOnce            sync.Once
	letterPool, binPool []byte
)

const poolSize = 2 << 20

func pools() ([]byte, []byte) {
	poolOnce.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		letterPool, binPool = make([]byte, poolSize), make([]byte, poolSize)
		for i := range letterPool {
			letterPool[i] = 'a' + byte(r.IntN(26))
		}
		for i := 0; i < poolSize; i += 8 {
			binary.LittleEndian.PutUint64(binPool[i:], r.Uint64())
		}
	})
	return letterPool, binPool
}

// bytes returns n new bytes: any byte values if bin, letters otherwise.
func (g *gen) bytes(n int, bin bool) []byte {
	pool, bp := pools()
	if bin {
		pool = bp
	}
	b := make([]byte, n)
	off := g.r.IntN(len(pool))
	for i := 0; i < n; {
		k := copy(b[i:], pool[off:])
		i += k
		off = 0
	}
	return b
}

// shared is bytes, but its result may be a piece of a pool, which nobody
// may modify.
func (g *gen) shared(n int, bin bool) []byte {
	pool, bp := pools()
	if bin {
		pool = bp
	}
	if n > len(pool) {
		return g.bytes(n, bin)
	}
	off := g.r.IntN(len(pool) - n + 1)
	return pool[off : off+n : off+n]
}

// safeData returns n (at least 1) bytes that memcached, should it read
// them as a command line rather than data, answers with a single ERROR.
func (g *gen) safeData(n int) []byte {
	if n < 1 {
		n = 1
	}
	b := g.bytes(n, false)
	b[0] = 'z'
	return b
}

// eol is the command line terminator: memcached also accepts a bare LF.
func (g *gen) eol() string {
	if g.chance(10) {
		return "\n"
	}
	return "\r\n"
}

func (g *gen) noreply() bool { return g.chance(6) }

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
	case p < 864 && !g.o.NoHuge:
		return []Command{g.tooLarge()}
	default:
		return []Command{g.bad()}
	}
}

func (g *gen) get() Command {
	verb := pick(g.r, []string{"get", "get", "gets", "gat", "gats"})
	line := verb
	if verb == "gat" || verb == "gats" {
		line += " " + g.ttl()
	}
	n := 1 + g.r.IntN(4)
	if g.chance(10) {
		n = 5 + g.r.IntN(20)
	}
	c := Command{Replies: 1, Kind: verb}
	for range n {
		k := g.key()
		if verb[1] == 'a' && len(line)+1+len(k) > maxLine {
			break // only get and gets lines may be longer (see longLine)
		}
		line += " " + k
		c.reads = append(c.reads, k)
	}
	c.Text = []byte(line + g.eol())
	return c
}

// storeText returns a storage command's Text (line and eol) and Data.
func storeText(line string, eol string, data []byte) ([]byte, []byte) {
	return []byte(line + eol), data
}

func (g *gen) store() Command {
	verb := pick(g.r, []string{"set", "set", "set", "add", "replace", "append", "prepend"})
	key := g.key()
	data := g.value(key)
	if verb == "append" || verb == "prepend" {
		data = g.affix(key, data)
	}
	line := fmt.Sprintf("%s %s %s %s %d", verb, key, g.flags(), g.ttl(), len(data))
	c := Command{Replies: 1, Kind: verb, reads: []string{key}}
	if g.noreply() {
		line += " noreply"
		c.Replies = 0
	}
	c.Text, c.Data = storeText(line, g.eol(), data)
	return c
}

// casRef fills in c's CAS reference to key.
func (g *gen) casRef(c *Command, key string) {
	c.CASKey = key
	switch p := g.r.IntN(10); {
	case p < 6:
	case p < 8:
		c.CASDelta = -1
	default:
		c.CASDelta = 1 + g.r.Int64N(1000)
	}
}

func (g *gen) cas() Command {
	key := g.key()
	data := g.value(key)
	line := fmt.Sprintf("cas %s %s %s %d %s", key, g.flags(), g.ttl(), len(data), CASPlaceholder)
	c := Command{Replies: 1, Kind: "cas", reads: []string{key}}
	if g.noreply() {
		line += " noreply"
		c.Replies = 0
	}
	g.casRef(&c, key)
	c.Text, c.Data = storeText(line, g.eol(), data)
	return c
}

func (g *gen) incr() Command {
	verb := pick(g.r, []string{"incr", "decr"})
	key := pick(g.r, numKeys)
	if g.chance(5) {
		key = g.key()
	}
	deltas := []string{"1", "1", "5", "100", "0", strconv.Itoa(g.r.IntN(1 << 20))}
	if verb == "decr" {
		// An incr by it would wrap 0 to 2^64-1 (see value).
		deltas = append(deltas, "18446744073709551615")
	}
	delta := pick(g.r, deltas)
	line := verb + " " + key + " " + delta
	c := Command{Replies: 1, Kind: verb, delta: key, reads: []string{key}}
	if g.noreply() {
		line += " noreply"
		c.Replies = 0
	}
	c.Text = []byte(line + g.eol())
	return c
}

func (g *gen) del() Command {
	key := g.key()
	line := "delete " + key
	if g.chance(10) {
		line += " 0"
	}
	c := Command{Replies: 1, Kind: "delete", reads: []string{key}}
	if g.noreply() {
		line += " noreply"
		c.Replies = 0
	}
	c.Text = []byte(line + g.eol())
	return c
}

func (g *gen) touch() Command {
	key := g.key()
	line := "touch " + key + " " + g.ttl()
	c := Command{Replies: 1, Kind: "touch", reads: []string{key}}
	if g.noreply() {
		line += " noreply"
		c.Replies = 0
	}
	c.Text = []byte(line + g.eol())
	return c
}

// misc returns version, verbosity or (when allowed) flush_all.
func (g *gen) misc() Command {
	switch p := g.r.IntN(10); {
	case p < 4:
		return Command{Text: []byte("version" + g.eol()), Replies: 1, Kind: "version"}
	case p < 7 || !g.o.FlushAll:
		if g.chance(3) {
			return Command{Text: []byte("verbosity 0 noreply" + g.eol()), Replies: 0, Kind: "verbosity"}
		}
		return Command{Text: []byte("verbosity 0" + g.eol()), Replies: 1, Kind: "verbosity"}
	default:
		// A delayed flush due during the run would depend on the clock;
		// one a day away never is (a later flush_all replaces it).
		switch g.r.IntN(5) {
		case 0:
			return Command{Text: []byte("flush_all" + g.eol()), Replies: 1, Kind: "flush_all"}
		case 1:
			return Command{Text: []byte("flush_all 0" + g.eol()), Replies: 1, Kind: "flush_all"}
		case 2:
			return Command{Text: []byte("flush_all 86400" + g.eol()), Replies: 1, Kind: "flush_all"}
		case 3:
			return Command{Text: []byte("flush_all 86400 noreply" + g.eol()), Replies: 0, Kind: "flush_all"}
		default:
			return Command{Text: []byte("flush_all noreply" + g.eol()), Replies: 0, Kind: "flush_all"}
		}
	}
}

// metaKey returns key as written on a meta command line, base64-encoded
// (with the b flag added to flags) now and then.
func (g *gen) metaKey(key string, flags *[]string) string {
	if g.chance(6) {
		*flags = append(*flags, "b")
		return base64.StdEncoding.EncodeToString([]byte(key))
	}
	return key
}

// some returns a random subset of opts, in random order.
func (g *gen) some(opts []string, p int) []string {
	var out []string
	for _, o := range opts {
		if g.r.IntN(100) < p {
			out = append(out, o)
		}
	}
	g.r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func (g *gen) opaque() string { return "O" + strconv.Itoa(g.r.IntN(100000)) }

// metaLine joins a meta command's words.
func metaLine(verb, key string, args []string, flags []string) string {
	w := append([]string{verb, key}, args...)
	return strings.Join(append(w, flags...), " ")
}

func (g *gen) mg() Command {
	key := g.key()
	// h and l report access history and time; they are left out.
	flags := g.some([]string{"v", "k", "c", "f", "s", "t", "q", "u"}, 30)
	if g.chance(3) {
		flags = append(flags, g.opaque())
	}
	if g.chance(8) {
		flags = append(flags, "N"+pick(g.r, ttls[4:9]))
	}
	if g.chance(10) {
		flags = append(flags, "T"+g.ttl())
	}
	c := Command{Replies: 1, Kind: "mg", reads: []string{key}}
	for _, f := range flags {
		if f == "q" {
			c.Replies = -1
		}
	}
	k := g.metaKey(key, &flags)
	c.Text = []byte(metaLine("mg", k, nil, flags) + g.eol())
	return c
}

func (g *gen) ms() Command {
	key := g.key()
	data := g.value(key)
	flags := g.some([]string{"q", "k", "c", "I"}, 20)
	if g.chance(3) {
		flags = append(flags, "T"+g.ttl())
	}
	if g.chance(3) {
		flags = append(flags, "F"+g.flags())
	}
	if g.chance(4) {
		flags = append(flags, g.opaque())
	}
	if g.chance(4) {
		mode := pick(g.r, []string{"E", "A", "P", "R", "S", "a", "p"})
		if mode == "A" || mode == "P" || mode == "a" || mode == "p" {
			data = g.affix(key, data)
		}
		flags = append(flags, "M"+mode)
		if g.chance(3) {
			flags = append(flags, "N"+pick(g.r, ttls[4:9]))
		}
	}
	c := Command{Replies: 1, Kind: "ms", reads: []string{key}}
	k := g.metaTail(&c, key, &flags, 6)
	c.Text, c.Data = storeText(metaLine("ms", k, []string{strconv.Itoa(len(data))}, flags), g.eol(), data)
	return c
}

// metaTail finishes a meta command's flags: with a chance of 1 in
// casChance a C flag with the CAS placeholder (and the CAS reference), and
// no reply counted when q is among them. It returns the key as written on
// the line (metaKey, which may add b).
func (g *gen) metaTail(c *Command, key string, flags *[]string, casChance int) string {
	if g.chance(casChance) {
		*flags = append(*flags, "C"+CASPlaceholder)
		g.casRef(c, key)
	}
	for _, f := range *flags {
		if f == "q" {
			c.Replies = -1
		}
	}
	return g.metaKey(key, flags)
}

func (g *gen) md() Command {
	key := g.key()
	flags := g.some([]string{"q", "k", "I"}, 20)
	if g.chance(4) {
		flags = append(flags, g.opaque())
	}
	if g.chance(5) {
		flags = append(flags, "T"+pick(g.r, ttls[4:9]))
	}
	c := Command{Replies: 1, Kind: "md", reads: []string{key}}
	k := g.metaTail(&c, key, &flags, 6)
	c.Text = []byte(metaLine("md", k, nil, flags) + g.eol())
	return c
}

func (g *gen) ma() Command {
	key := pick(g.r, numKeys)
	if g.chance(5) {
		key = g.key()
	}
	flags := g.some([]string{"q", "k", "v", "t", "c"}, 30)
	if g.chance(3) {
		flags = append(flags, "N"+pick(g.r, ttls[4:9]))
	}
	if g.chance(3) {
		flags = append(flags, "J"+strconv.Itoa(g.r.IntN(1000)))
	}
	mode := ""
	if g.chance(3) {
		mode = pick(g.r, []string{"I", "+", "D", "-", "i", "d"})
		flags = append(flags, "M"+mode)
	}
	if g.chance(2) {
		deltas := []string{"1", "7", "1000"}
		if mode == "D" || mode == "-" || mode == "d" {
			deltas = append(deltas, "18446744073709551615") // see value
		}
		flags = append(flags, "D"+pick(g.r, deltas))
	}
	if g.chance(4) {
		flags = append(flags, g.opaque())
	}
	c := Command{Replies: 1, Kind: "ma", delta: key, reads: []string{key}}
	k := g.metaTail(&c, key, &flags, 8)
	c.Text = []byte(metaLine("ma", k, nil, flags) + g.eol())
	return c
}

// quietRun returns quiet meta commands and noreply text commands ended by
// mn, as clients pipeline them.
func (g *gen) quietRun() []Command {
	n := 1 + g.r.IntN(8)
	var out []Command
	for range n {
		var c Command
		pick := g.r.IntN(6)
		if g.o.NoMeta {
			pick %= 2
		}
		switch pick {
		case 0:
			key := g.key()
			data := g.value(key)
			c = Command{Kind: "set", reads: []string{key}}
			c.Text, c.Data = storeText(fmt.Sprintf("set %s %s %s %d noreply", key, g.flags(), g.ttl(), len(data)), "\r\n", data)
		case 1:
			key := g.key()
			c = Command{Text: []byte("delete " + key + " noreply\r\n"), Kind: "delete", reads: []string{key}}
		default:
			for {
				switch g.r.IntN(4) {
				case 0:
					c = g.mg()
				case 1:
					c = g.ms()
				case 2:
					c = g.md()
				default:
					c = g.ma()
				}
				if c.Replies == -1 {
					break
				}
			}
		}
		c.Replies = -1
		out = append(out, c)
	}
	return append(out, Command{Text: []byte("mn\r\n"), Replies: 1, Kind: "mn"})
}

// tooLarge returns a storage command whose value is over memcached's item
// size limit: memcached answers SERVER_ERROR and swallows the data.
func (g *gen) tooLarge() Command {
	key := g.key()
	data := g.shared(g.o.TooLarge+g.r.IntN(1000), true)
	c := Command{Replies: 1, Kind: "set too large"}
	if g.chance(2) {
		c.Kind = "ms too large"
		c.Text, c.Data = storeText(fmt.Sprintf("ms %s %d T0", key, len(data)), "\r\n", data)
		return c
	}
	c.Text, c.Data = storeText(fmt.Sprintf("set %s 0 0 %d", key, len(data)), "\r\n", data)
	return c
}

// maxLine is the longest command line, its terminator left out, that
// memcached reliably accepts, bar get and gets. When it has read more
// than 2048 bytes of a line without finding its end, memcached closes the
// connection unless the line is a get or gets; whether a longer line
// arrives in one read or in pieces depends on timing.
const maxLine = 2000

// longLine returns a line over memcached's 16 KiB read buffer, which it
// answers by closing the connection, unreplied, unless the line is a get
// or gets (those it reads in pieces and answers). Since no such line fits
// in one read, the close is certain.
func (g *gen) longLine() Command {
	n := 17000 + g.r.IntN(10000)
	switch g.r.IntN(3) {
	case 0:
		return Command{Text: []byte(strings.Repeat("x", n) + "\r\n"), Closes: true, Kind: "line too long"}
	case 1:
		return Command{Text: []byte("mg " + strings.Repeat("x", n) + " v\r\n"), Closes: true, Kind: "line too long"}
	}
	verb := pick(g.r, []string{"get", "gets"})
	c := Command{Replies: 1, Kind: "long " + verb}
	line := append(make([]byte, 0, n+32), verb...)
	for len(line) < n {
		k := "miss" + strconv.Itoa(g.r.IntN(1000))
		if g.chance(200) {
			k = pick(g.r, plainKeys[:8])
			c.reads = append(c.reads, k)
		}
		line = append(append(line, ' '), k...)
	}
	c.Text = append(line, "\r\n"...)
	return c
}

// bad returns one of the malformed commands memcached answers with an
// error and carries on after.
func (g *gen) bad() Command {
	key := g.key()
	c := Command{Replies: -1, Kind: "bad", reads: []string{key}}
	var s string
	switch g.r.IntN(34) {
	case 0:
		s = pick(g.r, []string{"foo bar", "GET k0", "", "gets", "get", "bogus", "statsx", "  get k0", "set", "incr", "mn2", "mgk0"}) + g.eol()
	case 1:
		// A retrieval with a key over 250 bytes also drops the replies
		// of the simple commands just before it that memcached has not
		// sent yet (see the package doc); the mn fences them off.
		s = "mn\r\nget k0 " + g.badKey() + " k1\r\n"
	case 2:
		s = "mg " + g.badKey() + " v\r\n"
	case 3:
		s = "mg " + key + " zz\r\n"
	case 4:
		s = "mg " + key + " v " + "O" + strings.Repeat("9", 40) + "\r\n"
	case 5:
		s = "mg !!!! b v\r\n"
	case 6:
		s = "ms " + key + "\r\n"
	case 7:
		s = "ms " + key + " 3 MZ\r\nzab\r\n"
	case 8:
		s = "ms " + key + " abc\r\nzab\r\n"
	case 9:
		s = "ms " + g.badKey() + " 3\r\nzab\r\n"
	case 10:
		s = "ms !!!! 3 b\r\nzab\r\n"
	case 11:
		s = "ma " + key + " Mx\r\n"
	case 12:
		s = "ma " + key + " Dabc\r\n"
	case 13:
		s = "ma " + key + " D-1\r\n"
	case 14:
		s = "set " + key + " abc 0 3\r\nzab\r\n"
	case 15:
		s = "set " + key + " 0 abc 3\r\nzab\r\n"
	case 16:
		s = "set " + key + " 0 0 -1\r\nzab\r\n"
	case 17:
		s = "set " + key + " 0 0 abc\r\nzab\r\n"
	case 18:
		s = "set " + key + " 0 0 4294967296\r\nz\r\n"
	case 19:
		s = "set " + g.badKey() + " 0 0 3\r\nzab\r\n"
	case 20:
		s = "set " + key + " 0 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23\r\nz\r\n"
	case 21:
		s = "set " + key + " 0 0\r\n"
	case 22:
		s = "cas " + key + " 0 0 1\r\nz\r\n"
	case 23:
		s = "cas " + key + " 0 0 1 abc\r\nz\r\n"
	case 24:
		s = "incr " + key + " " + pick(g.r, []string{"-1", "abc", "18446744073709551616", ""}) + "\r\n"
	case 25:
		s = "touch " + key + " abc\r\n"
	case 26:
		s = "gat abc " + key + "\r\n"
	case 27:
		s = "delete " + key + " 5\r\n"
	case 28:
		s = "get k0\x00k1\r\n"
	case 29:
		if g.fresh {
			s = "version\r\n" // 0x80 first on a connection means binary
		} else {
			s = "\x80abc\r\n"
		}
	case 30:
		// Bad data chunk: more data than announced, the surplus read as
		// a (bad) command line.
		n := g.r.IntN(100)
		verb := pick(g.r, []string{"set", "add", "append", "ms"})
		var line string
		if verb == "ms" {
			line = fmt.Sprintf("ms %s %d", key, n)
		} else {
			line = fmt.Sprintf("%s %s 0 0 %d", verb, key, n)
		}
		if g.chance(3) {
			if verb == "ms" {
				line += " q"
			} else {
				line += " noreply"
			}
		}
		s = line + "\r\n" + string(g.safeData(n+2+g.r.IntN(20))) + "\r\n"
	case 31:
		// Bad data chunk: the terminator replaced.
		n := 1 + g.r.IntN(50)
		s = fmt.Sprintf("set %s 0 0 %d\r\n%szz\r\n", key, n, g.safeData(n))
	case 32:
		// A long but acceptable line of junk.
		s = "z" + strings.Repeat("y", 1000+g.r.IntN(maxLine-1000)) + "\r\n"
	default:
		if g.o.FlushAll {
			s = "flush_all abc\r\n"
		} else {
			s = "verbosity\r\n"
		}
	}
	c.Text = []byte(s)
	return c
}
