package textdiff

import (
	"fmt"
	"strconv"
)

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
	line += g.quiet(verb, &c)
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
	line += g.quiet("cas", &c)
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
	line += g.quiet(verb, &c)
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
	line += g.quiet("delete", &c)
	c.Text = []byte(line + g.eol())
	return c
}

func (g *gen) touch() Command {
	key := g.key()
	line := "touch " + key + " " + g.ttl()
	c := Command{Replies: 1, Kind: "touch", reads: []string{key}}
	line += g.quiet("touch", &c)
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
