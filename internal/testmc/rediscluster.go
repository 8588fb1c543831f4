package testmc

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisCluster is a Redis Cluster of redis-server processes started for a
// test by StartRedisCluster: every node on a loopback port, without
// persistence, in a directory of its own.
type RedisCluster struct {
	// Nodes are the cluster's processes, the primaries first as created.
	Nodes []*Redis
}

// clusterPort returns a free loopback port whose cluster bus port (the
// port + 10000) is free too, both claimed as PickPort claims its ports
// and both below the kernel's ephemeral range (a bus port in that range
// was once taken by another process's outgoing connection between the
// pick and redis-server's bind).
func clusterPort(t testing.TB) int {
	t.Helper()
	const bus = 10000
	for range 200 {
		p := pickLow + rand.IntN(pickHigh-bus-pickLow+1)
		if !listenable(p) || !listenable(p+bus) {
			continue
		}
		if claim(p) && claimAcross(p) && claim(p+bus) && claimAcross(p+bus) {
			return p
		}
	}
	t.Fatal("no free port pair (port, port + 10000) below the ephemeral range")
	return 0
}

// listenable reports whether a listener could bind loopback port p now.
func listenable(p int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// StartRedisCluster starts primaries+primaries*replicas redis-server
// processes in cluster mode (cluster-node-timeout timeout), joins them with
// `redis-cli --cluster create ... --cluster-replicas replicas --cluster-yes`
// and waits until every node reports cluster_state:ok. The test fails if
// redis-server or redis-cli is missing or the cluster is not up within
// 20 s. The processes are stopped when the test ends.
func StartRedisCluster(t testing.TB, primaries, replicas int, timeout time.Duration) *RedisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		t.Fatalf("redis-cli not found in PATH (Debian package redis-tools): %v", err)
	}
	c := &RedisCluster{}
	args := []string{"--cluster", "create"}
	for range primaries * (1 + replicas) {
		r := &Redis{Addr: "127.0.0.1:" + strconv.Itoa(clusterPort(t)), dir: t.TempDir()}
		r.args = []string{"--cluster-enabled", "yes", "--cluster-config-file", r.dir + "/nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(timeout.Milliseconds(), 10),
			"--repl-diskless-sync-delay", "0", "--loglevel", "notice"}
		t.Cleanup(r.Stop)
		r.start(t)
		c.Nodes = append(c.Nodes, r)
		args = append(args, r.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v: %s", err, out)
	}
	if _, err := c.WaitHealthy("", 20*time.Second); err != nil {
		t.Fatal(err)
	}
	// A replica that has not synchronised with its primary yet never
	// takes over from it: wait until each has.
	for _, n := range c.Nodes {
		deadline := time.Now().Add(20 * time.Second)
		for {
			info, err := Cli(n.Addr, "info", "replication")
			if err == nil && (strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redis cluster: replica %s not synchronised with its primary: %s", n.Addr, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c
}

// URL returns the go-redis URL of the cluster with every node as a seed:
// "redis://n1?addr=n2&addr=n3...".
func (c *RedisCluster) URL() string {
	var b strings.Builder
	b.WriteString("redis://" + c.Nodes[0].Addr)
	for i, n := range c.Nodes[1:] {
		if i == 0 {
			b.WriteString("?addr=")
		} else {
			b.WriteString("&addr=")
		}
		b.WriteString(n.Addr)
	}
	return b.String()
}

// Cli runs redis-cli against addr with args and returns its output.
func Cli(addr string, args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("redis-cli %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// alive returns the nodes whose process runs.
func (c *RedisCluster) alive() []*Redis {
	var out []*Redis
	for _, n := range c.Nodes {
		if cmd, _ := n.process(); cmd != nil {
			out = append(out, n)
		}
	}
	return out
}

// Primary returns the node that a live node names as the primary serving
// key's slot (by CLUSTER NODES), or nil if none does.
func (c *RedisCluster) Primary(key string) *Redis {
	for _, n := range c.alive() {
		s, err := Cli(n.Addr, "cluster", "keyslot", key)
		if err != nil {
			continue
		}
		slot, _ := strconv.Atoi(s)
		nodes, err := Cli(n.Addr, "cluster", "nodes")
		if err != nil {
			continue
		}
		if addr := slotOwner(nodes, slot); addr != "" {
			for _, m := range c.Nodes {
				if m.Addr == addr {
					return m
				}
			}
		}
	}
	return nil
}

// slotOwner returns the address of the healthy primary that CLUSTER NODES
// output nodes names for slot, or "".
func slotOwner(nodes string, slot int) string {
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.Contains(f[2], "master") || strings.Contains(f[2], "fail") {
			continue
		}
		for _, r := range f[8:] {
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil && a <= slot && slot <= b {
				addr, _, _ := strings.Cut(f[1], "@")
				return addr
			}
		}
	}
	return ""
}

// Healthy reports whether every live node answers CLUSTER INFO with
// cluster_state:ok and names a live primary as the one serving key's slot.
// (Right after a primary dies the others still report ok, and name it,
// until they have marked it failed: cluster-node-timeout.)
func (c *RedisCluster) Healthy(key string) bool {
	nodes := c.alive()
	for _, n := range nodes {
		info, err := Cli(n.Addr, "cluster", "info")
		if err != nil || !strings.Contains(info, "cluster_state:ok") {
			return false
		}
		s, err1 := Cli(n.Addr, "cluster", "keyslot", key)
		all, err2 := Cli(n.Addr, "cluster", "nodes")
		slot, err3 := strconv.Atoi(s)
		if err1 != nil || err2 != nil || err3 != nil {
			return false
		}
		owner := slotOwner(all, slot)
		live := false
		for _, m := range nodes {
			live = live || m.Addr == owner
		}
		if !live {
			return false
		}
	}
	return len(nodes) > 0
}

// WaitHealthy polls every 20 ms until Healthy(key) and returns when it
// first was (the time of the poll that saw it), or an error after timeout.
func (c *RedisCluster) WaitHealthy(key string, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		at := time.Now()
		if c.Healthy(key) {
			return at, nil
		}
		if at.After(deadline) {
			return time.Time{}, errors.New("redis cluster: not every node reports cluster_state:ok and a live primary for " + key)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Replicas returns the live nodes that CLUSTER NODES (asked of primary,
// or of any live node if primary is down) names as replicas of primary.
func (c *RedisCluster) Replicas(primary *Redis) []*Redis {
	id, err := c.NodeID(primary)
	if err != nil {
		return nil
	}
	var out []*Redis
	for _, n := range c.alive() {
		self, err := c.NodeID(n)
		if err != nil || self == id {
			continue
		}
		nodes, err := Cli(n.Addr, "cluster", "nodes")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 3 && f[0] == self && strings.Contains(f[2], "slave") && f[3] == id {
				out = append(out, n)
			}
		}
	}
	return out
}

// NodeID returns n's cluster node id, asked of n or, if n is down, read
// from any live node's CLUSTER NODES by n's address.
func (c *RedisCluster) NodeID(n *Redis) (string, error) {
	if id, err := Cli(n.Addr, "cluster", "myid"); err == nil {
		return id, nil
	}
	for _, m := range c.alive() {
		nodes, err := Cli(m.Addr, "cluster", "nodes")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 1 && strings.HasPrefix(f[1], n.Addr+"@") {
				return f[0], nil
			}
		}
	}
	return "", fmt.Errorf("redis cluster: no node knows %s", n.Addr)
}

// HoldFailover keeps primary's replicas from taking over from it
// (cluster-replica-no-failover yes) until the returned function is called,
// which lets them (and makes them ignore how stale their data has grown
// meanwhile: cluster-replica-validity-factor 0). A test kills the primary
// in between and does what must happen while the failover has not: the
// failover itself is then the cluster's own. The test fails if primary has
// no replica or one cannot be configured.
func (c *RedisCluster) HoldFailover(t testing.TB, primary *Redis) (release func()) {
	t.Helper()
	replicas := c.Replicas(primary)
	if len(replicas) == 0 {
		t.Fatalf("redis cluster: %s has no replica", primary.Addr)
	}
	set := func(name, value string) {
		t.Helper()
		for _, r := range replicas {
			if out, err := Cli(r.Addr, "config", "set", name, value); err != nil || out != "OK" {
				t.Fatalf("redis cluster: %s: config set %s %s: %q %v", r.Addr, name, value, out, err)
			}
		}
	}
	set("cluster-replica-no-failover", "yes")
	set("cluster-replica-validity-factor", "0")
	return func() {
		t.Helper()
		set("cluster-replica-no-failover", "no")
	}
}
