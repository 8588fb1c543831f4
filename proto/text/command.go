package text

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
	// Verb is the command table's row for the name the line starts with
	// (nil when Parse found none). Kind is Verb.Kind once Parse accepts
	// the command.
	Verb *Verb

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

	// DataLen is a storage command's data length, as its line gives it,
	// once Parse has read the line (whether or not the data has arrived,
	// and also when Parse refuses the data as over its maxValue: see
	// Error.TooLarge); 0 for other commands.
	DataLen int

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
	// TooLarge reports a storage command refused because its data is over
	// Parse's maxValue (Line is memcached's "object too large for cache"):
	// the command's line was read whole, and its Key and DataLen are set.
	TooLarge bool
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
	c.Kind, c.Verb = KindNone, nil
	c.Key, c.Value, c.Line = nil, nil, nil
	c.Keys, c.Args, c.Meta = c.Keys[:0], c.Args[:0], c.Meta[:0]
	c.Flags, c.Exptime, c.HasDelay = 0, 0, false
	c.Delta, c.CAS, c.Level = 0, 0, 0
	c.NoReply, c.Base64 = false, false
	c.Need, c.DataLen = 0, 0
}
