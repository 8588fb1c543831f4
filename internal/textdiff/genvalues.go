package textdiff

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"sync"
)

// value returns data for key: counters for numeric keys, huge values for
// big keys now and then, small values (binary ones sometimes) otherwise.
func (g *gen) value(key string) []byte {
	for _, k := range numKeys {
		if k == key && !g.chance(8) {
			// No counter reaches 2^63: memcached 1.6's safe_strtoull
			// looks for a '-' in such a number with strchr, which reads
			// on past the value into whatever bytes follow it in slab
			// memory, so whether incr calls the value numeric is chance.
			return []byte(pick(g.r, []string{"0", "1", "42", "99", "100", "4611686018427387904",
				"4611686018427387903", "007", "12a", strconv.Itoa(g.r.IntN(1 << 30))}))
		}
	}
	if !g.o.NoHuge {
		for _, k := range bigKeys {
			if k == key && g.chance(6) {
				return g.shared(100<<10+g.r.IntN(g.o.HugeMax-100<<10+1), true)
			}
		}
	}
	n := g.r.IntN(64)
	if g.chance(20) {
		n = 64 + g.r.IntN(4096)
	}
	return g.shared(n, g.chance(5))
}

// affix returns the data to append or prepend to key: for a counter,
// letters (after a space, now and then), so that no concatenation makes a
// number of 2^63 or more (see value).
func (g *gen) affix(key string, data []byte) []byte {
	for _, k := range numKeys {
		if k == key {
			b := g.bytes(1+g.r.IntN(8), false)
			if g.chance(3) {
				b[0] = ' '
			}
			return b
		}
	}
	return data
}

// pools of random letters and random bytes that values are cut from
// (cheaper than drawing every byte), made once from a fixed seed.
var (
	poolOnce            sync.Once
	letterPool, binPool []byte
)

const poolSize = 2 << 20

func pools() ([]byte, []byte) {
	poolOnce.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		letterPool, binPool = make([]byte, poolSize), make([]byte, poolSize)
		for i := range letterPool {
			letterPool[i] = 'a' + byte(r.IntN(26))
		}
		for i := 0; i < poolSize; i += 8 {
			binary.LittleEndian.PutUint64(binPool[i:], r.Uint64())
		}
	})
	return letterPool, binPool
}

// bytes returns n new bytes: any byte values if bin, letters otherwise.
func (g *gen) bytes(n int, bin bool) []byte {
	pool, bp := pools()
	if bin {
		pool = bp
	}
	b := make([]byte, n)
	off := g.r.IntN(len(pool))
	for i := 0; i < n; {
		k := copy(b[i:], pool[off:])
		i += k
		off = 0
	}
	return b
}

// shared is bytes, but its result may be a piece of a pool, which nobody
// may modify.
func (g *gen) shared(n int, bin bool) []byte {
	pool, bp := pools()
	if bin {
		pool = bp
	}
	if n > len(pool) {
		return g.bytes(n, bin)
	}
	off := g.r.IntN(len(pool) - n + 1)
	return pool[off : off+n : off+n]
}

// safeData returns n (at least 1) bytes that memcached, should it read
// them as a command line rather than data, answers with a single ERROR.
func (g *gen) safeData(n int) []byte {
	if n < 1 {
		n = 1
	}
	b := g.bytes(n, false)
	b[0] = 'z'
	return b
}
