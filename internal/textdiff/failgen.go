package textdiff

import (
	"fmt"
	"strconv"
)

// Failure batches (GenOptions.Failures; see the package doc): commands
// the server under test fails at a failure address, each with the
// equivalent memcached refuses, framed alike.

// failKeys are the keys of failing commands: no other command names them,
// so that whatever a failing command may have done on either side
// (memcached unlinks the key of a set refused as too large) is never read.
var failKeys = []string{"fail0", "fail1", "fail2", "fail3", "fail4", "fail5"}

// failureBatch returns a batch of 1 to 5 failing commands.
func (g *gen) failureBatch() Batch {
	b := Batch{Fails: true}
	for n := 1 + g.r.IntN(5); n > 0; n-- {
		b.Cmds = append(b.Cmds, g.failing())
	}
	return b
}

// failing returns one failing command: its Text for the server under
// test, its Alt for memcached.
func (g *gen) failing() Command {
	makers := []func() Command{g.failRetrieval, g.failRetrieval, g.failKeyed}
	if !g.o.NoMeta {
		makers = append(makers, g.failMeta)
	}
	if !g.o.NoHuge { // memcached fails storage commands with huge values
		makers = append(makers, g.failStore)
		if !g.o.NoMeta {
			makers = append(makers, g.failMetaSet)
		}
	}
	return pick(g.r, makers)()
}

// failRetrieval: get, gets, gat or gats of 1 to 4 keys. memcached refuses
// the one over 250 bytes with one error line and drops the replies not yet
// sent of the commands before it in the batch: an mn (its reply sent
// alike) fences those off.
func (g *gen) failRetrieval() Command {
	verb := pick(g.r, []string{"get", "gets", "gat", "gats"})
	line := verb
	if verb[1] == 'a' {
		line += " " + g.ttl()
	}
	alt := line
	n := 1 + g.r.IntN(4)
	bad := g.r.IntN(n)
	for i := range n {
		k := pick(g.r, failKeys)
		line += " " + k
		if i == bad {
			k = g.badKey()
		}
		alt += " " + k
	}
	return Command{Text: []byte("mn\r\n" + line + "\r\n"), Alt: []byte("mn\r\n" + alt + "\r\n"), Replies: 2, Kind: "failing " + verb}
}

// failKeyed: incr, decr, delete or touch, noreply now and then (memcached
// then sends nothing, its refusal included).
func (g *gen) failKeyed() Command {
	verb := pick(g.r, []string{"incr", "decr", "delete", "touch"})
	arg := ""
	switch verb {
	case "incr", "decr":
		arg = " 1"
	case "touch":
		arg = " " + g.ttl()
	}
	c := Command{Replies: 1, Kind: "failing " + verb}
	tail := arg
	tail += g.quiet(verb, &c)
	c.Text = []byte(verb + " " + pick(g.r, failKeys) + tail + "\r\n")
	c.Alt = []byte(verb + " " + g.badKey() + tail + "\r\n")
	return c
}

// failMeta: mg, md or ma, quiet now and then (memcached sends its errors
// in quiet mode all the same).
func (g *gen) failMeta() Command {
	verb := pick(g.r, []string{"mg", "md", "ma"})
	flags := ""
	if verb == "mg" {
		flags = " v"
	}
	if g.chance(2) {
		flags += " q"
	}
	return Command{
		Text:    []byte(verb + " " + pick(g.r, failKeys) + flags + "\r\n"),
		Alt:     []byte(verb + " " + g.badKey() + flags + "\r\n"),
		Replies: 1, Kind: "failing " + verb,
	}
}

// tooLargeData returns data over memcached's default 1 MiB item size
// limit (see GenOptions.TooLarge).
func (g *gen) tooLargeData() []byte { return g.shared(g.o.TooLarge+g.r.IntN(1000), true) }

// failStore: a classic storage command, noreply now and then. memcached
// gets the same command with a value over its limit.
func (g *gen) failStore() Command {
	verb := pick(g.r, []string{"set", "add", "replace", "append", "prepend", "cas"})
	key := pick(g.r, failKeys)
	data, big := g.bytes(1+g.r.IntN(20), false), g.tooLargeData()
	tail := ""
	if verb == "cas" {
		tail = " " + strconv.Itoa(1+g.r.IntN(1000))
	}
	c := Command{Replies: 1, Kind: "failing " + verb}
	tail += g.quiet(verb, &c)
	c.Text, c.Data = []byte(fmt.Sprintf("%s %s 0 0 %d%s\r\n", verb, key, len(data), tail)), data
	c.Alt, c.AltData = []byte(fmt.Sprintf("%s %s 0 0 %d%s\r\n", verb, key, len(big), tail)), big
	return c
}

// failMetaSet: ms, quiet now and then, with a value over memcached's
// limit for memcached.
func (g *gen) failMetaSet() Command {
	key := pick(g.r, failKeys)
	data, big := g.bytes(1+g.r.IntN(20), false), g.tooLargeData()
	flags := ""
	if g.chance(2) {
		flags = " q"
	}
	return Command{
		Text: []byte(fmt.Sprintf("ms %s %d%s\r\n", key, len(data), flags)), Data: data,
		Alt: []byte(fmt.Sprintf("ms %s %d%s\r\n", key, len(big), flags)), AltData: big,
		Replies: 1, Kind: "failing ms",
	}
}
