package text

import (
	"strconv"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// The command table: one row (a Verb) per command name memcached's text
// protocol knows, which Parse, a proxy's translation to the binary
// protocol and the differential generator (internal/textdiff) all read.
// A new command is a Kind below and a row in verbs; a new syntax also
// needs a syntax constant and its parse function (parse.go's dispatch).

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

// Quiet is how a client asks for no reply to a command.
type Quiet uint8

// The ways to ask for no reply.
const (
	QuietNever   Quiet = iota // the command always answers
	QuietNoreply              // a last token "noreply": nothing is sent, errors included
	QuietFlag                 // the meta q flag: the common outcome is not sent (HD, NF for md, EN for mg); errors are
)

// Run is how a proxy has memcached run a command.
type Run uint8

// The ways a command runs.
const (
	RunBinary  Run = iota // as the binary command Op (QuietOp when the client asked for no reply)
	RunMeta               // as the meta command it is; Op is the binary command it counts as
	RunRefused            // not at all: it acts on the whole server, which no tenant may
)

// Verb is one row of the command table: a command name and what every
// reader of the table needs to know of it.
type Verb struct {
	// Name is the command as a client writes it.
	Name string
	// Kind is what Parse reports for it; the administrative commands
	// share KindAdmin.
	Kind Kind
	// Quiet is how a client silences it. Of the administrative commands
	// marked QuietNoreply, slabs reads noreply only after "automove".
	Quiet Quiet
	// Run is how a proxy has memcached run it.
	Run Run
	// Op is the binary command it runs as (RunBinary), or counts as for
	// admission and units (RunMeta); see OpFor.
	Op binary.Opcode
	// QuietOp is the binary command it runs as when the client asked for
	// no reply with noreply (QuietNoreply).
	QuietOp binary.Opcode
	// TouchOp, when set, is what a meta command counts as when it also
	// touches or may create its item (mg with T or N).
	TouchOp binary.Opcode

	syntax syntax // how Parse reads its line
	// minArgs, maxArgs: memcached answers ERROR unless the line has that
	// many tokens after the name (maxArgs 0: any number), checked before
	// anything else (the syntax may check more).
	minArgs, maxArgs int8
}

// OpFor returns the binary command a command of v runs as (RunBinary) or
// counts as (RunMeta): QuietOp when the client asked for no reply with
// noreply, TouchOp when the command also touches or may create its item
// (mg with T or N), Op otherwise. Its class in proto/binary's opcode table
// is how the command's units are counted: ClassRead by the bytes
// returned, ClassWrite by the bytes sent, ClassReadWrite both, the others
// not at all.
func (v *Verb) OpFor(noreply, touch bool) binary.Opcode {
	switch {
	case noreply && v.Quiet == QuietNoreply:
		return v.QuietOp
	case touch && v.TouchOp != 0:
		return v.TouchOp
	}
	return v.Op
}

// syntax is how Parse reads a command's line: which function of parse.go,
// classic.go or meta.go takes it apart.
type syntax uint8

const (
	synBare       syntax = iota // nothing after the name is read (version, quit)
	synRetrieval                // get gets gat gats
	synUpdate                   // set add replace append prepend cas
	synArithmetic               // incr decr
	synDelete
	synTouch
	synFlushAll
	synVerbosity
	synStats
	synAdmin
	synMetaGet // the meta syntaxes, synMetaGet to synMetaNoop
	synMetaSet
	synMetaDelete
	synMetaArithmetic
	synMetaDebug
	synMetaNoop
)

// verbs is the command table.
var verbs = []Verb{
	{Name: "get", Kind: KindGet, Op: binary.OpGetKQ, syntax: synRetrieval, minArgs: 1},
	{Name: "gets", Kind: KindGets, Op: binary.OpGetKQ, syntax: synRetrieval, minArgs: 1},
	{Name: "gat", Kind: KindGat, Op: binary.OpGATKQ, syntax: synRetrieval, minArgs: 1},
	{Name: "gats", Kind: KindGats, Op: binary.OpGATKQ, syntax: synRetrieval, minArgs: 1},
	{Name: "set", Kind: KindSet, Quiet: QuietNoreply, Op: binary.OpSet, QuietOp: binary.OpSetQ, syntax: synUpdate},
	{Name: "add", Kind: KindAdd, Quiet: QuietNoreply, Op: binary.OpAdd, QuietOp: binary.OpAddQ, syntax: synUpdate},
	{Name: "replace", Kind: KindReplace, Quiet: QuietNoreply, Op: binary.OpReplace, QuietOp: binary.OpReplaceQ, syntax: synUpdate},
	{Name: "append", Kind: KindAppend, Quiet: QuietNoreply, Op: binary.OpAppend, QuietOp: binary.OpAppendQ, syntax: synUpdate},
	{Name: "prepend", Kind: KindPrepend, Quiet: QuietNoreply, Op: binary.OpPrepend, QuietOp: binary.OpPrependQ, syntax: synUpdate},
	{Name: "cas", Kind: KindCas, Quiet: QuietNoreply, Op: binary.OpSet, QuietOp: binary.OpSetQ, syntax: synUpdate},
	{Name: "incr", Kind: KindIncr, Quiet: QuietNoreply, Op: binary.OpIncrement, QuietOp: binary.OpIncrementQ, syntax: synArithmetic},
	{Name: "decr", Kind: KindDecr, Quiet: QuietNoreply, Op: binary.OpDecrement, QuietOp: binary.OpDecrementQ, syntax: synArithmetic},
	{Name: "delete", Kind: KindDelete, Quiet: QuietNoreply, Op: binary.OpDelete, QuietOp: binary.OpDeleteQ, syntax: synDelete},
	{Name: "touch", Kind: KindTouch, Quiet: QuietNoreply, Op: binary.OpTouch, QuietOp: binary.OpTouch, syntax: synTouch},
	{Name: "flush_all", Kind: KindFlushAll, Quiet: QuietNoreply, Op: binary.OpFlush, QuietOp: binary.OpFlushQ, syntax: synFlushAll},
	{Name: "version", Kind: KindVersion, Op: binary.OpVersion, syntax: synBare},
	{Name: "quit", Kind: KindQuit, Op: binary.OpQuit, syntax: synBare},
	{Name: "stats", Kind: KindStats, Op: binary.OpStat, syntax: synStats},
	{Name: "verbosity", Kind: KindVerbosity, Quiet: QuietNoreply, Op: binary.OpVerbosity, QuietOp: binary.OpVerbosity, syntax: synVerbosity},
	{Name: "mg", Kind: KindMetaGet, Quiet: QuietFlag, Run: RunMeta, Op: binary.OpGet, TouchOp: binary.OpGAT, syntax: synMetaGet},
	{Name: "ms", Kind: KindMetaSet, Quiet: QuietFlag, Run: RunMeta, Op: binary.OpSet, syntax: synMetaSet},
	{Name: "md", Kind: KindMetaDelete, Quiet: QuietFlag, Run: RunMeta, Op: binary.OpDelete, syntax: synMetaDelete},
	{Name: "ma", Kind: KindMetaArithmetic, Quiet: QuietFlag, Run: RunMeta, Op: binary.OpIncrement, syntax: synMetaArithmetic},
	{Name: "mn", Kind: KindMetaNoop, Op: binary.OpNoop, syntax: synMetaNoop},
	{Name: "me", Kind: KindMetaDebug, Run: RunMeta, Op: binary.OpGet, syntax: synMetaDebug},
	// memcached's administrative commands; those it runs through
	// set_noreply_maybe read noreply.
	{Name: "bget", Kind: KindAdmin, Run: RunRefused, syntax: synAdmin, minArgs: 1},
	{Name: "cache_memlimit", Kind: KindAdmin, Quiet: QuietNoreply, Run: RunRefused, syntax: synAdmin, minArgs: 1, maxArgs: 2},
	{Name: "extstore", Kind: KindAdmin, Quiet: QuietNoreply, Run: RunRefused, syntax: synAdmin, minArgs: 1},
	{Name: "lru", Kind: KindAdmin, Quiet: QuietNoreply, Run: RunRefused, syntax: synAdmin, minArgs: 1},
	{Name: "lru_crawler", Kind: KindAdmin, Run: RunRefused, syntax: synAdmin},
	{Name: "refresh_certs", Kind: KindAdmin, Run: RunRefused, syntax: synAdmin},
	{Name: "shutdown", Kind: KindAdmin, Run: RunRefused, syntax: synAdmin},
	{Name: "slabs", Kind: KindAdmin, Quiet: QuietNoreply, Run: RunRefused, syntax: synAdmin},
	{Name: "watch", Kind: KindAdmin, Quiet: QuietNoreply, Run: RunRefused, syntax: synAdmin},
}

// byFirst lists the rows by the first byte of their names, in table
// order: a few string compares find a name faster than a map lookup (on
// Parse's path). byKind gives each kind's row (the first for KindAdmin).
var (
	byFirst [256][]*Verb
	byKind  [kindCount]*Verb
)

func init() {
	for i := range verbs {
		v := &verbs[i]
		if lookup([]byte(v.Name)) != nil {
			panic("text: command " + v.Name + " twice in the table")
		}
		byFirst[v.Name[0]] = append(byFirst[v.Name[0]], v)
		if byKind[v.Kind] == nil {
			byKind[v.Kind] = v
		}
	}
}

// lookup returns the row named name (not empty), or nil.
func lookup(name []byte) *Verb {
	for _, v := range byFirst[name[0]] {
		if len(v.Name) == len(name) && sameBytes(name, v.Name) {
			return v
		}
	}
	return nil
}

// sameBytes is a == b for strings of the same length as short as command
// names, compared in line (string(a) == b calls the runtime).
func sameBytes(a []byte, b string) bool {
	for i := 1; i < len(a); i++ { // a[0] == b[0]: byFirst
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Lookup returns the row of the command a client names name.
func Lookup(name string) (*Verb, bool) {
	if name == "" {
		return nil, false
	}
	v := lookup([]byte(name))
	return v, v != nil
}

// Verbs returns the command table, one row per name, in Kind order.
func Verbs() []Verb { return append([]Verb(nil), verbs...) }

// String returns the command's name as a client writes it ("admin" for
// KindAdmin, whose name is Args[0]).
func (k Kind) String() string {
	switch {
	case k == KindNone:
		return "none"
	case k == KindAdmin:
		return "admin"
	case k < kindCount:
		return byKind[k].Name
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

func (k Kind) syntax() syntax {
	if k == KindNone || k >= kindCount {
		return synBare
	}
	return byKind[k].syntax
}

// IsMeta reports whether k is a meta command (mg ms md ma mn me).
func (k Kind) IsMeta() bool { s := k.syntax(); return s >= synMetaGet && s <= synMetaNoop }

// IsStorage reports whether k carries a data block (set add replace append
// prepend cas ms).
func (k Kind) IsStorage() bool { s := k.syntax(); return s == synUpdate || s == synMetaSet }

// IsMultiGet reports whether k takes any number of keys (get gets gat gats).
func (k Kind) IsMultiGet() bool { return k.syntax() == synRetrieval }
