package binary

import (
	"errors"
	"fmt"
)

// ErrMalformedRequest is wrapped by ValidateRequest's errors.
var ErrMalformedRequest = errors.New("malformed request")

type shape struct {
	extras    int8 // required extras length; -1: any
	key       int8 // 1: required, 0: forbidden, -1: optional
	value     int8 // 1: allowed, 0: forbidden
	extrasAlt int8 // a second accepted extras length; -1: none
}

// requestShapes are the body layouts memcached accepts per opcode. A
// request that does not fit makes memcached answer Einval and close its
// connection, which on a shared upstream connection would fail every other
// client's requests in flight; the proxy refuses such requests itself.
var requestShapes = func() map[Opcode]shape {
	m := map[Opcode]shape{}
	set := func(s shape, ops ...Opcode) {
		for _, op := range ops {
			m[op] = s
		}
	}
	set(shape{extras: 0, key: 1, value: 0, extrasAlt: -1}, OpGet, OpGetQ, OpGetK, OpGetKQ, OpDelete, OpDeleteQ)
	set(shape{extras: 8, key: 1, value: 1, extrasAlt: -1}, OpSet, OpSetQ, OpAdd, OpAddQ, OpReplace, OpReplaceQ)
	set(shape{extras: 0, key: 1, value: 1, extrasAlt: -1}, OpAppend, OpAppendQ, OpPrepend, OpPrependQ)
	set(shape{extras: 20, key: 1, value: 0, extrasAlt: -1}, OpIncrement, OpIncrementQ, OpDecrement, OpDecrementQ)
	set(shape{extras: 4, key: 1, value: 0, extrasAlt: -1}, OpTouch, OpGAT, OpGATQ, OpGATK, OpGATKQ)
	set(shape{extras: 0, key: 0, value: 0, extrasAlt: -1}, OpNoop, OpVersion, OpQuit, OpQuitQ)
	set(shape{extras: 0, key: 0, value: 0, extrasAlt: 4}, OpFlush, OpFlushQ)
	set(shape{extras: 0, key: -1, value: 0, extrasAlt: -1}, OpStat)
	set(shape{extras: 4, key: 0, value: 0, extrasAlt: -1}, OpVerbosity)
	return m
}()

// ValidateRequest checks that a request to a standard memcached opcode has
// the extras, key and value memcached requires (memcached's own checks),
// so that forwarding it cannot make memcached close the connection.
// Opcodes it does not describe pass. The error says what is wrong.
func ValidateRequest(f *Frame) error {
	sh, ok := requestShapes[f.Opcode]
	if !ok {
		return nil
	}
	switch {
	case int(f.ExtLen) != int(sh.extras) && int(f.ExtLen) != int(sh.extrasAlt):
		return fmt.Errorf("%w: %s: extras of %d bytes", ErrMalformedRequest, f.Opcode, f.ExtLen)
	case sh.key == 1 && f.KeyLen == 0:
		return fmt.Errorf("%w: %s needs a key", ErrMalformedRequest, f.Opcode)
	case sh.key == 0 && f.KeyLen != 0:
		return fmt.Errorf("%w: %s takes no key", ErrMalformedRequest, f.Opcode)
	case sh.value == 0 && f.ValueLen() != 0:
		return fmt.Errorf("%w: %s takes no value", ErrMalformedRequest, f.Opcode)
	}
	return nil
}
