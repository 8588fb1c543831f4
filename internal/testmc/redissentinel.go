package testmc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisSentinel is a Redis primary, its replica and three sentinels
// monitoring them, started for a test by StartRedisSentinel.
type RedisSentinel struct {
	// Master is the name the sentinels monitor the primary under.
	Master string
	// Data are the primary (first, as started) and the replica.
	Data []*Redis
	// Sentinels are the three sentinels (quorum 2).
	Sentinels []*Redis

	down time.Duration // down-after-milliseconds
}

// StartRedisSentinel starts a primary, a replica of it and three sentinels
// (quorum 2, down-after-milliseconds down, failover-timeout 5 s), each on a
// free loopback port without persistence, and waits until the replica has
// synchronised and every sentinel knows the replica and the other
// sentinels. The processes are stopped when the test ends.
func StartRedisSentinel(t testing.TB, down time.Duration) *RedisSentinel {
	t.Helper()
	s := &RedisSentinel{Master: "kvthrottle", down: down}
	primary := &Redis{Addr: FreeAddr(t), dir: t.TempDir()}
	t.Cleanup(primary.Stop)
	primary.start(t)
	host, port := splitAddr(primary.Addr)
	replica := &Redis{Addr: FreeAddr(t), dir: t.TempDir(), args: []string{"--replicaof", host, port, "--repl-diskless-sync-delay", "0"}}
	t.Cleanup(replica.Stop)
	replica.start(t)
	s.Data = []*Redis{primary, replica}
	for range 3 {
		r := &Redis{Addr: FreeAddr(t), dir: t.TempDir(), args: []string{"--sentinel"}}
		r.conf = filepath.Join(r.dir, "sentinel.conf")
		conf := fmt.Sprintf("sentinel monitor %s %s %s 2\nsentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 5000\n",
			s.Master, host, port, s.Master, down.Milliseconds(), s.Master)
		if err := os.WriteFile(r.conf, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.Stop)
		r.start(t)
		s.Sentinels = append(s.Sentinels, r)
	}
	if err := s.WaitSettled(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// WaitSettled waits until the replica (Data[1]) has synchronised with its
// primary and every sentinel counts one replica and two other sentinels,
// or returns an error after timeout.
func (s *RedisSentinel) WaitSettled(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !s.settled() {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis sentinel: the replica did not synchronise or the sentinels did not find each other within %v", timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

func splitAddr(addr string) (host, port string) {
	i := strings.LastIndexByte(addr, ':')
	return addr[:i], addr[i+1:]
}

// settled reports whether the replica is synchronised and every sentinel
// counts one replica and two other sentinels.
func (s *RedisSentinel) settled() bool {
	info, err := Cli(s.Data[1].Addr, "info", "replication")
	if err != nil || !strings.Contains(info, "master_link_status:up") {
		return false
	}
	for _, sn := range s.Sentinels {
		out, err := Cli(sn.Addr, "sentinel", "master", s.Master)
		if err != nil || !strings.Contains(out, "num-slaves\n1") || !strings.Contains(out, "num-other-sentinels\n2") {
			return false
		}
	}
	return true
}

// URL returns the go-redis URL of the fleet's store through the sentinels:
// "redis://s1?master_name=NAME&addr=s2&addr=s3".
func (s *RedisSentinel) URL() string {
	return fmt.Sprintf("redis://%s?master_name=%s&addr=%s&addr=%s", s.Sentinels[0].Addr, s.Master, s.Sentinels[1].Addr, s.Sentinels[2].Addr)
}

// Primary returns the data node every live sentinel names as the primary,
// or nil while they disagree or name none of them.
func (s *RedisSentinel) Primary() *Redis {
	var named string
	for _, sn := range s.Sentinels {
		if cmd, _ := sn.process(); cmd == nil {
			continue
		}
		out, err := Cli(sn.Addr, "sentinel", "get-master-addr-by-name", s.Master)
		f := strings.Fields(out)
		if err != nil || len(f) != 2 {
			return nil
		}
		addr := f[0] + ":" + f[1]
		if named != "" && addr != named {
			return nil
		}
		named = addr
	}
	for _, d := range s.Data {
		if d.Addr == named {
			return d
		}
	}
	return nil
}

// WaitHealthy polls every 20 ms until every sentinel names a live data node
// as the primary and that node reports role:master, and returns when it
// first was (the time of the poll that saw it), or an error after timeout.
func (s *RedisSentinel) WaitHealthy(timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		at := time.Now()
		if p := s.Primary(); p != nil {
			if cmd, _ := p.process(); cmd != nil {
				if info, err := Cli(p.Addr, "info", "replication"); err == nil && strings.Contains(info, "role:master") {
					return at, nil
				}
			}
		}
		if at.After(deadline) {
			return time.Time{}, errors.New("redis sentinel: the sentinels name no live primary")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// HoldFailover keeps the sentinels from seeing the primary down (its
// down-after-milliseconds an hour) until the returned function is called,
// which sets it back to what StartRedisSentinel was given: a primary that
// has been dead meanwhile is then down at once, and the failover that
// follows is the sentinels' own. The test fails if a sentinel cannot be
// configured.
//
// A sentinel promotes no replica whose link to the primary has been down
// for more than ten times down-after-milliseconds beyond the time since
// it saw the primary down: after a hold longer than that (9 s of real time
// at 1 s: a loaded machine), no failover would ever come. So the release
// sets down-after-milliseconds to at least a fifth of the hold, which
// changes nothing else here: the primary, dead longer than that, is still
// down at once.
func (s *RedisSentinel) HoldFailover(t testing.TB) (release func()) {
	t.Helper()
	set := func(ms int64) {
		t.Helper()
		for _, sn := range s.Sentinels {
			out, err := Cli(sn.Addr, "sentinel", "set", s.Master, "down-after-milliseconds", strconv.FormatInt(ms, 10))
			if err != nil || out != "OK" {
				t.Fatalf("redis sentinel: %s: sentinel set down-after-milliseconds %d: %q %v", sn.Addr, ms, out, err)
			}
		}
	}
	set(time.Hour.Milliseconds())
	held := time.Now()
	return func() {
		t.Helper()
		set(max(s.down, time.Since(held)/5).Milliseconds())
	}
}
