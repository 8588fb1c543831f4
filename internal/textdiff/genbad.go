package textdiff

import (
	"fmt"
	"strconv"
	"strings"
)

// tooLarge returns a storage command whose value is over memcached's item
// size limit, and a get of its key: memcached answers SERVER_ERROR (nothing
// with noreply; ms in every mode and with q), swallows the data, and
// unlinks the key of a set and of every ms but keeps it for add, replace,
// append, prepend and cas, which the get shows.
func (g *gen) tooLarge() []Command {
	key := g.key()
	data := g.shared(g.o.TooLarge+g.r.IntN(1000), true)
	c := Command{Replies: 1, reads: []string{key}}
	if !g.o.NoMeta && g.chance(2) {
		c.Kind = "ms too large"
		flags := g.some([]string{"q", "k", "I", "T0", "F5", "O77"}, 30)
		if g.chance(2) {
			flags = append(flags, "M"+pick(g.r, []string{"E", "A", "P", "R", "S"}))
		}
		k := g.metaTail(&c, key, &flags, 4)
		c.Text, c.Data = storeText(metaLine("ms", k, []string{strconv.Itoa(len(data))}, flags), "\r\n", data)
	} else {
		verb := pick(g.r, []string{"set", "set", "add", "replace", "append", "prepend", "cas"})
		c.Kind = verb + " too large"
		tail := ""
		if verb == "cas" {
			tail = " " + CASPlaceholder
			g.casRef(&c, key)
		}
		tail += g.quiet(verb, &c)
		c.Text, c.Data = storeText(fmt.Sprintf("%s %s %s 0 %d%s", verb, key, g.flags(), len(data), tail), "\r\n", data)
	}
	get := Command{Text: []byte("get " + key + "\r\n"), Replies: 1, Kind: "get after too large", reads: []string{key}}
	return []Command{c, get}
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
