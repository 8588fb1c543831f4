package binary

// Helpers the tests of several files share.

// getReq returns a GETK request frame for key.
func getReq(key string, opaque uint32) []byte {
	return AppendFrame(nil, Header{Magic: MagicRequest, Opcode: OpGetK, Opaque: opaque}, nil, nil, []byte(key), nil)
}

// setReq returns a SET request frame of key and value (flags 7, CAS 42).
func setReq(key, value string, opaque uint32) []byte {
	extras := []byte{0, 0, 0, 7, 0, 0, 0, 0} // flags, expiry
	return AppendFrame(nil, Header{Magic: MagicRequest, Opcode: OpSet, Opaque: opaque, CAS: 42}, nil, extras, []byte(key), []byte(value))
}
