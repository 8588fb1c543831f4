package binary

import "strconv"

// Magic identifies the kind of a frame (first byte of the header).
type Magic uint8

// Magic values. The Alt forms carry flexible framing extras.
const (
	MagicRequest     Magic = 0x80 // classic client request
	MagicResponse    Magic = 0x81 // classic server response
	MagicAltRequest  Magic = 0x08 // client request with framing extras
	MagicAltResponse Magic = 0x18 // server response with framing extras
)

// IsRequest reports whether m is a client request magic.
func (m Magic) IsRequest() bool { return m == MagicRequest || m == MagicAltRequest }

// IsResponse reports whether m is a server response magic.
func (m Magic) IsResponse() bool { return m == MagicResponse || m == MagicAltResponse }

// IsAlt reports whether m is a flexible-framing magic.
func (m Magic) IsAlt() bool { return m == MagicAltRequest || m == MagicAltResponse }

// Valid reports whether m is one of the four known magics.
func (m Magic) Valid() bool { return m.IsRequest() || m.IsResponse() }

// Opcode is the command of a frame.
type Opcode uint8

// Opcodes of the memcached binary protocol, and the Couchbase extensions
// kvthrottle implements. The Q suffix marks quiet variants.
const (
	OpGet                         Opcode = 0x00
	OpSet                         Opcode = 0x01
	OpAdd                         Opcode = 0x02
	OpReplace                     Opcode = 0x03
	OpDelete                      Opcode = 0x04
	OpIncrement                   Opcode = 0x05
	OpDecrement                   Opcode = 0x06
	OpQuit                        Opcode = 0x07
	OpFlush                       Opcode = 0x08
	OpGetQ                        Opcode = 0x09
	OpNoop                        Opcode = 0x0a
	OpVersion                     Opcode = 0x0b
	OpGetK                        Opcode = 0x0c
	OpGetKQ                       Opcode = 0x0d
	OpAppend                      Opcode = 0x0e
	OpPrepend                     Opcode = 0x0f
	OpStat                        Opcode = 0x10
	OpSetQ                        Opcode = 0x11
	OpAddQ                        Opcode = 0x12
	OpReplaceQ                    Opcode = 0x13
	OpDeleteQ                     Opcode = 0x14
	OpIncrementQ                  Opcode = 0x15
	OpDecrementQ                  Opcode = 0x16
	OpQuitQ                       Opcode = 0x17
	OpFlushQ                      Opcode = 0x18
	OpAppendQ                     Opcode = 0x19
	OpPrependQ                    Opcode = 0x1a
	OpVerbosity                   Opcode = 0x1b
	OpTouch                       Opcode = 0x1c
	OpGAT                         Opcode = 0x1d
	OpGATQ                        Opcode = 0x1e
	OpHello                       Opcode = 0x1f
	OpSASLListMechs               Opcode = 0x20
	OpSASLAuth                    Opcode = 0x21
	OpSASLStep                    Opcode = 0x22
	OpGATK                        Opcode = 0x23
	OpGATKQ                       Opcode = 0x24
	OpSetBucketThrottleProperties Opcode = 0x2a
	OpSetNodeThrottleProperties   Opcode = 0x2c
	OpSelectBucket                Opcode = 0x89
)

type opInfo struct {
	name   string
	quiet  bool   // the server sends nothing on the common outcome
	loud   Opcode // the non-quiet twin of a quiet opcode
	class  Class
	stdMem bool // understood by a stock memcached server
}

// Class groups opcodes by how kvthrottle treats them.
type Class uint8

// Opcode classes.
const (
	ClassOther     Class = iota // not metered, forwarded when memcached knows it
	ClassRead                   // metered by bytes returned
	ClassWrite                  // metered by bytes sent
	ClassReadWrite              // GAT: both
	ClassLocal                  // answered by the proxy itself
)

var ops [256]opInfo

func def(op Opcode, name string, class Class, quiet bool, loud Opcode) {
	ops[op] = opInfo{name: name, quiet: quiet, loud: loud, class: class, stdMem: true}
	if !quiet {
		ops[op].loud = op
	}
}

func init() {
	def(OpGet, "GET", ClassRead, false, 0)
	def(OpSet, "SET", ClassWrite, false, 0)
	def(OpAdd, "ADD", ClassWrite, false, 0)
	def(OpReplace, "REPLACE", ClassWrite, false, 0)
	def(OpDelete, "DELETE", ClassWrite, false, 0)
	def(OpIncrement, "INCREMENT", ClassWrite, false, 0)
	def(OpDecrement, "DECREMENT", ClassWrite, false, 0)
	def(OpQuit, "QUIT", ClassLocal, false, 0)
	def(OpFlush, "FLUSH", ClassOther, false, 0)
	def(OpGetQ, "GETQ", ClassRead, true, OpGet)
	def(OpNoop, "NOOP", ClassLocal, false, 0)
	def(OpVersion, "VERSION", ClassOther, false, 0)
	def(OpGetK, "GETK", ClassRead, false, 0)
	def(OpGetKQ, "GETKQ", ClassRead, true, OpGetK)
	def(OpAppend, "APPEND", ClassWrite, false, 0)
	def(OpPrepend, "PREPEND", ClassWrite, false, 0)
	def(OpStat, "STAT", ClassOther, false, 0)
	def(OpSetQ, "SETQ", ClassWrite, true, OpSet)
	def(OpAddQ, "ADDQ", ClassWrite, true, OpAdd)
	def(OpReplaceQ, "REPLACEQ", ClassWrite, true, OpReplace)
	def(OpDeleteQ, "DELETEQ", ClassWrite, true, OpDelete)
	def(OpIncrementQ, "INCREMENTQ", ClassWrite, true, OpIncrement)
	def(OpDecrementQ, "DECREMENTQ", ClassWrite, true, OpDecrement)
	def(OpQuitQ, "QUITQ", ClassLocal, true, OpQuit)
	def(OpFlushQ, "FLUSHQ", ClassOther, true, OpFlush)
	def(OpAppendQ, "APPENDQ", ClassWrite, true, OpAppend)
	def(OpPrependQ, "PREPENDQ", ClassWrite, true, OpPrepend)
	def(OpVerbosity, "VERBOSITY", ClassOther, false, 0)
	def(OpTouch, "TOUCH", ClassRead, false, 0)
	def(OpGAT, "GAT", ClassReadWrite, false, 0)
	def(OpGATQ, "GATQ", ClassReadWrite, true, OpGAT)
	def(OpGATK, "GATK", ClassReadWrite, false, 0)
	def(OpGATKQ, "GATKQ", ClassReadWrite, true, OpGATK)
	for _, l := range []struct {
		op   Opcode
		name string
	}{
		{OpHello, "HELLO"},
		{OpSASLListMechs, "SASL_LIST_MECHS"},
		{OpSASLAuth, "SASL_AUTH"},
		{OpSASLStep, "SASL_STEP"},
		{OpSetBucketThrottleProperties, "SET_BUCKET_THROTTLE_PROPERTIES"},
		{OpSetNodeThrottleProperties, "SET_NODE_THROTTLE_PROPERTIES"},
		{OpSelectBucket, "SELECT_BUCKET"},
	} {
		ops[l.op] = opInfo{name: l.name, loud: l.op, class: ClassLocal}
	}
}

// String returns the opcode's protocol name, or its hex value when unknown.
func (o Opcode) String() string {
	if n := ops[o].name; n != "" {
		return n
	}
	return "0x" + strconv.FormatUint(uint64(o), 16)
}

// Known reports whether o is an opcode this package describes.
func (o Opcode) Known() bool { return ops[o].name != "" }

// Quiet reports whether o is a quiet variant: memcached sends no response on
// its common outcome (a GETQ miss, a SETQ success, ...), only on the others.
func (o Opcode) Quiet() bool { return ops[o].quiet }

// Loud returns the non-quiet twin of a quiet opcode, and o itself otherwise.
func (o Opcode) Loud() Opcode {
	if !o.Known() {
		return o
	}
	return ops[o].loud
}

// Metered reports whether commands of class c are charged in units.
func (c Class) Metered() bool { return c == ClassRead || c == ClassWrite || c == ClassReadWrite }

// Class returns how kvthrottle meters and routes o.
func (o Opcode) Class() Class { return ops[o].class }

// Memcached reports whether a stock memcached server understands o.
func (o Opcode) Memcached() bool { return ops[o].stdMem }

// HasKeyInResponse reports whether o's successful response carries the key
// (GETK, GETKQ, GATK, GATKQ).
func (o Opcode) HasKeyInResponse() bool {
	switch o {
	case OpGetK, OpGetKQ, OpGATK, OpGATKQ:
		return true
	}
	return false
}

// Status is the status field of a response.
type Status uint16

// Response status codes.
const (
	StatusSuccess        Status = 0x00
	StatusKeyEnoent      Status = 0x01
	StatusKeyEexists     Status = 0x02
	StatusE2big          Status = 0x03
	StatusEinval         Status = 0x04
	StatusNotStored      Status = 0x05
	StatusDeltaBadval    Status = 0x06
	StatusNotMyVbucket   Status = 0x07
	StatusNoBucket       Status = 0x08
	StatusEWouldThrottle Status = 0x0c
	StatusAuthError      Status = 0x20
	StatusAuthContinue   Status = 0x21
	StatusErange         Status = 0x22
	StatusEaccess        Status = 0x24
	StatusUnknownCommand Status = 0x81
	StatusEnomem         Status = 0x82
	StatusNotSupported   Status = 0x83
	StatusEinternal      Status = 0x84
	StatusEbusy          Status = 0x85
	StatusEtmpfail       Status = 0x86
)

var statusNames = map[Status]string{
	StatusSuccess:        "Success",
	StatusKeyEnoent:      "KeyEnoent",
	StatusKeyEexists:     "KeyEexists",
	StatusE2big:          "E2big",
	StatusEinval:         "Einval",
	StatusNotStored:      "NotStored",
	StatusDeltaBadval:    "DeltaBadval",
	StatusNotMyVbucket:   "NotMyVbucket",
	StatusNoBucket:       "NoBucket",
	StatusEWouldThrottle: "EWouldThrottle",
	StatusAuthError:      "AuthError",
	StatusAuthContinue:   "AuthContinue",
	StatusErange:         "Erange",
	StatusEaccess:        "Eaccess",
	StatusUnknownCommand: "UnknownCommand",
	StatusEnomem:         "Enomem",
	StatusNotSupported:   "NotSupported",
	StatusEinternal:      "Einternal",
	StatusEbusy:          "Ebusy",
	StatusEtmpfail:       "Etmpfail",
}

// String returns the status's name, or its hex value when unknown.
func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return "0x" + strconv.FormatUint(uint64(s), 16)
}

// Feature is a HELLO feature code.
type Feature uint16

// HELLO features kvthrottle knows about.
const (
	FeatureTCPNoDelay                Feature = 0x03
	FeatureXerror                    Feature = 0x07
	FeatureSelectBucket              Feature = 0x08
	FeatureReportUnitUsage           Feature = 0x1a
	FeatureNonBlockingThrottlingMode Feature = 0x1b
)

// Data types.
const (
	DataTypeRaw    uint8 = 0x00
	DataTypeJSON   uint8 = 0x01
	DataTypeSnappy uint8 = 0x02
	DataTypeXattr  uint8 = 0x04
)
