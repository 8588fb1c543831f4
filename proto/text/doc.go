// Package text is a codec for memcached's text protocol and its meta
// commands (mg, ms, md, ma, mn, me), as memcached 1.6 speaks them.
//
// The package does no I/O. Parse reads one whole command from the start of
// a buffer owned by the caller (typically a gnet inbound buffer): the
// Command it fills holds sub-slices of that buffer (keys, the value, meta
// flag tokens) and is valid only as long as those bytes are. A Command
// keeps the capacity of its slices across calls, so parsing allocates
// nothing once they have grown.
//
// Parse follows memcached's own parser (proto_text.c) to the letter, so that
// a proxy answers malformed input exactly as memcached would: which reply
// line, whether memcached then discards the value bytes of a refused storage
// command, whether it stays silent (noreply) and whether it closes the
// connection. Those outcomes are an *Error; see its fields.
//
// Lines end in "\n", optionally preceded by "\r"; tokens are separated by
// one or more spaces (only ' ': a tab is part of a token); a data block is
// exactly the announced number of bytes followed by "\r\n". Numbers parse
// as memcached's safe_strto* functions parse them, including C's quirks: a
// 32-bit field takes the low 32 bits of a 64-bit parse, so that
// `set k 4294967296 0 1` stores flags 0.
//
// One table (commands.go) holds every command: its name, Kind, how a client
// silences it, how a proxy runs it (the binary command it translates to or
// counts as, which says how its units are counted) and which syntax Parse
// reads it with. Lookup and Verbs give its rows; a parsed Command points at
// its row (Command.Verb). A new command is a Kind and a row there.
//
// The encoders (Append*) append memcached's replies to a caller's slice:
// VALUE blocks and status lines for the classic commands, and meta reply
// lines with their returned flags. ParseMetaResponse reads a meta reply from
// memcached, so a proxy can rewrite its returned key (the k flag, base64
// with b) before passing it on.
package text
