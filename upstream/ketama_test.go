package upstream

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The golden files in testdata/ketama hold, for a server list, the server
// libmemcached 1.1.4 itself picks for each key: they were produced by a
// throwaway C program (not in the repository) that builds a memcached_st,
// sets MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED to 1, adds the servers in order
// with memcached_server_add_with_weight and prints
// memcached_generate_hash(memc, key, len) for each key. See the header of
// each file.

type ketamaGolden struct {
	servers []Server
	keys    [][]byte
	want    []int
}

func loadKetamaGolden(t *testing.T, path string) ketamaGolden {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var g ketamaGolden
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		switch {
		case text == "" || strings.HasPrefix(text, "#"):
		case strings.HasPrefix(text, "server "):
			fields := strings.Fields(text)
			if len(fields) != 3 {
				t.Fatalf("%s:%d: bad server line %q", path, line, text)
			}
			w, err := strconv.Atoi(fields[2])
			if err != nil {
				t.Fatalf("%s:%d: %v", path, line, err)
			}
			g.servers = append(g.servers, Server{Addr: fields[1], Weight: w})
		default:
			idx, quoted, ok := strings.Cut(text, " ")
			if !ok {
				t.Fatalf("%s:%d: bad key line %q", path, line, text)
			}
			want, err := strconv.Atoi(idx)
			if err != nil {
				t.Fatalf("%s:%d: %v", path, line, err)
			}
			key, err := strconv.Unquote(quoted)
			if err != nil {
				t.Fatalf("%s:%d: key %s: %v", path, line, quoted, err)
			}
			g.keys = append(g.keys, []byte(key))
			g.want = append(g.want, want)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(g.servers) == 0 || len(g.keys) == 0 {
		t.Fatalf("%s: no servers or no keys", path)
	}
	return g
}

func mustRing(t testing.TB, servers []Server) *Ring {
	t.Helper()
	r, err := NewRing(servers)
	if err != nil {
		t.Fatalf("NewRing(%v): %v", servers, err)
	}
	return r
}

func equalServers(n int) []Server {
	s := make([]Server, n)
	for i := range s {
		s[i] = Server{Addr: fmt.Sprintf("127.0.0.1:%d", 11212+i), Weight: 1}
	}
	return s
}

func allAlive(n int) []bool {
	a := make([]bool, n)
	for i := range a {
		a[i] = true
	}
	return a
}

func ketamaKeys(n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "user:%d:session", i)
	}
	return keys
}

func TestKetamaGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "ketama", "*.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no golden files in testdata/ketama")
	}
	for _, path := range files {
		t.Run(filepath.Base(path), func(t *testing.T) {
			g := loadKetamaGolden(t, path)
			r := mustRing(t, g.servers)
			alive := allAlive(len(g.servers))
			bad := 0
			for i, key := range g.keys {
				if got := r.Pick(key); got != g.want[i] {
					bad++
					if bad <= 10 {
						t.Errorf("Pick(%q) = %d, libmemcached says %d", key, got, g.want[i])
					}
				}
				if got := r.PickExcluding(key, alive); got != g.want[i] {
					t.Errorf("PickExcluding(%q, all alive) = %d, want %d", key, got, g.want[i])
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d keys on the wrong server", bad, len(g.keys))
			}
		})
	}
}

func TestKetamaPoints(t *testing.T) {
	cases := []struct {
		name    string
		servers []Server
		want    []int
	}{
		{"one", equalServers(1), []int{160}},
		{"three equal", equalServers(3), []int{160, 160, 160}},
		{"weights 1:2:3", []Server{{"a:1", 1}, {"b:1", 2}, {"c:1", 3}}, []int{80, 160, 240}},
		{"weight 0 is 1", []Server{{"a:1", 0}, {"b:1", 1}}, []int{160, 160}},
		// 1/1001*40*2 < 1: libmemcached gives the small server no point;
		// 1000/1001*40*2 = 79.92 is floored to 79 digests.
		{"tiny weight", []Server{{"a:1", 1}, {"b:1", 1000}}, []int{0, 316}},
	}
	for _, c := range cases {
		r := mustRing(t, c.servers)
		if r.Len() != len(c.servers) {
			t.Errorf("%s: Len() = %d, want %d", c.name, r.Len(), len(c.servers))
		}
		for i, want := range c.want {
			if got := r.Points(i); got != want {
				t.Errorf("%s: Points(%d) = %d, want %d", c.name, i, got, want)
			}
		}
	}

	// With 25 equal servers libmemcached's float32 arithmetic gives
	// 39.999996 virtual digests, floored to 39: 156 points each (the golden
	// file twentyfive_equal.txt checks the effect on real keys).
	r := mustRing(t, equalServers(25))
	for i := 0; i < 25; i++ {
		if got := r.Points(i); got != 156 {
			t.Fatalf("25 equal servers: Points(%d) = %d, want 156", i, got)
		}
	}
	if len(r.points) != 25*156 {
		t.Fatalf("25 equal servers: %d points on the continuum, want %d", len(r.points), 25*156)
	}
	for i := 1; i < len(r.points); i++ {
		if r.points[i-1] > r.points[i] {
			t.Fatalf("continuum not sorted at %d", i)
		}
	}
}

func TestKetamaSingleServer(t *testing.T) {
	r := mustRing(t, []Server{{Addr: "localhost:11211"}})
	for _, key := range ketamaKeys(1000) {
		if got := r.Pick(key); got != 0 {
			t.Fatalf("Pick(%q) = %d with one server", key, got)
		}
	}
	if got := r.PickExcluding([]byte("k"), []bool{false}); got != -1 {
		t.Fatalf("PickExcluding with the only server dead = %d, want -1", got)
	}
}

func TestKetamaZeroWeightIsOne(t *testing.T) {
	a := mustRing(t, []Server{{"a:11211", 0}, {"b:11211", 0}, {"c:11211", 2}})
	b := mustRing(t, []Server{{"a:11211", 1}, {"b:11211", 1}, {"c:11211", 2}})
	for _, key := range ketamaKeys(5000) {
		if a.Pick(key) != b.Pick(key) {
			t.Fatalf("Pick(%q) differs between weight 0 and weight 1", key)
		}
	}
}

func TestKetamaNewRingErrors(t *testing.T) {
	cases := []struct {
		name    string
		servers []Server
	}{
		{"nil list", nil},
		{"empty list", []Server{}},
		{"empty addr", []Server{{Addr: ""}}},
		{"no port", []Server{{Addr: "cache1"}}},
		{"empty port", []Server{{Addr: "cache1:"}}},
		{"empty host", []Server{{Addr: ":11211"}}},
		{"port 0", []Server{{Addr: "cache1:0"}}},
		{"port too big", []Server{{Addr: "cache1:65536"}}},
		{"port not a number", []Server{{Addr: "cache1:memcache"}}},
		{"negative port", []Server{{Addr: "cache1:-1"}}},
		{"unbracketed IPv6", []Server{{Addr: "::1:11211"}}},
		{"negative weight", []Server{{Addr: "cache1:11211", Weight: -1}}},
		{"weight above uint32", []Server{{Addr: "cache1:11211", Weight: int(^uint(0) >> 1)}}},
		{"duplicate", []Server{{Addr: "cache1:11211"}, {Addr: "cache2:11211"}, {Addr: "cache1:11211"}}},
		{"duplicate port spelling", []Server{{Addr: "cache1:11211"}, {Addr: "cache1:011211"}}},
	}
	for _, c := range cases {
		if c.name == "weight above uint32" && strconv.IntSize < 64 {
			continue // an int cannot exceed libmemcached's limit
		}
		r, err := NewRing(c.servers)
		if err == nil {
			t.Errorf("%s: NewRing(%v) = %v, want an error", c.name, c.servers, r)
		}
	}

	// Distinct spellings of a host are distinct servers, as in libmemcached.
	if _, err := NewRing([]Server{{Addr: "localhost:11211"}, {Addr: "127.0.0.1:11211"}, {Addr: "localhost:11212"}}); err != nil {
		t.Errorf("distinct servers rejected: %v", err)
	}
	if _, err := NewRing([]Server{{Addr: "[::1]:11211"}, {Addr: "[::1]:11212", Weight: 1<<31 - 1}}); err != nil {
		t.Errorf("IPv6 servers rejected: %v", err)
	}
}

func TestKetamaDistribution(t *testing.T) {
	const n = 30000
	keys := ketamaKeys(n)

	r := mustRing(t, equalServers(3))
	counts := make([]int, 3)
	for _, key := range keys {
		counts[r.Pick(key)]++
	}
	for i, c := range counts {
		share := float64(c) / n
		if share < 1.0/3-0.05 || share > 1.0/3+0.05 {
			t.Errorf("3 equal servers: server %d got %.1f%% of the keys, want 33.3%% +- 5%% (counts %v)", i, 100*share, counts)
		}
	}

	r = mustRing(t, []Server{{"127.0.0.1:11212", 2}, {"127.0.0.1:11213", 1}})
	counts = make([]int, 2)
	for _, key := range keys {
		counts[r.Pick(key)]++
	}
	ratio := float64(counts[0]) / float64(counts[1])
	if ratio < 1.7 || ratio > 2.3 {
		t.Errorf("weights 2:1: keys split %v, ratio %.2f, want about 2", counts, ratio)
	}
}

func TestKetamaStability(t *testing.T) {
	keys := ketamaKeys(20000)
	for _, servers := range [][]Server{
		equalServers(3),
		equalServers(5),
		{{"a:11211", 1}, {"b:11211", 3}, {"c:11211", 2}, {"d:11212", 1}},
	} {
		r := mustRing(t, servers)
		before := make([]int, len(keys))
		for i, key := range keys {
			before[i] = r.Pick(key)
		}
		for dead := range servers {
			alive := allAlive(len(servers))
			alive[dead] = false
			movedTo := make([]int, len(servers))
			for i, key := range keys {
				got := r.PickExcluding(key, alive)
				switch {
				case before[i] != dead && got != before[i]:
					t.Fatalf("%d servers, %d dead: key %q moved from live server %d to %d", len(servers), dead, key, before[i], got)
				case before[i] == dead && (got < 0 || got == dead):
					t.Fatalf("%d servers, %d dead: key %q of the dead server went to %d", len(servers), dead, key, got)
				case before[i] == dead:
					movedTo[got]++
				}
			}
			// The dead server's keys spread over all the live ones.
			for s, c := range movedTo {
				if s != dead && c == 0 {
					t.Errorf("%d servers, %d dead: no key moved to live server %d (%v)", len(servers), dead, s, movedTo)
				}
			}
		}
	}
}

// With equal weights, ejecting a server must give what libmemcached's own
// ejection does: a continuum rebuilt without it (the remaining servers keep
// their 160 points and their order).
func TestKetamaExcludingMatchesRebuild(t *testing.T) {
	servers := equalServers(4)
	r := mustRing(t, servers)
	keys := ketamaKeys(20000)
	for dead := range servers {
		alive := allAlive(len(servers))
		alive[dead] = false
		var rest []Server
		var index []int // index[j] is the original index of rest[j]
		for i, s := range servers {
			if i != dead {
				rest = append(rest, s)
				index = append(index, i)
			}
		}
		rebuilt := mustRing(t, rest)
		for _, key := range keys {
			if got, want := r.PickExcluding(key, alive), index[rebuilt.Pick(key)]; got != want {
				t.Fatalf("server %d dead: PickExcluding(%q) = %d, rebuilt ring says %d", dead, key, got, want)
			}
		}
	}
}

func TestKetamaPickExcludingDeadAndShortSlices(t *testing.T) {
	r := mustRing(t, equalServers(3))
	keys := ketamaKeys(3000)
	for _, key := range keys {
		if got := r.PickExcluding(key, []bool{false, false, false}); got != -1 {
			t.Fatalf("none alive: PickExcluding(%q) = %d, want -1", key, got)
		}
		if got := r.PickExcluding(key, nil); got != -1 {
			t.Fatalf("nil alive: PickExcluding(%q) = %d, want -1", key, got)
		}
		// Servers past the end of alive count as dead.
		if got := r.PickExcluding(key, []bool{true}); got != 0 {
			t.Fatalf("alive = [true]: PickExcluding(%q) = %d, want 0", key, got)
		}
		if got := r.PickExcluding(key, []bool{false, false, true, true}); got != 2 {
			t.Fatalf("only server 2 alive: PickExcluding(%q) = %d, want 2", key, got)
		}
	}

	// A live server that owns no point cannot take keys.
	r = mustRing(t, []Server{{"small:11211", 1}, {"big:11211", 1000}})
	if got := r.PickExcluding([]byte("k"), []bool{true, false}); got != -1 {
		t.Fatalf("only a pointless server alive: PickExcluding = %d, want -1", got)
	}
}

func TestKetamaNoAllocs(t *testing.T) {
	r := mustRing(t, equalServers(3))
	key := []byte("some:key:1234")
	alive := []bool{true, false, true}
	if n := testing.AllocsPerRun(1000, func() { r.Pick(key) }); n != 0 {
		t.Errorf("Pick allocates %v times per call", n)
	}
	if n := testing.AllocsPerRun(1000, func() { r.PickExcluding(key, alive) }); n != 0 {
		t.Errorf("PickExcluding allocates %v times per call", n)
	}
}

func BenchmarkKetamaPick(b *testing.B) {
	for _, n := range []int{3, 25} {
		b.Run(fmt.Sprintf("servers=%d", n), func(b *testing.B) {
			r := mustRing(b, equalServers(n))
			keys := ketamaKeys(1024)
			b.ReportAllocs()
			sink := 0
			for i := 0; b.Loop(); i++ {
				sink += r.Pick(keys[i&1023])
			}
			_ = sink
		})
	}
}

func BenchmarkKetamaPickExcluding(b *testing.B) {
	r := mustRing(b, equalServers(3))
	keys := ketamaKeys(1024)
	alive := []bool{true, false, true}
	b.ReportAllocs()
	sink := 0
	for i := 0; b.Loop(); i++ {
		sink += r.PickExcluding(keys[i&1023], alive)
	}
	_ = sink
}
