// Package textdiff is a differential test harness for memcached's text and
// meta protocols: Generate builds a long, seeded, deterministic stream of
// commands (good and bad), and Run sends the same bytes, with the same
// write boundaries, to two servers and compares their replies byte for
// byte. Against two fresh memcached servers started alike, with
// MemcachedFlags, the replies are identical; against memcached and a proxy
// in front of a fresh memcached they must be too.
//
// What memcached 1.6 (1.6.18 here) does that the generator has to know,
// found by experiment:
//
//   - Connections it closes: quit (after answering what came before), and
//     a command line it has read more than 2048 bytes of without finding
//     its end, unless the line is a get or gets (those may be any length).
//     Lines over its 16 KiB read buffer are therefore always closed (with a
//     reset, no reply); lines between 2 and 16 KiB are closed or answered
//     depending on how the bytes arrive, so the generator makes none.
//     Nothing else closes a connection: unknown commands, bad numbers, keys
//     over 250 bytes, bad data chunks and oversized values are all answered
//     (ERROR, CLIENT_ERROR ..., SERVER_ERROR object too large for cache) and
//     the connection goes on.
//   - Bytes it swallows: the data block of a storage command whose length it
//     parsed, even when the item is refused as too large; a bad data chunk
//     (wrong length) makes it read exactly the announced length plus two
//     bytes and parse the rest as a command line. When the command line is
//     bad (key too long, bad flags or exptime, negative length, too many
//     tokens), it does not read the data block, which it then parses as a
//     command line; for ms with an undecodable base64 key it does. The
//     generator makes such data blocks harmless as commands (a single ERROR
//     line) so that either way the stream stays in step.
//   - Replies it drops: a get, gets, gat or gats naming a key over 250
//     bytes is answered "CLIENT_ERROR bad command line format" alone, and
//     the replies of the commands just before it (back to the last
//     retrieval or mn) that are not sent yet are dropped with it. A proxy
//     answers every command, so the generator puts an mn before such a
//     line.
//   - A connection whose first byte is 0x80 speaks the binary protocol.
//   - Replies that depend on time: the mg flags h (hit before), l (time
//     since last access) and t (remaining TTL, of items that expire), and
//     flush_all with a delay. The generator leaves out h and l and delayed
//     flushes, uses TTLs of whole thousands of seconds (or 0, or already
//     expired ones), and Run rounds t to thousands (Options.KeepTTL).
//   - Counters and timing: incr, decr and ma rewrite a value in place,
//     padded with spaces, only when nobody else holds a reference to the
//     item; else they store a new item of the exact length. References are
//     held by replies not yet sent (earlier commands in the same pipelined
//     batch), for a moment by the thread of a connection just closed, and
//     by memcached's LRU maintainer thread (asynchronous LRU bumps): start
//     memcached with MemcachedFlags, and the generator keeps an incr of a
//     key out of any batch that names the key before it, or whose previous
//     batch (on another connection) did.
//   - Counters of 2^63 or more: memcached's safe_strtoull looks for a '-' in
//     such a number with strchr, which reads on past the value into the
//     bytes after it in slab memory, so incr on such a value answers the
//     number or "CLIENT_ERROR cannot increment or decrement non-numeric
//     value" by chance. The generator keeps counters far below 2^63 and
//     appends only letters to them.
//   - CAS values come from one counter per server and are the same for
//     identical fresh servers fed identical streams; stats, and the item
//     counts and memory use behind them, differ, and are left out.
//
// Run fills CAS values into cas, ms C, md C and ma C from what each
// server replied before, so that some of them match.
//
// Failures (GenOptions.Failures): a server under test in front of
// memcached (a proxy) also fails commands memcached never fails: its
// backend timed out or is down, its client's budget is spent. memcached
// frames a failed command as one error line instead of its reply: a get,
// gets, gat or gats sends that line alone (no VALUE block, no END), a
// classic command with noreply sends nothing, a meta command in quiet
// mode sends the line all the same. A failure batch (Batch.Fails) holds
// only failing commands on keys no other batch names; the server under
// test gets them at an address where every command that needs its backend
// fails (Options.FailAddrs), and memcached gets each one's equivalent it
// refuses (Command.Alt): the key swapped for one over 250 bytes
// ("CLIENT_ERROR bad command line format", a retrieval's after an mn, see
// above), or for storage commands, whose data memcached would read as a
// command after that refusal, the data swapped for a value over its item
// size limit ("SERVER_ERROR object too large for cache", the data
// swallowed). In a failure batch Run reads every CLIENT_ERROR and
// SERVER_ERROR line, on both sides, as the same line: what is compared is
// the framing.
package textdiff

import "bytes"

// CASPlaceholder is the token Run replaces, in the command line of a
// Command whose CASKey is set, by a CAS value it saw in that side's
// replies for CASKey (see Command.CASDelta).
const CASPlaceholder = "$CAS"

// Command is one command of a stream: the bytes of its command line and,
// for storage commands, its data block, exactly as written to the wire.
type Command struct {
	// Text is the command line with its terminator, and for malformed
	// commands whatever follows it.
	Text []byte
	// Data, when not nil, is a data block: Run writes it after Text,
	// followed by CRLF. It may share memory with other Commands' Data and
	// must not be modified.
	Data []byte
	// CASKey, when not empty, names a key whose latest CAS value Run
	// substitutes for the first CASPlaceholder in Text, per side.
	CASKey string
	// CASDelta is added to the substituted CAS value: 0 gives the value
	// last seen (a likely match), anything else a stale one. When no CAS
	// was seen for CASKey yet, Run substitutes 987654321+CASDelta.
	CASDelta int64
	// Closes is set when memcached closes the connection after this
	// command (quit, an over-long line). It is always the last command of
	// its Batch.
	Closes bool
	// Replies is the number of reply groups (a line, or VALUE blocks up to
	// END, or a VA block) memcached answers this command with, or -1
	// when it depends on the server's state (quiet and noreply commands).
	// It is used only to name the command a difference belongs to.
	Replies int
	// Kind names the generator case that made the command, for reports.
	Kind string
	// Alt and AltData, in a failure batch (Batch.Fails), are what
	// memcached is sent instead of Text and Data: the command made to
	// fail as memcached fails it (see the package doc).
	Alt, AltData []byte

	// reads are the keys the command names; delta the key it
	// increments or decrements (see Generate).
	reads []string
	delta string
}

// isMN reports whether the command is a meta no-op, which memcached
// answers with "MN\r\n" whatever its arguments.
func (c *Command) isMN() bool {
	return bytes.HasPrefix(c.Text, []byte("mn\r\n")) || bytes.HasPrefix(c.Text, []byte("mn\n")) ||
		bytes.HasPrefix(c.Text, []byte("mn "))
}

// Batch is a run of commands written to the connection in one write.
type Batch struct {
	// NewConn asks for a fresh connection (on both sides) before this
	// batch. The first batch of a stream always gets one; so does every
	// batch after one whose last command Closes.
	NewConn bool
	// Cmds are the batch's commands in order.
	Cmds []Command
	// Fails marks a failure batch: every command in it fails, and the
	// server under test gets it at one of Options.FailAddrs (see the
	// package doc). It never closes the connection.
	Fails bool
}

// Closes reports whether the batch's last command closes the connection.
func (b *Batch) Closes() bool {
	return len(b.Cmds) > 0 && b.Cmds[len(b.Cmds)-1].Closes
}

// Stream is a generated command sequence, split into batches.
type Stream struct {
	// Seed is the seed it was generated from.
	Seed uint64
	// Batches in the order they are sent.
	Batches []Batch
}

// Len returns the number of commands in the stream.
func (s *Stream) Len() int {
	n := 0
	for i := range s.Batches {
		n += len(s.Batches[i].Cmds)
	}
	return n
}

// MemcachedFlags are the memcached command line options under which its
// replies to a generated stream are deterministic; start every memcached
// a Run compares (directly, or behind a proxy) with them. Without them
// memcached's LRU maintainer thread takes references to recently fetched
// items in the background (asynchronous LRU bumps), and incr, decr and ma
// rewrite a counter in place (padding it with spaces) only when nobody
// else holds a reference: a counter's length then depends on timing.
var MemcachedFlags = []string{"-o", "no_lru_maintainer"}
