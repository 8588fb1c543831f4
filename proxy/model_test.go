package proxy

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// The tests in this file drive many clients that pipeline random batches
// of quiet and loud commands, and check every response: against a model of
// each client's keys (runModel), or, while servers die and come back, only
// what must hold whatever happens (runChaosClient).

// eachClient runs fn for clients 0..n-1 concurrently and reports their
// errors.
func eachClient(t *testing.T, n int, fn func(id int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// modelClient dials addr and runs runModel on it.
func modelClient(addr string, rounds int, seed uint64) func(id int) error {
	return func(id int) error {
		c, err := mcclient.Dial(addr)
		if err != nil {
			return err
		}
		defer c.Close()
		return runModel(c, id, rounds, seed)
	}
}

type modelExpect struct {
	opaque uint32
	op     mc.Opcode
	status mc.Status
	key    []byte // nil: not checked
	value  []byte // nil: not checked
}

// runModel pipelines random batches of quiet and loud commands on one
// client against a model of its own keys and checks every response.
func runModel(c *mcclient.Client, id int, rounds int, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, uint64(id)))
	store := map[string][]byte{}
	keys := make([]string, 6)
	for i := range keys {
		keys[i] = fmt.Sprintf("rv-%d-%d", id, i)
	}
	// start clean
	for _, k := range keys {
		c.Send(mcclient.Request{Opcode: mc.OpDeleteQ, Key: []byte(k)})
	}
	nop := c.Send(mcclient.Request{Opcode: mc.OpNoop})
	if err := c.Flush(); err != nil {
		return err
	}
	for {
		r, err := c.Read()
		if err != nil {
			return err
		}
		if r.Opaque == nop {
			break
		}
	}
	for round := 0; round < rounds; round++ {
		var exp []modelExpect
		n := 1 + rng.IntN(60)
		for i := 0; i < n; i++ {
			k := keys[rng.IntN(len(keys))]
			v, hit := store[k]
			switch rng.IntN(9) {
			case 0, 1:
				val := bytes.Repeat([]byte{byte('a' + rng.IntN(26))}, 1+rng.IntN(3000))
				quiet := rng.IntN(2) == 0
				op := mc.OpSet
				if quiet {
					op = mc.OpSetQ
				}
				o := c.Send(mcclient.Request{Opcode: op, Extras: mcclient.SetExtras(0, 0), Key: []byte(k), Value: val})
				store[k] = val
				if !quiet {
					exp = append(exp, modelExpect{opaque: o, op: op, status: mc.StatusSuccess})
				}
			case 2:
				o := c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte(k)})
				if hit {
					exp = append(exp, modelExpect{opaque: o, op: mc.OpGet, status: mc.StatusSuccess, value: v, key: []byte{}})
				} else {
					exp = append(exp, modelExpect{opaque: o, op: mc.OpGet, status: mc.StatusKeyEnoent})
				}
			case 3:
				o := c.Send(mcclient.Request{Opcode: mc.OpGetQ, Key: []byte(k)})
				if hit {
					exp = append(exp, modelExpect{opaque: o, op: mc.OpGetQ, status: mc.StatusSuccess, value: v, key: []byte{}})
				}
			case 4:
				o := c.Send(mcclient.Request{Opcode: mc.OpGetK, Key: []byte(k)})
				if hit {
					exp = append(exp, modelExpect{opaque: o, op: mc.OpGetK, status: mc.StatusSuccess, value: v, key: []byte(k)})
				} else {
					exp = append(exp, modelExpect{opaque: o, op: mc.OpGetK, status: mc.StatusKeyEnoent, key: []byte(k)})
				}
			case 5:
				o := c.Send(mcclient.Request{Opcode: mc.OpGetKQ, Key: []byte(k)})
				if hit {
					exp = append(exp, modelExpect{opaque: o, op: mc.OpGetKQ, status: mc.StatusSuccess, value: v, key: []byte(k)})
				}
			case 6:
				quiet := rng.IntN(2) == 0
				op := mc.OpDelete
				if quiet {
					op = mc.OpDeleteQ
				}
				o := c.Send(mcclient.Request{Opcode: op, Key: []byte(k)})
				delete(store, k)
				switch {
				case !hit:
					exp = append(exp, modelExpect{opaque: o, op: op, status: mc.StatusKeyEnoent})
				case !quiet:
					exp = append(exp, modelExpect{opaque: o, op: op, status: mc.StatusSuccess})
				}
			case 7:
				o := c.Send(mcclient.Request{Opcode: mc.OpNoop})
				exp = append(exp, modelExpect{opaque: o, op: mc.OpNoop, status: mc.StatusSuccess})
			case 8:
				o := c.Send(mcclient.Request{Opcode: mc.OpStat})
				exp = append(exp, modelExpect{opaque: o, op: mc.OpStat, status: mc.StatusSuccess})
			}
		}
		o := c.Send(mcclient.Request{Opcode: mc.OpNoop})
		exp = append(exp, modelExpect{opaque: o, op: mc.OpNoop, status: mc.StatusSuccess})
		if err := c.Flush(); err != nil {
			return err
		}
		for i := 0; i < len(exp); i++ {
			e := exp[i]
			r, err := c.Read()
			if err != nil {
				return fmt.Errorf("client %d round %d: reading response %d/%d (opaque %d %s): %v", id, round, i, len(exp), e.opaque, e.op, err)
			}
			if e.op == mc.OpStat && r.Opaque == e.opaque && len(r.Key) > 0 {
				i-- // a stat line; the terminator has no key
				continue
			}
			if r.Opaque != e.opaque || r.Opcode != e.op || r.Status() != e.status {
				return fmt.Errorf("client %d round %d: response %d: got opaque %d op %s status %s, want opaque %d op %s status %s",
					id, round, i, r.Opaque, r.Opcode, r.Status(), e.opaque, e.op, e.status)
			}
			if e.key != nil && !bytes.Equal(r.Key, e.key) {
				return fmt.Errorf("client %d round %d: response %d: key %q, want %q", id, round, i, r.Key, e.key)
			}
			if e.value != nil && !bytes.Equal(r.Value, e.value) {
				return fmt.Errorf("client %d round %d: response %d (%s): value of %d bytes, want %d", id, round, i, e.op, len(r.Value), len(e.value))
			}
		}
	}
	return nil
}

// Clients on two loops share upstream connections with in-flight bounds
// from 1 to the default; every response matches the model.
//
// Each client runs 50 rounds: every round is a new random batch of up to
// 60 quiet and loud commands, so 50 rounds of 12 clients (about 18,000
// commands per bound) mix every kind of command with every other on the
// shared upstream connections. make test runs it twice, in the
// upstream-TLS pass (without -race) and under -race with 20 rounds (every
// kind of batch still meets the others; the race detector's time is what
// grows with the rounds), 6 at an in-flight bound of 1 (each command waits
// for the one before on its upstream connection: 20 rounds took 116 s of
// the race pass's longest process, waiting; 20 in the upstream-TLS pass,
// where 50 took 59 s, most of that pass's longest test), each with its own seed, so
// that the two runs cover different batches (a run of 150 rounds over TLS
// took a quarter of that pass's CPU).
func TestPipelinedModel(t *testing.T) {
	t.Parallel()
	seed := uint64(42)
	if testmc.UpstreamTLS() {
		seed = 43
	}
	for _, inflight := range []int{1, 3, 4096} {
		rounds := testmc.UnderRace(50, 20)
		if inflight == 1 {
			rounds = testmc.UnderRace(20, 6)
		}
		t.Run(fmt.Sprint("inflight=", inflight), func(t *testing.T) {
			p := startProxy(t, testConfig{upstream: fmt.Sprintf("max_inflight = %d", inflight), loops: 2})
			eachClient(t, 12, modelClient(p.Addr, rounds, seed))
		})
	}
}

// The same through a bucket held at its hard limit: holding and waking
// sessions mid-batch changes nothing in what they get back. On a fake
// clock that moves (10 ms a step) only while a session is held, so that
// the clients are held on every run, however fast the machine (on the
// real clock a slow one never reached the limit).
func TestPipelinedModelHeld(t *testing.T) {
	t.Parallel()
	clock := throttle.NewFakeClock(time.Hour)
	p := startProxyClock(t, testConfig{loops: 2, upstream: "max_inflight = 8",
		tail: "[[bucket]]\nname = \"default\"\nhard_limit = 2500\n"}, clock)
	ft := &fakeTime{t: t, p: p, clock: clock}
	done := make(chan struct{})
	go func() {
		defer close(done)
		eachClient(t, 6, modelClient(p.Addr, 15, 99))
	}()
	ft.stepWhileHeld(10*time.Millisecond, done)
	if st := p.Engine().Bucket("default").Stats(); st.Held == 0 {
		t.Errorf("no command was held (%d commands): the test did not test holding", st.Commands)
	}
}

// runChaosClient pipelines batches and checks only what must hold while
// memcached restarts: every loud request answered exactly once, in order,
// quiet ones at most once, values belong to the key asked for.
func runChaosClient(addr string, id int, stop <-chan struct{}, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, uint64(id)))
	var c *mcclient.Client
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for round := 0; ; round++ {
		select {
		case <-stop:
			return nil
		default:
		}
		if c == nil {
			var err error
			if c, err = mcclient.Dial(addr); err != nil {
				return err
			}
		}
		type ex struct {
			opaque uint32
			op     mc.Opcode
			quiet  bool
			key    string
		}
		var exp []ex
		n := 1 + rng.IntN(80)
		for i := 0; i < n; i++ {
			k := fmt.Sprintf("ch-%d-%d", id, rng.IntN(8))
			switch rng.IntN(6) {
			case 0:
				val := append([]byte(k+"|"), bytes.Repeat([]byte("x"), rng.IntN(5000))...)
				op := []mc.Opcode{mc.OpSet, mc.OpSetQ}[rng.IntN(2)]
				o := c.Send(mcclient.Request{Opcode: op, Extras: mcclient.SetExtras(0, 0), Key: []byte(k), Value: val})
				exp = append(exp, ex{o, op, op.Quiet(), k})
			case 1, 2:
				op := []mc.Opcode{mc.OpGet, mc.OpGetQ, mc.OpGetK, mc.OpGetKQ}[rng.IntN(4)]
				o := c.Send(mcclient.Request{Opcode: op, Key: []byte(k)})
				exp = append(exp, ex{o, op, op.Quiet(), k})
			case 3:
				op := []mc.Opcode{mc.OpDelete, mc.OpDeleteQ}[rng.IntN(2)]
				o := c.Send(mcclient.Request{Opcode: op, Key: []byte(k)})
				exp = append(exp, ex{o, op, op.Quiet(), k})
			case 4:
				o := c.Send(mcclient.Request{Opcode: mc.OpNoop})
				exp = append(exp, ex{o, mc.OpNoop, false, ""})
			case 5:
				op := []mc.Opcode{mc.OpIncrement, mc.OpIncrementQ}[rng.IntN(2)]
				ext := make([]byte, 20)
				o := c.Send(mcclient.Request{Opcode: op, Key: []byte("ctr-" + k), Extras: ext})
				exp = append(exp, ex{o, op, op.Quiet(), "ctr-" + k})
			}
		}
		o := c.Send(mcclient.Request{Opcode: mc.OpNoop})
		exp = append(exp, ex{o, mc.OpNoop, false, ""})
		if err := c.Flush(); err != nil {
			return fmt.Errorf("client %d: flush: %v", id, err)
		}
		if rng.IntN(10) == 0 {
			// disconnect with everything in flight
			c.Close()
			c = nil
			continue
		}
		i := 0
		for i < len(exp) {
			r, err := c.Read()
			if err != nil {
				return fmt.Errorf("client %d round %d: read (waiting for opaque %d %s): %v", id, round, exp[i].opaque, exp[i].op, err)
			}
			for i < len(exp) && exp[i].opaque != r.Opaque {
				if !exp[i].quiet {
					return fmt.Errorf("client %d round %d: got opaque %d (%s %s), loud request %d %s skipped", id, round, r.Opaque, r.Opcode, r.Status(), exp[i].opaque, exp[i].op)
				}
				i++
			}
			if i == len(exp) {
				return fmt.Errorf("client %d round %d: unexpected response opaque %d op %s", id, round, r.Opaque, r.Opcode)
			}
			e := exp[i]
			if r.Opcode != e.op {
				return fmt.Errorf("client %d: opaque %d: opcode %s want %s", id, r.Opaque, r.Opcode, e.op)
			}
			if r.Status() == mc.StatusSuccess && (e.op == mc.OpGet || e.op == mc.OpGetQ || e.op == mc.OpGetK || e.op == mc.OpGetKQ) {
				if !bytes.HasPrefix(r.Value, []byte(e.key+"|")) {
					return fmt.Errorf("client %d: %s %s returned a value of another key: %.40q", id, e.op, e.key, r.Value)
				}
				if (e.op == mc.OpGetK || e.op == mc.OpGetKQ) && string(r.Key) != e.key {
					return fmt.Errorf("client %d: %s key %q want %q", id, e.op, r.Key, e.key)
				}
			}
			switch r.Status() {
			case mc.StatusSuccess, mc.StatusKeyEnoent, mc.StatusEtmpfail, mc.StatusNotStored:
			default:
				return fmt.Errorf("client %d: %s: status %s %q", id, e.op, r.Status(), r.Value)
			}
			i++
		}
	}
}

// memcached is killed and restarted while clients pipeline and disconnect
// mid-batch: answers stay consistent and nothing leaks.
func TestChaosUpstreamRestarts(t *testing.T) {
	t.Parallel()
	m := testmc.Start(t)
	p := startProxyTo(t, m, testConfig{upstream: "timeout = \"1s\"\nmax_inflight = 16", throttle: `capacity = "unlimited"`, loops: 2})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		eachClient(t, 12, func(id int) error { return runChaosClient(p.Addr, id, stop, 7) })
	}()
	for k := 0; k < 4; k++ {
		time.Sleep(700 * time.Millisecond)
		m.Stop()
		time.Sleep(time.Duration(50+k*100) * time.Millisecond)
		m.Restart(t)
	}
	time.Sleep(700 * time.Millisecond)
	close(stop)
	<-done
	eventually(t, 30*time.Second, "connections and in-flight commands back to 0", func() bool {
		return p.Connections() == 0 && p.inflight() == 0
	})
}

// Reloads add and remove servers while clients pipeline and disconnect
// mid-batch: answers stay consistent, retired connections close.
func TestChaosReloadServers(t *testing.T) {
	t.Parallel()
	p, a, b := startTwoServerProxy(t, "max_inflight = 8")
	third := testmc.Start(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		eachClient(t, 10, func(id int) error { return runChaosClient(p.Addr, id, stop, 11) })
	}()
	for round := 0; round < 8; round++ {
		time.Sleep(250 * time.Millisecond)
		servers := []string{a.Addr, b.Addr}
		switch round % 3 {
		case 0:
			servers = append(servers, third.Addr)
		case 1:
			servers = []string{third.Addr, a.Addr}
		}
		cfg, err := bucketcfg.Parse([]byte(testConfig{throttle: `capacity = "unlimited"`}.render(p.opts.listen, servers, p.StatePath)))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Reload(cfg); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	eventually(t, 30*time.Second, "connections and in-flight commands back to 0", func() bool {
		return p.Connections() == 0 && p.inflight() == 0
	})
	eventually(t, 30*time.Second, "retiring upstream connections closed", func() bool {
		n := 0
		p.eachLoop(func(lp *loop) {
			done := make(chan struct{})
			_ = lp.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
				n += lp.pool.Retiring()
				close(done)
				return nil
			}))
			<-done
		})
		return n == 0
	})
}
