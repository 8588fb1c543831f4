package ctl

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// Credentials of the fake proxy's users.
const (
	fakeAdminPW  = "s3cret adm!n"
	fakeViewerPW = "v1ewer-pw"
)

// fakeProxy is a small binary-protocol server standing in for the proxy:
// SASL PLAIN with an admin and a non-admin user, the throttle admin opcodes
// and the STAT groups "" and "throttle". With plain set it answers like a
// memcached server that knows none of that (0x81).
type fakeProxy struct {
	addr  string
	plain bool
	ln    net.Listener
	wg    sync.WaitGroup

	mu        sync.Mutex
	conns     map[net.Conn]struct{}
	requests  []fakeRequest // admin requests received
	statCalls int           // STAT throttle requests answered
	fleet     bool          // answer STAT throttle as an instance of a fleet
}

type fakeRequest struct {
	op         mc.Opcode
	key, value string
}

var fakeUsers = map[string]struct {
	password string
	admin    bool
}{
	"admin":  {fakeAdminPW, true},
	"viewer": {fakeViewerPW, false},
}

// startFake starts a fake proxy on a loopback port; it stops when the test
// ends.
func startFake(t *testing.T, plain bool) *fakeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeProxy{addr: ln.Addr().String(), plain: plain, ln: ln, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			f.conns[c] = struct{}{}
			f.mu.Unlock()
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				f.serve(c)
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
	return f
}

func (f *fakeProxy) adminRequests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeRequest(nil), f.requests...)
}

func (f *fakeProxy) serve(c net.Conn) {
	r := bufio.NewReader(c)
	admin := false
	for {
		var hb [mc.HeaderLen]byte
		if _, err := io.ReadFull(r, hb[:]); err != nil {
			return
		}
		h, _ := mc.ParseHeader(hb[:])
		if h.Validate(1<<20) != nil || h.Magic != mc.MagicRequest {
			return
		}
		body := make([]byte, h.BodyLen)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		key := string(body[h.ExtLen : int(h.ExtLen)+int(h.KeyLen)])
		value := string(body[int(h.ExtLen)+int(h.KeyLen):])
		var out []byte
		reply := func(st mc.Status, k, v string) {
			out = mc.AppendResponse(out, &h, st, nil, []byte(k), []byte(v))
		}
		fail := func(st mc.Status, reason string) { out = mc.AppendError(out, &h, st, reason) }

		switch op := h.Opcode; {
		case op == mc.OpStat && key == "":
			for _, kv := range [][2]string{{"pid", "4242"}, {"uptime", "17"}, {"version", "1.6.21-fake"}, {"curr_connections", "3"}} {
				reply(mc.StatusSuccess, kv[0], kv[1])
			}
			reply(mc.StatusSuccess, "", "")
		case f.plain:
			fail(mc.StatusUnknownCommand, "Unknown command")
		case op == mc.OpSASLListMechs:
			reply(mc.StatusSuccess, "", "SCRAM-SHA512 PLAIN")
		case op == mc.OpSASLAuth:
			parts := strings.Split(value, "\x00")
			u, ok := fakeUsers[parts[min(1, len(parts)-1)]]
			if key != "PLAIN" || len(parts) != 3 || parts[0] != "" || !ok || u.password != parts[2] {
				fail(mc.StatusAuthError, "Auth failure")
				break
			}
			admin = u.admin
			reply(mc.StatusSuccess, "", "Authenticated")
		case op == mc.OpSetBucketThrottleProperties || op == mc.OpSetNodeThrottleProperties:
			f.mu.Lock()
			f.requests = append(f.requests, fakeRequest{op, key, value})
			f.mu.Unlock()
			switch {
			case !admin:
				fail(mc.StatusEaccess, "no admin privilege")
			case strings.Contains(value, "bad"):
				fail(mc.StatusEinval, `reserved: must be a non-negative integer or "unlimited", got "bad"`)
			case op == mc.OpSetBucketThrottleProperties && key == "nope":
				fail(mc.StatusKeyEnoent, "no such bucket")
			case op == mc.OpSetBucketThrottleProperties && key == "busy":
				fail(mc.StatusEtmpfail, "cannot write the state file: disk full")
			case op == mc.OpSetBucketThrottleProperties:
				reply(mc.StatusSuccess, "", `{"reserved":100,"hard_limit":"unlimited"}`)
			default:
				reply(mc.StatusSuccess, "", "")
			}
		case op == mc.OpStat && key == "throttle":
			f.mu.Lock()
			f.statCalls++
			n, fleet := f.statCalls, f.fleet
			f.mu.Unlock()
			answer := fakeThrottleStats
			if fleet {
				answer = fakeFleetThrottleStats
			}
			for _, kv := range answer(n) {
				reply(mc.StatusSuccess, kv[0], kv[1])
			}
			reply(mc.StatusSuccess, "", "")
		case op == mc.OpStat && key == "secret":
			fail(mc.StatusEaccess, "stats group secret needs the admin privilege")
		case op == mc.OpStat:
			fail(mc.StatusKeyEnoent, "")
		default:
			fail(mc.StatusUnknownCommand, "Unknown command")
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// fakeThrottleStats is the STAT throttle answer number n: two buckets, the
// busier one listed last, web's throttled_total growing by 50 a call.
func fakeThrottleStats(n int) [][2]string {
	kv := [][2]string{{"node:capacity", "25000"}, {"node:free_pool", "15000"}, {"node:free_pool_mode", "fcfs"}}
	add := func(b string, fields ...string) {
		for i := 0; i < len(fields); i += 2 {
			kv = append(kv, [2]string{"bucket:" + b + ":" + fields[i], fields[i+1]})
		}
	}
	add("analytics-batch-nightly",
		"reserved", "0", "hard_limit", "unlimited", "weight", "1", "units_per_sec", "2100",
		"units_total", "123456789012", "read_units_total", "123456000000", "write_units_total", "789012",
		"commands_total", "98765432", "throttled_total", "0", "rejected_total", "0",
		"held_sessions", "0", "connections", "12")
	add("web",
		"reserved", "10000", "hard_limit", "20000", "weight", "250", "units_per_sec", "14500",
		"units_total", "5400000", "read_units_total", "5000000", "write_units_total", "400000",
		"commands_total", "5300000", "throttled_total", fmt.Sprint(1000+50*n), "rejected_total", "7",
		"held_sessions", "3", "connections", "250")
	return kv
}

// startFleetFake is startFake answering STAT throttle as an instance of a
// fleet (fakeFleetThrottleStats).
func startFleetFake(t *testing.T) *fakeProxy {
	t.Helper()
	f := startFake(t, false)
	f.mu.Lock()
	f.fleet = true
	f.mu.Unlock()
	return f
}

// fakeFleetThrottleStats is fakeThrottleStats(n) from one of 3 instances
// of a fleet whose store is up: the node and bucket limits are the fleet's,
// with this instance's shares beside them. The fleet's usage of web is
// known; that of analytics-batch-nightly only from the second answer on.
func fakeFleetThrottleStats(n int) [][2]string {
	base := fakeThrottleStats(n)
	kv := append([][2]string{}, base[:3]...)
	kv = append(kv, [][2]string{
		{"fleet:instance", "proxy-a:11211"}, {"fleet:store_up", "true"}, {"fleet:fallback", "false"},
		{"fleet:instances", "3"}, {"node:local_capacity", "18000"}, {"node:local_free_pool", "10000"},
	}...)
	for _, p := range base[3:] {
		kv = append(kv, p)
		switch p[0] {
		case "bucket:analytics-batch-nightly:connections":
			kv = append(kv, [2]string{"bucket:analytics-batch-nightly:local_reserved", "0"},
				[2]string{"bucket:analytics-batch-nightly:local_hard_limit", "unlimited"})
			if n > 1 {
				kv = append(kv, [2]string{"bucket:analytics-batch-nightly:fleet_units_per_sec", "3500"})
			}
		case "bucket:web:connections":
			kv = append(kv, [2]string{"bucket:web:local_reserved", "6000"},
				[2]string{"bucket:web:local_hard_limit", "15000"},
				[2]string{"bucket:web:fleet_units_per_sec", "19800"})
		}
	}
	return kv
}

// passwordFile writes pw (and a newline) to a private file.
func passwordFile(t *testing.T, pw string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(p, []byte(pw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// opts returns the Options of a client of addr, as user with password pw
// ("" and "": anonymous).
func opts(addr, user, pw string) Options {
	return Options{Addr: addr, User: user, Password: pw, Timeout: 5 * time.Second}
}
