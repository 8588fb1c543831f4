package testmc

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"
)

// redisCmd sends one inline command on a fresh connection and returns the
// first line of the reply, or the error (a timeout when the server is
// frozen).
func redisCmd(addr, cmd string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}

// TestRedisLifecycle: the server answers, keeps data while running, stops
// answering while frozen and answers again once thawed, and comes back
// empty on the same port after Kill and Restart (no persistence).
func TestRedisLifecycle(t *testing.T) {
	r := StartRedis(t)
	if want := "redis://" + r.Addr + "/0"; r.URL() != want {
		t.Fatalf("URL() = %q, want %q", r.URL(), want)
	}
	if got, err := redisCmd(r.Addr, "SET k v", time.Second); err != nil || got != "+OK" {
		t.Fatalf("SET: %q, %v", got, err)
	}
	thaw := r.Freeze(t)
	if got, err := redisCmd(r.Addr, "PING", 200*time.Millisecond); err == nil {
		t.Fatalf("a frozen server answered PING: %q", got)
	}
	thaw()
	if got, err := redisCmd(r.Addr, "GET k", time.Second); err != nil || got != "$1" {
		t.Fatalf("GET after thaw: %q, %v", got, err)
	}
	addr := r.Addr
	r.Kill()
	if _, err := redisCmd(addr, "PING", 200*time.Millisecond); err == nil {
		t.Fatal("a killed server answered PING")
	}
	r.Restart(t)
	if r.Addr != addr {
		t.Fatalf("restarted on %s, want %s", r.Addr, addr)
	}
	if got, err := redisCmd(r.Addr, "EXISTS k", time.Second); err != nil || got != ":0" {
		t.Fatalf("EXISTS after restart: %q, %v (want :0, an empty server)", got, err)
	}
	r.Restart(t) // while running: stops it first
	r.Stop()
	r.Stop()
}
