package throttle

// DefaultUnitSize is the default read and write unit size in bytes.
const DefaultUnitSize = 4096

// Units returns ceil(bytes/unitSize), at least 1: every metered command costs
// at least one unit, also on a miss or a failure. A negative bytes counts as
// 0; a unitSize <= 0 selects DefaultUnitSize.
func Units(bytes, unitSize int64) int64 {
	if unitSize <= 0 {
		unitSize = DefaultUnitSize
	}
	if bytes <= 0 {
		return 1
	}
	u := bytes / unitSize
	if bytes%unitSize != 0 {
		u++
	}
	return u
}

// ReadUnits returns the units of a read: bytes is the key plus the value
// returned (GET, GETQ, GETK, GETKQ, TOUCH, GAT, GATQ). See [Units].
func ReadUnits(bytes, readUnitSize int64) int64 { return Units(bytes, readUnitSize) }

// WriteUnits returns the units of a write: bytes is the key plus the value
// sent (SET, ADD, REPLACE, APPEND, PREPEND, INCR, DECR, DELETE and their
// quiet variants). GAT is charged both. See [Units].
func WriteUnits(bytes, writeUnitSize int64) int64 { return Units(bytes, writeUnitSize) }
