package text

import (
	"bytes"
	"strconv"
)

// MaxKeyLen is the longest key memcached accepts, in bytes. For a meta
// command with the b flag it bounds the key as sent (base64), not decoded.
const MaxKeyLen = 250

// MaxLineLen is how many bytes memcached buffers without finding a "\n"
// before it gives up on a command line and closes the connection without a
// reply; lines starting with "get " or "gets " are exempt (a multi-get line
// has no bound in memcached). A line whose "\n" has arrived is read whatever
// its length, up to ReadBufferLen.
const MaxLineLen = 2048

// ReadBufferLen is memcached's read buffer, in bytes: a command line
// longer than this, "\n" included, can never be whole in it, so memcached
// always closes the connection on one (without a reply), get and gets
// lines excepted. A line between MaxLineLen and ReadBufferLen is closed or
// answered depending on how its bytes arrive; Parse answers it, as
// memcached does when the line arrives in one piece.
const ReadBufferLen = 16384

// maxTokens is memcached's MAX_TOKENS: a line is split into at most
// maxTokens-1 tokens (the last slot is the terminal token) and the rest is
// left for the multi-get commands to split again.
const maxTokens = 24

// maxMetaTokens is memcached's MFLAG_MAX_OPT_LENGTH: a meta command with
// more tokens than this (counting the terminal token) is refused.
const maxMetaTokens = 20

// MaxOpaqueLen is the longest O (opaque) flag memcached accepts, in bytes,
// counting the letter O.
const MaxOpaqueLen = 32

// Kind is the command a line names.
type Kind uint8

// The commands Parse knows.
const (
	KindNone           Kind = iota // no command (Parse failed or found none)
	KindGet                        // get <key>*: Keys
	KindGets                       // gets <key>*: Keys; the reply carries CAS values
	KindGat                        // gat <exptime> <key>*: Exptime, Keys (possibly none: memcached answers END)
	KindGats                       // gats <exptime> <key>*: as gat, with CAS values
	KindSet                        // set <key> <flags> <exptime> <bytes> [noreply]: Key, Flags, Exptime, Value, NoReply
	KindAdd                        // add: as set
	KindReplace                    // replace: as set
	KindAppend                     // append: as set (memcached ignores flags and exptime)
	KindPrepend                    // prepend: as set
	KindCas                        // cas <key> <flags> <exptime> <bytes> <cas> [noreply]: as set, and CAS
	KindIncr                       // incr <key> <delta> [noreply]: Key, Delta, NoReply
	KindDecr                       // decr: as incr
	KindDelete                     // delete <key> [0] [noreply]: Key, NoReply
	KindTouch                      // touch <key> <exptime> [noreply]: Key, Exptime, NoReply
	KindFlushAll                   // flush_all [delay] [noreply]: Exptime and HasDelay, NoReply
	KindVersion                    // version
	KindQuit                       // quit: memcached closes the connection without a reply
	KindStats                      // stats [group [args]]: Args
	KindVerbosity                  // verbosity <level> [noreply]: Level, NoReply
	KindMetaGet                    // mg <key> <flag>*: Key, Meta, Base64, NoReply (q)
	KindMetaSet                    // ms <key> <datalen> <flag>*: Key, Value, Meta, Base64, NoReply (q)
	KindMetaDelete                 // md <key> <flag>*: as mg
	KindMetaArithmetic             // ma <key> <flag>*: as mg
	KindMetaNoop                   // mn: memcached answers MN
	KindMetaDebug                  // me <key> [b]: Key, Base64 (Meta holds b alone; memcached reads no other flag)
	// KindAdmin is one of memcached's administrative commands (slabs, lru,
	// lru_crawler, watch, shutdown, cache_memlimit, extstore,
	// refresh_certs, and bget, an ancient alias of get): Args holds its
	// tokens, the name first, and a proxy answers it itself.
	KindAdmin
	kindCount
)

var kindNames = [kindCount]string{
	KindNone: "none", KindGet: "get", KindGets: "gets", KindGat: "gat", KindGats: "gats",
	KindSet: "set", KindAdd: "add", KindReplace: "replace", KindAppend: "append",
	KindPrepend: "prepend", KindCas: "cas", KindIncr: "incr", KindDecr: "decr",
	KindDelete: "delete", KindTouch: "touch", KindFlushAll: "flush_all",
	KindVersion: "version", KindQuit: "quit", KindStats: "stats", KindVerbosity: "verbosity",
	KindMetaGet: "mg", KindMetaSet: "ms", KindMetaDelete: "md", KindMetaArithmetic: "ma",
	KindMetaNoop: "mn", KindMetaDebug: "me", KindAdmin: "admin",
}

// String returns the command's name as a client writes it ("admin" for
// KindAdmin, whose name is Args[0]).
func (k Kind) String() string {
	if k < kindCount {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// IsMeta reports whether k is a meta command (mg ms md ma mn me).
func (k Kind) IsMeta() bool { return k >= KindMetaGet && k <= KindMetaDebug }

// IsStorage reports whether k carries a data block (set add replace append
// prepend cas ms).
func (k Kind) IsStorage() bool {
	return k >= KindSet && k <= KindCas || k == KindMetaSet
}

// IsMultiGet reports whether k takes any number of keys (get gets gat gats).
func (k Kind) IsMultiGet() bool { return k >= KindGet && k <= KindGats }

// MetaFlag is one flag of a meta command or reply: its letter and the bytes
// that follow the letter in its token (empty for a flag such as v or q). For
// `O123` Flag is 'O' and Token is "123". Token aliases the parsed buffer.
type MetaFlag struct {
	Flag  byte
	Token []byte
}

// Command is one parsed command. Its byte slices alias the buffer given to
// Parse. Parse resets every field it does not set, and keeps the capacity of
// Keys, Args and Meta so that a Command reused for every command of a
// connection stops allocating once they have grown. A Command must not be
// copied while a Parse error that points into it is in use.
type Command struct {
	Kind Kind

	// Key is the command's key (the first key of a multi-get). For a meta
	// command with the b flag (Base64) it is the key as sent, in base64:
	// DecodeBase64 gives the key memcached stores.
	Key []byte
	// Keys holds every key of a multi-get, in order (Keys[0] is Key); it
	// is empty for other commands.
	Keys [][]byte

	// Flags is the client flags of a classic storage command.
	Flags uint32
	// Exptime is the expiry of a storage command, touch, gat and gats, or
	// flush_all's delay (HasDelay), in memcached's units: seconds, or a Unix
	// time when over 30 days; negative expires at once.
	Exptime int32
	// HasDelay reports that flush_all gave a delay (Exptime).
	HasDelay bool
	// Delta is incr's or decr's amount.
	Delta uint64
	// CAS is the compare-and-swap value of cas.
	CAS uint64
	// Level is verbosity's level.
	Level uint32
	// Value is a storage command's data block, without its "\r\n".
	Value []byte
	// NoReply is set for classic commands that end in `noreply` (memcached
	// then sends no reply, errors included; the administrative commands
	// that read it too, see admin) and for meta commands with the q flag
	// (memcached then omits the replies the flag hides: HD, NF for md, EN
	// for mg, and sends its errors).
	NoReply bool

	// Meta holds a meta command's flags in order, one per token after the
	// key (after the data length for ms).
	Meta []MetaFlag
	// Base64 reports the meta b flag: Key is base64.
	Base64 bool

	// Args holds the tokens after the command for stats (its group and
	// arguments) and, with the command name first, for KindAdmin.
	Args [][]byte

	// Line is the command line without its line ending, cut at the first
	// NUL byte (memcached reads the line as a C string).
	Line []byte

	// Need is set when Parse returns 0 and a nil error for a storage
	// command whose line has arrived but not all of its data: the length in
	// bytes of the whole command, so the caller knows how much to buffer.
	// It is 0 otherwise.
	Need int

	err  Error
	toks [maxTokens][]byte
}

// Error is how memcached refuses a command: the reply line it sends and
// what it does with the connection. Parse returns it as a *Error that points
// into the Command it was given, valid until that Command's next Parse.
//
// After the refused command (its n bytes), memcached discards Swallow more
// bytes unread (the data block of a storage command it refused before
// reading it); then, unless Close is set, it reads the next command.
type Error struct {
	// Line is memcached's reply, without "\r\n", e.g.
	// "CLIENT_ERROR bad command line format". Empty when memcached closes
	// without a word.
	Line string
	// Silent reports that memcached sends nothing, because the command
	// asked for noreply (Line still says what it would have sent).
	Silent bool
	// Swallow is how many bytes after the command line memcached discards:
	// a refused data block and its "\r\n".
	Swallow int
	// Close reports that memcached closes the connection (after sending
	// Line, if any).
	Close bool
	// Applied reports that memcached carries the command out before it
	// answers with this error (an over-long opaque on ma, or on mg, whose T
	// and N flags take effect first): a proxy that wants memcached's state
	// to match forwards the command and relays memcached's answer.
	Applied bool
	// Limit reports that the refusal is this package's, not memcached's: a
	// multi-get line longer than the caller's bound, which memcached would
	// keep buffering.
	Limit bool
}

// Error returns the reply line, or a description for a silent close.
func (e *Error) Error() string {
	if e.Line == "" {
		if e.Limit {
			return "text: command line over the limit"
		}
		return "text: connection closed without reply"
	}
	return "text: " + e.Line
}

// AppendReply appends what memcached sends for e: Line and "\r\n", or
// nothing when it is silent or has no line.
func (e *Error) AppendReply(dst []byte) []byte {
	if e.Silent || e.Line == "" {
		return dst
	}
	dst = append(dst, e.Line...)
	return append(dst, "\r\n"...)
}

// memcached's reply lines for refused commands.
const (
	msgError          = "ERROR"
	msgBadFormat      = "CLIENT_ERROR bad command line format"
	msgBadChunk       = "CLIENT_ERROR bad data chunk"
	msgTooLarge       = "SERVER_ERROR object too large for cache"
	msgBadExptime     = "CLIENT_ERROR invalid exptime argument"
	msgBadDelta       = "CLIENT_ERROR invalid numeric delta argument"
	msgDeleteUsage    = "CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]"
	msgMgTooMany      = "CLIENT_ERROR options flags are too long"
	msgTooMany        = "CLIENT_ERROR options flags too long"
	msgDupFlag        = "CLIENT_ERROR duplicate flag"
	msgInvalidFlag    = "CLIENT_ERROR invalid flag"
	msgDecodeKey      = "CLIENT_ERROR error decoding key"
	msgBadToken       = "CLIENT_ERROR bad token in command line format"
	msgMLength        = "CLIENT_ERROR incorrect length for M token"
	msgBadInitial     = "CLIENT_ERROR invalid numeric initial value"
	msgBadDeltaValue  = "CLIENT_ERROR invalid numeric delta value"
	msgOpaqueTooLong  = "CLIENT_ERROR opaque token too long"
	msgMsMode         = "CLIENT_ERROR invalid mode for ms M token"
	msgMaMode         = "CLIENT_ERROR invalid mode for ma M token"
	msgInvalidOrDup   = "CLIENT_ERROR invalid or duplicate flag"
	stringNoreply     = "noreply"
	maxValueLenMemcd  = 1<<31 - 1 - 2 // INT_MAX - 2
	leadingSpaceLimit = 100
)

func (c *Command) fail(e Error) error {
	c.err = e
	return &c.err
}

// reset clears c for a new command, keeping its slices' capacity.
// It leaves c.toks alone: tokenize writes the tokens it reports.
func (c *Command) reset() {
	c.Kind = KindNone
	c.Key, c.Value, c.Line = nil, nil, nil
	c.Keys, c.Args, c.Meta = c.Keys[:0], c.Args[:0], c.Meta[:0]
	c.Flags, c.Exptime, c.HasDelay = 0, 0, false
	c.Delta, c.CAS, c.Level = 0, 0, 0
	c.NoReply, c.Base64 = false, false
	c.Need = 0
}

// Parse reads the command at the start of buf into c and returns its length
// in bytes: the command line with its "\n" and, for a storage command, its
// data block and "\r\n".
//
// It returns n == 0 and a nil error while buf holds no whole command. It
// returns a *Error (pointing into c) when memcached would refuse the
// command; n is then the bytes memcached consumes with it, and the error
// says what memcached sends, whether it discards further bytes and whether
// it closes the connection. After a refusal that does not close, the next
// command starts at buf[n+Swallow:].
//
// maxValue bounds a data block in bytes; a longer one is refused with
// memcached's "SERVER_ERROR object too large for cache" (memcached's own
// bound is its item size, -I). maxValue also bounds a multi-get line still
// waiting for its "\n" (Error.Limit). maxValue <= 0 means no bound.
//
// Parse allocates nothing once c's slices have grown; c's fields alias buf.
func Parse(buf []byte, maxValue int, c *Command) (n int, err error) {
	c.reset()
	nl := bytes.IndexByte(buf, '\n')
	if nl < 0 {
		if len(buf) <= MaxLineLen {
			return 0, nil
		}
		if !isGetLine(buf) {
			return 0, c.fail(Error{Close: true})
		}
		if maxValue > 0 && len(buf) > maxValue {
			return 0, c.fail(Error{Close: true, Limit: true})
		}
		return 0, nil
	}
	n = nl + 1
	if n > ReadBufferLen && !isGetLine(buf) {
		return 0, c.fail(Error{Close: true})
	}
	line := buf[:nl]
	if nl > 1 && line[nl-1] == '\r' {
		line = line[:nl-1]
	}
	if z := bytes.IndexByte(line, 0); z >= 0 {
		line = line[:z]
	}
	c.Line = line
	return c.dispatch(buf, n, maxValue)
}

// isGetLine reports whether memcached reads the line starting buf
// whatever its length: a get or gets, after at most leadingSpaceLimit
// spaces.
func isGetLine(buf []byte) bool {
	p := 0
	for p < len(buf) && buf[p] == ' ' {
		p++
	}
	return p <= leadingSpaceLimit && (bytes.HasPrefix(buf[p:], []byte("get ")) || bytes.HasPrefix(buf[p:], []byte("gets ")))
}

// tokenize splits s as memcached's tokenize_command does into c.toks and
// returns ntokens in memcached's sense (real tokens plus the terminal one)
// and the unsplit rest of s (nil when all of s was split).
func (c *Command) tokenize(s []byte) (nt int, rest []byte) { return tokenize(&c.toks, s) }

// tokenize splits s at spaces into toks, at most maxTokens-1 tokens, and
// returns ntokens in memcached's sense (real tokens plus the terminal one)
// and the unsplit rest of s (nil when all of s was split).
func tokenize(toks *[maxTokens][]byte, s []byte) (nt int, rest []byte) {
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] != ' ' {
			continue
		}
		if i > start {
			toks[nt] = s[start:i]
			nt++
			if nt == maxTokens-1 {
				if i+1 < len(s) {
					rest = s[i+1:]
				}
				toks[nt] = nil
				return nt + 1, rest
			}
		}
		start = i + 1
	}
	if start < len(s) {
		toks[nt] = s[start:]
		nt++
	}
	toks[nt] = nil
	return nt + 1, nil
}

func (c *Command) dispatch(buf []byte, n, maxValue int) (int, error) {
	nt, rest := c.tokenize(c.Line)
	t := &c.toks
	if nt < 2 || len(t[0]) < 2 {
		return n, c.fail(Error{Line: msgError})
	}
	cmd := t[0]
	if cmd[0] == 'm' && len(cmd) == 2 {
		switch cmd[1] {
		case 'g':
			return c.metaGet(n, nt)
		case 's':
			return c.metaSet(buf, n, nt, maxValue)
		case 'd':
			return c.metaDelete(n, nt)
		case 'n':
			c.Kind = KindMetaNoop
			return n, nil
		case 'a':
			return c.metaArithmetic(n, nt)
		case 'e':
			return c.metaDebug(n, nt)
		}
		return n, c.fail(Error{Line: msgError})
	}
	switch cmd[0] {
	case 'g':
		if nt < 3 {
			return n, c.fail(Error{Line: msgError})
		}
		switch string(cmd) {
		case "get":
			return c.get(n, nt, rest, KindGet)
		case "gets":
			return c.get(n, nt, rest, KindGets)
		case "gat":
			return c.get(n, nt, rest, KindGat)
		case "gats":
			return c.get(n, nt, rest, KindGats)
		}
		return n, c.fail(Error{Line: msgError})
	case 's':
		switch string(cmd) {
		case "set":
			return c.update(buf, n, nt, maxValue, KindSet)
		case "stats":
			c.Kind = KindStats
			c.Args = append(c.Args, t[1:nt-1]...)
			return n, nil
		case "shutdown", "slabs":
			return c.admin(n, nt)
		}
		return n, c.fail(Error{Line: msgError})
	case 'a':
		switch string(cmd) {
		case "add":
			return c.update(buf, n, nt, maxValue, KindAdd)
		case "append":
			return c.update(buf, n, nt, maxValue, KindAppend)
		}
		return n, c.fail(Error{Line: msgError})
	case 'c':
		switch string(cmd) {
		case "cas":
			return c.update(buf, n, nt, maxValue, KindCas)
		case "cache_memlimit":
			if nt != 3 && nt != 4 {
				return n, c.fail(Error{Line: msgError})
			}
			return c.admin(n, nt)
		}
		return n, c.fail(Error{Line: msgError})
	case 'i':
		if string(cmd) == "incr" {
			return c.arithmetic(n, nt, KindIncr)
		}
		return n, c.fail(Error{Line: msgError})
	case 'd':
		switch string(cmd) {
		case "delete":
			return c.delete(n, nt)
		case "decr":
			return c.arithmetic(n, nt, KindDecr)
		}
		return n, c.fail(Error{Line: msgError})
	case 't':
		if string(cmd) == "touch" {
			return c.touch(n, nt)
		}
		return n, c.fail(Error{Line: msgError})
	}
	switch string(cmd) {
	case "replace":
		return c.update(buf, n, nt, maxValue, KindReplace)
	case "prepend":
		return c.update(buf, n, nt, maxValue, KindPrepend)
	case "bget", "lru", "extstore":
		if nt < 3 {
			return n, c.fail(Error{Line: msgError})
		}
		return c.admin(n, nt)
	case "flush_all":
		return c.flushAll(n, nt)
	case "version":
		c.Kind = KindVersion
		return n, nil
	case "quit":
		c.Kind = KindQuit
		return n, nil
	case "lru_crawler", "watch", "refresh_certs":
		return c.admin(n, nt)
	case "verbosity":
		return c.verbosity(n, nt)
	}
	if bytes.HasPrefix(t[nt-2], []byte("HTTP/")) {
		return n, c.fail(Error{Close: true})
	}
	return n, c.fail(Error{Line: msgError})
}

// admin parses an administrative command. Those memcached runs through
// set_noreply_maybe (cache_memlimit, lru, extstore, slabs automove, watch)
// send nothing when they end in noreply, not even an error: NoReply says
// so, and a proxy that refuses them refuses them silently then.
func (c *Command) admin(n, nt int) (int, error) {
	c.Kind = KindAdmin
	c.Args = append(c.Args, c.toks[:nt-1]...)
	switch string(c.Args[0]) {
	case "cache_memlimit", "lru", "extstore", "watch":
		c.noreply(nt)
	case "slabs":
		if len(c.Args) > 1 && string(c.Args[1]) == "automove" {
			c.noreply(nt)
		}
	}
	return n, nil
}

// noreply is memcached's set_noreply_maybe: the last token is "noreply".
func (c *Command) noreply(nt int) bool {
	c.NoReply = string(c.toks[nt-2]) == stringNoreply
	return c.NoReply
}

// failReply refuses a classic command, silently when it asked for noreply.
func (c *Command) failReply(n int, line string) (int, error) {
	return n, c.fail(Error{Line: line, Silent: c.NoReply})
}

func (c *Command) get(n, nt int, rest []byte, k Kind) (int, error) {
	c.Kind = k
	i := 1
	if k == KindGat || k == KindGats {
		e, ok := parseInt32(c.toks[1])
		if !ok {
			return n, c.fail(Error{Line: msgBadExptime})
		}
		c.Exptime = e
		i = 2
	}
	for {
		for ; i < nt-1; i++ {
			key := c.toks[i]
			if len(key) > MaxKeyLen {
				return n, c.fail(Error{Line: msgBadFormat})
			}
			c.Keys = append(c.Keys, key)
		}
		if rest == nil {
			break
		}
		nt, rest = c.tokenize(rest)
		i = 0
	}
	if len(c.Keys) > 0 {
		c.Key = c.Keys[0]
	}
	return n, nil
}

// update parses set, add, replace, append, prepend and cas, which memcached
// handles in process_update_command.
func (c *Command) update(buf []byte, n, nt, maxValue int, k Kind) (int, error) {
	t := &c.toks
	if k == KindCas {
		if nt != 7 && nt != 8 {
			return n, c.fail(Error{Line: msgError})
		}
	} else if nt != 6 && nt != 7 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = k
	c.noreply(nt)
	if len(t[1]) > MaxKeyLen {
		return c.failReply(n, msgBadFormat)
	}
	c.Key = t[1]
	flags, ok1 := parseUint32(t[2])
	exp, ok2 := parseInt32(t[3])
	vlen, ok3 := parseInt32(t[4])
	if !ok1 || !ok2 || !ok3 {
		return c.failReply(n, msgBadFormat)
	}
	c.Flags, c.Exptime = flags, exp
	if k == KindCas {
		cas, ok := parseUint64(t[5])
		if !ok {
			return c.failReply(n, msgBadFormat)
		}
		c.CAS = cas
	}
	if vlen < 0 || int64(vlen) > maxValueLenMemcd {
		return c.failReply(n, msgBadFormat)
	}
	return c.data(buf, n, int(vlen), maxValue, false)
}

// data reads the data block of vlen bytes that follows the command line
// (n bytes) of a storage command. meta: errors are never silent.
func (c *Command) data(buf []byte, n, vlen, maxValue int, meta bool) (int, error) {
	if maxValue > 0 && vlen > maxValue {
		return n, c.fail(Error{Line: msgTooLarge, Silent: c.NoReply && !meta, Swallow: vlen + 2})
	}
	end := n + vlen + 2
	if len(buf) < end {
		c.Need = end
		return 0, nil
	}
	if buf[end-2] != '\r' || buf[end-1] != '\n' {
		return end, c.fail(Error{Line: msgBadChunk, Silent: c.NoReply && !meta})
	}
	c.Value = buf[n : n+vlen]
	return end, nil
}

func (c *Command) touch(n, nt int) (int, error) {
	if nt != 4 && nt != 5 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindTouch
	c.noreply(nt)
	if len(c.toks[1]) > MaxKeyLen {
		return c.failReply(n, msgBadFormat)
	}
	c.Key = c.toks[1]
	e, ok := parseInt32(c.toks[2])
	if !ok {
		return c.failReply(n, msgBadExptime)
	}
	c.Exptime = e
	return n, nil
}

func (c *Command) arithmetic(n, nt int, k Kind) (int, error) {
	if nt != 4 && nt != 5 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = k
	c.noreply(nt)
	if len(c.toks[1]) > MaxKeyLen {
		return c.failReply(n, msgBadFormat)
	}
	c.Key = c.toks[1]
	d, ok := parseUint64(c.toks[2])
	if !ok {
		return c.failReply(n, msgBadDelta)
	}
	c.Delta = d
	return n, nil
}

func (c *Command) delete(n, nt int) (int, error) {
	if nt < 3 || nt > 5 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindDelete
	if nt > 3 {
		zero := string(c.toks[2]) == "0"
		nr := c.noreply(nt)
		if !(nt == 4 && (zero || nr) || nt == 5 && zero && nr) {
			return c.failReply(n, msgDeleteUsage)
		}
	}
	if len(c.toks[1]) > MaxKeyLen {
		return c.failReply(n, msgBadFormat)
	}
	c.Key = c.toks[1]
	return n, nil
}

func (c *Command) verbosity(n, nt int) (int, error) {
	if nt != 3 && nt != 4 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindVerbosity
	c.noreply(nt)
	l, ok := parseUint32(c.toks[1])
	if !ok {
		return c.failReply(n, msgBadFormat)
	}
	c.Level = l
	return n, nil
}

func (c *Command) flushAll(n, nt int) (int, error) {
	if nt < 2 || nt > 4 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindFlushAll
	want := 2
	if c.noreply(nt) {
		want = 3
	}
	if nt != want {
		e, ok := parseInt32(c.toks[1])
		if !ok {
			return c.failReply(n, msgBadExptime)
		}
		c.Exptime, c.HasDelay = e, true
	}
	return n, nil
}
