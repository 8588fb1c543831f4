package text

// Keys of meta commands with the b flag are base64 (standard alphabet, with
// padding). memcached's decoder (base64.c) is lenient, and these functions
// decode as it does, so that a proxy reads the same key memcached would:
// bytes outside the alphabet are skipped, the count of the others must be a
// positive multiple of 4, and decoding stops after the first group of four
// holding padding ("=" or "=="; more is an error).

const base64Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

const base64Invalid = 0x80

// base64Values maps a byte to its 6-bit value, 0 for '=', base64Invalid for
// bytes memcached skips.
var base64Values = func() (t [256]byte) {
	for i := range t {
		t[i] = base64Invalid
	}
	for i := 0; i < len(base64Alphabet); i++ {
		t[base64Alphabet[i]] = byte(i)
	}
	t['='] = 0
	return t
}()

// base64Decode decodes src as memcached does, appending to dst when out is
// set. It returns the decoded length, and ok false when memcached fails to
// decode src (memcached's decoder then returns 0).
func base64Decode(dst, src []byte, out bool) ([]byte, int, bool) {
	count := 0
	for _, b := range src {
		if base64Values[b] != base64Invalid {
			count++
		}
	}
	if count == 0 || count%4 != 0 {
		return dst, 0, false
	}
	var block [4]byte
	n, k, pad := 0, 0, 0
	for _, b := range src {
		v := base64Values[b]
		if v == base64Invalid {
			continue
		}
		if b == '=' {
			pad++
		}
		block[k] = v
		k++
		if k < 4 {
			continue
		}
		k = 0
		keep := 3
		if pad > 0 {
			if pad > 2 {
				return dst, 0, false
			}
			keep -= pad
		}
		if out {
			o := [3]byte{block[0]<<2 | block[1]>>4, block[1]<<4 | block[2]>>2, block[2]<<6 | block[3]}
			dst = append(dst, o[:keep]...)
		}
		n += keep
		if pad > 0 {
			break
		}
	}
	return dst, n, true
}

// Base64DecodedLen returns the length of the key memcached decodes from
// src, and false when memcached cannot decode it (it then answers a meta
// command with "CLIENT_ERROR error decoding key", or for md and ma
// "CLIENT_ERROR invalid or duplicate flag").
func Base64DecodedLen(src []byte) (int, bool) {
	_, n, ok := base64Decode(nil, src, false)
	return n, ok
}

// DecodeBase64 appends the key memcached decodes from src to dst and
// returns the extended slice; ok is false (and dst unchanged) when memcached
// cannot decode src. It allocates only if dst lacks the capacity.
func DecodeBase64(dst, src []byte) (out []byte, ok bool) {
	n0 := len(dst)
	out, _, ok = base64Decode(dst, src, true)
	if !ok {
		return out[:n0], false
	}
	return out, true
}

// Base64EncodedLen returns the length of the standard, padded base64 of n
// bytes.
func Base64EncodedLen(n int) int { return (n + 2) / 3 * 4 }

// AppendBase64 appends the standard, padded base64 of src to dst, as
// memcached encodes a binary key it returns (the k flag with b), and
// returns the extended slice. It allocates only if dst lacks the capacity.
func AppendBase64(dst, src []byte) []byte {
	for len(src) >= 3 {
		dst = append(dst,
			base64Alphabet[src[0]>>2],
			base64Alphabet[(src[0]&0x03)<<4|src[1]>>4],
			base64Alphabet[(src[1]&0x0f)<<2|src[2]>>6],
			base64Alphabet[src[2]&0x3f])
		src = src[3:]
	}
	switch len(src) {
	case 1:
		dst = append(dst, base64Alphabet[src[0]>>2], base64Alphabet[(src[0]&0x03)<<4], '=', '=')
	case 2:
		dst = append(dst, base64Alphabet[src[0]>>2], base64Alphabet[(src[0]&0x03)<<4|src[1]>>4],
			base64Alphabet[(src[1]&0x0f)<<2], '=')
	}
	return dst
}
