package upstream

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
)

// ketamaPointsPerServer is MEMCACHED_POINTS_PER_SERVER_KETAMA: the average
// number of continuum points per server in weighted ketama.
const ketamaPointsPerServer = 160

// ketamaDefaultPort is the port libmemcached leaves out of point names.
const ketamaDefaultPort = 11211

// Server is one memcached server on a Ring and its weight.
//
// Addr is "host:port" (an IPv6 host in brackets, "[::1]:11211"); the port is
// required and must be 1..65535. The host is used as written, without name
// resolution, to name the server's points, so it must be spelt as the
// clients whose distribution is to be kept spelt it. Weight is relative to
// the other servers' weights; 0 means 1, negative values are rejected.
type Server struct {
	Addr   string
	Weight int
}

// Ring is an immutable ketama continuum over a list of servers, bit-compatible
// with libmemcached's weighted ketama. Build one with NewRing; the zero Ring
// is not usable. It is safe for concurrent use by any number of goroutines
// once NewRing has returned.
//
// Variant implemented: what libmemcached (1.0.x and libmemcached-awesome
// 1.1.x) builds after
//
//	memcached_behavior_set(memc, MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED, 1)
//
// which sets the key hash and the distribution hash to MD5 and the
// distribution to MEMCACHED_DISTRIBUTION_CONSISTENT_WEIGHTED. The same
// continuum results from MEMCACHED_BEHAVIOR_DISTRIBUTION =
// MEMCACHED_DISTRIBUTION_CONSISTENT_WEIGHTED with MEMCACHED_BEHAVIOR_HASH =
// MEMCACHED_HASH_MD5. It follows the scheme of last.fm's libketama (160
// points per server on average, 4 points per MD5 digest), but only
// libmemcached's exact rules below are implemented and tested; libketama
// itself names points "host:port-k" even for port 11211.
//
// The continuum (libmemcached src/libmemcached/hosts.cc, update_continuum):
//
//   - every server i gets floor(w_i/W * 160/4 * n + 1e-10) * 4
//     points, computed in float32 exactly as the C code does, where w_i is
//     its weight, W the sum of the weights and n the number of servers; with
//     equal weights that is 160 points each (156 for a few server counts where
//     float32 rounding lands just under 40);
//   - the points of server i come from the MD5 digests of the strings
//     "host:port-k" for k = 0 .. points/4-1, or "host-k" when the port
//     is 11211 (memcached's default port); host is the host part of Addr
//     exactly as written (not resolved, not lower-cased, an IPv6 address
//     without its brackets), as libmemcached keeps the host name it was given;
//   - each 16-byte digest gives 4 points: bytes 4j..4j+3 read as a
//     little-endian uint32, j = 0..3;
//   - points are sorted by value, ties broken by the lower server index.
//
// A key is hashed with MD5 too, its value being the first 4 digest bytes as a
// little-endian uint32. It belongs to the server of the first point whose
// value is >= the key's value, wrapping around to the first point.
//
// Not implemented: MEMCACHED_DISTRIBUTION_CONSISTENT_KETAMA without the
// weighted flag (100 points per server, one point per hash of "host:port-k",
// both hashed with MEMCACHED_BEHAVIOR_HASH, which defaults to one-at-a-time),
// the spymemcached variant (CONSISTENT_KETAMA_SPY), and MODULA, which is the
// library default and so what libmemcached-tools' memcp/memcat use: those
// tools have a --hash option but no way to pick a consistent distribution.
// MEMCACHED_BEHAVIOR_SORT_HOSTS (off by default) is not modelled: list the
// servers in the order the clients did.
type Ring struct {
	points []uint32 // point values, ascending
	owner  []int32  // owner[i] is the server index of points[i]
	counts []int    // counts[s] is the number of points of server s
}

// NewRing builds the ketama continuum of servers, as described
// on Ring (libmemcached's weighted ketama). Server indexes
// returned by Pick and PickExcluding are indexes into servers. It returns an
// error when servers is empty, when an Addr is not "host:port" with a port in
// 1..65535, when a Weight is negative or above 2^32-1 (libmemcached's
// limit), or when two servers have the same Addr (same host spelling and
// same port).
//
// A server whose weight is below about 1/(40*len(servers)) of the total gets
// no point at all, as in libmemcached; Points reports that.
func NewRing(servers []Server) (*Ring, error) {
	if len(servers) == 0 {
		return nil, errors.New("ketama: empty server list")
	}
	if len(servers) > math.MaxInt32 {
		return nil, errors.New("ketama: too many servers")
	}
	hosts := make([]string, len(servers))
	ports := make([]uint16, len(servers))
	weights := make([]uint64, len(servers))
	seen := make(map[string]int, len(servers))
	var total uint64
	for i, s := range servers {
		host, portStr, err := net.SplitHostPort(s.Addr)
		if err != nil {
			return nil, fmt.Errorf("ketama: server %d: bad address %q: %v", i, s.Addr, err)
		}
		if host == "" {
			return nil, fmt.Errorf("ketama: server %d: bad address %q: empty host", i, s.Addr)
		}
		port, err := strconv.ParseUint(portStr, 10, 16)
		if err != nil || port == 0 {
			return nil, fmt.Errorf("ketama: server %d: bad address %q: port must be 1..65535", i, s.Addr)
		}
		key := net.JoinHostPort(host, strconv.FormatUint(port, 10))
		if j, dup := seen[key]; dup {
			return nil, fmt.Errorf("ketama: servers %d and %d have the same address %q", j, i, key)
		}
		seen[key] = i
		if s.Weight < 0 || uint64(s.Weight) > math.MaxUint32 {
			return nil, fmt.Errorf("ketama: server %d (%s): weight %d out of range 0..%d", i, s.Addr, s.Weight, uint64(math.MaxUint32))
		}
		w := uint64(s.Weight)
		if w == 0 {
			w = 1
		}
		hosts[i], ports[i], weights[i] = host, uint16(port), w
		total += w
	}

	r := &Ring{counts: make([]int, len(servers))}
	for i := range servers {
		r.counts[i] = ketamaPoints(weights[i], total, len(servers))
	}
	n := 0
	for _, c := range r.counts {
		n += c
	}
	type point struct {
		value uint32
		owner int32
	}
	pts := make([]point, 0, n)
	name := make([]byte, 0, 64)
	for i := range servers {
		for k := 0; k < r.counts[i]/4; k++ {
			name = append(name[:0], hosts[i]...)
			if ports[i] != ketamaDefaultPort {
				name = append(name, ':')
				name = strconv.AppendUint(name, uint64(ports[i]), 10)
			}
			name = append(name, '-')
			name = strconv.AppendInt(name, int64(k), 10)
			sum := md5.Sum(name)
			for j := 0; j < 4; j++ {
				pts = append(pts, point{binary.LittleEndian.Uint32(sum[4*j:]), int32(i)})
			}
		}
	}
	slices.SortFunc(pts, func(a, b point) int {
		switch {
		case a.value < b.value:
			return -1
		case a.value > b.value:
			return 1
		}
		return int(a.owner) - int(b.owner)
	})
	r.points = make([]uint32, len(pts))
	r.owner = make([]int32, len(pts))
	for i, p := range pts {
		r.points[i], r.owner[i] = p.value, p.owner
	}
	return r, nil
}

// ketamaPoints returns the number of continuum points libmemcached gives a
// server of weight w out of a total weight total among n servers. The float32
// steps mirror the C expression
//
//	floor((float)(pct * 160 / 4 * (float)n + 0.0000000001F)) * 4
//
// with pct = (float)w / (float)total; the explicit conversions round every
// step to float32 and keep the compiler from fusing operations.
func ketamaPoints(w, total uint64, n int) int {
	pct := float32(w) / float32(total)
	v := float32(pct * ketamaPointsPerServer)
	v = float32(v / 4)
	v = float32(v * float32(n))
	v = float32(v + float32(1e-10))
	return int(math.Floor(float64(v))) * 4
}

// Len returns the number of servers the ring was built with.
func (r *Ring) Len() int { return len(r.counts) }

// Points returns the number of continuum points of server i (an index into
// the slice given to NewRing): 160 on average, proportionally to its weight,
// always a multiple of 4, and 0 for a server whose weight is too small to
// receive any key. It panics if i is out of range.
func (r *Ring) Points(i int) int { return r.counts[i] }

// keyHash is libmemcached's MD5 key hash: the first four bytes of the MD5
// digest of key, little-endian.
func keyHash(key []byte) uint32 {
	sum := md5.Sum(key)
	return binary.LittleEndian.Uint32(sum[:4])
}

// search returns the index of the first point >= h, or 0 (wrapping around)
// when there is none.
func (r *Ring) search(h uint32) int {
	lo, hi := 0, len(r.points)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r.points[m] < h {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == len(r.points) {
		return 0
	}
	return lo
}

// Pick returns the index, into the servers slice given to NewRing, of the
// server that owns key: the same server libmemcached's
// memcached_generate_hash returns for key under weighted ketama with the
// same server list. Any byte string is a valid key, the empty one included.
// Pick does not allocate and is safe for concurrent use.
func (r *Ring) Pick(key []byte) int {
	return int(r.owner[r.search(keyHash(key))])
}

// PickExcluding returns the server for key when the servers i with
// alive[i] == false are ejected: the owner of the first point, from key's
// position on the continuum onwards (wrapping around), whose server is
// alive. Keys of live servers therefore never move, and the keys of a dead
// server spread over the live ones in proportion to their points. A server
// whose index is not below len(alive) counts as dead. PickExcluding returns
// -1 when no live server owns a point (in particular when none is alive).
// When every server is alive it returns what Pick returns. It does not
// allocate and is safe for concurrent use.
//
// libmemcached's own ejection (MEMCACHED_BEHAVIOR_REMOVE_FAILED_SERVERS)
// instead rebuilds the continuum without the dead servers; with equal
// weights that gives the same answer except for server counts where the
// float32 rounding of the point count changes, and with unequal weights the live
// servers' point counts are recomputed, so some of their keys move there.
func (r *Ring) PickExcluding(key []byte, alive []bool) int {
	start := r.search(keyHash(key))
	for i := start; i < len(r.owner); i++ {
		if o := r.owner[i]; int(o) < len(alive) && alive[o] {
			return int(o)
		}
	}
	for i := 0; i < start; i++ {
		if o := r.owner[i]; int(o) < len(alive) && alive[o] {
			return int(o)
		}
	}
	return -1
}
