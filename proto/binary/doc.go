// Package binary is a codec for the memcached binary protocol, including
// Couchbase's flexible framing (magic 0x08/0x18) and the Couchbase opcodes
// kvthrottle answers itself (HELLO, SASL, SelectBucket and the throttle
// admin opcodes).
//
// The package does no I/O. A Frame is a view of bytes owned by the caller
// (typically a gnet inbound buffer): decoding copies nothing, and a Frame is
// valid only as long as those bytes are.
//
// Every frame starts with a 24-byte header:
//
//	byte 0      magic
//	byte 1      opcode
//	bytes 2-3   key length (classic magic), or
//	byte 2      framing extras length and byte 3 key length (flexible magic)
//	byte 4      extras length
//	byte 5      data type
//	bytes 6-7   vbucket (request) or status (response)
//	bytes 8-11  total body length
//	bytes 12-15 opaque
//	bytes 16-23 CAS
//
// The body is framing extras, extras, key and value, in that order.
package binary
