package text

import "math"

// The number parsers below reproduce memcached's safe_strtol, safe_strtoul
// and safe_strtoull (util.c) on a token, which in memcached is a C string
// ending where the token ends. They accept what C's strtol family accepts
// (leading white space, a sign, decimal digits) when the digits are followed
// by white space or the end of the token, and they keep C's integer
// conversions: a 64-bit result stored in a 32-bit field keeps its low bits.

func isCSpace(b byte) bool {
	return b == ' ' || b == '\t' || b == '\n' || b == '\v' || b == '\f' || b == '\r'
}

// scanDecimal is C's strto(u)ll in base 10 on s: it returns the sign, the
// magnitude, whether digits were found, whether the magnitude overflowed
// uint64 and the index just past the digits.
func scanDecimal(s []byte) (neg bool, mag uint64, digits, overflow bool, end int) {
	i := 0
	for i < len(s) && isCSpace(s[i]) {
		i++
	}
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		neg = s[i] == '-'
		i++
	}
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		digits = true
		d := uint64(s[i] - '0')
		if mag > (math.MaxUint64-d)/10 {
			overflow = true
		} else if !overflow {
			mag = mag*10 + d
		}
	}
	return neg, mag, digits, overflow, i
}

// tailOK is safe_strto*'s check that the number ends the token or is
// followed by white space.
func tailOK(s []byte, end int) bool { return end == len(s) || isCSpace(s[end]) }

func hasMinus(s []byte) bool {
	for _, b := range s {
		if b == '-' {
			return true
		}
	}
	return false
}

// parseUint64 is safe_strtoull: "-5" is refused (its value wraps to a
// negative int64), yet a negative number that wraps to a positive one, such
// as "-18446744073709551615", is accepted as C accepts it.
func parseUint64(s []byte) (uint64, bool) {
	neg, mag, digits, overflow, end := scanDecimal(s)
	if !digits || overflow || !tailOK(s, end) {
		return 0, false
	}
	v := mag
	if neg {
		v = -mag
	}
	if int64(v) < 0 && hasMinus(s) {
		return 0, false
	}
	return v, true
}

// parseUint32 is safe_strtoul on a 64-bit system: parseUint64's rules, and
// the low 32 bits of the result.
func parseUint32(s []byte) (uint32, bool) {
	v, ok := parseUint64(s)
	return uint32(v), ok
}

// parseInt32 is safe_strtol on a 64-bit system: a number in int64's range,
// and the low 32 bits of it ("4294967297" is 1).
func parseInt32(s []byte) (int32, bool) {
	neg, mag, digits, overflow, end := scanDecimal(s)
	if !digits || overflow || !tailOK(s, end) {
		return 0, false
	}
	var v int64
	if neg {
		if mag > 1<<63 {
			return 0, false
		}
		v = int64(-mag)
	} else {
		if mag > math.MaxInt64 {
			return 0, false
		}
		v = int64(mag)
	}
	return int32(v), true
}
