package textdiff

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
)

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
