package proxy

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testmc"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// TestGarbageOnManyConnections: garbage and truncated frames on many
// connections at once; well-formed clients keep being served.
func TestGarbageOnManyConnections(t *testing.T) {
	p := startProxy(t, testConfig{loops: 2})
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, err := net.Dial("tcp", p.Addr)
				if err != nil {
					continue
				}
				var b []byte
				switch i % 4 {
				case 0: // random bytes
					b = make([]byte, 1+rng.IntN(200))
					for j := range b {
						b[j] = byte(rng.Uint32())
					}
				case 1: // a valid frame cut short, then close
					f := mc.AppendFrame(nil, mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpSet}, nil, mcclient.SetExtras(0, 0), []byte("key"), bytes.Repeat([]byte("v"), 100))
					b = f[:rng.IntN(len(f))]
				case 2: // a header announcing 4 GiB
					b = make([]byte, mc.HeaderLen)
					(&mc.Header{Magic: mc.MagicRequest, Opcode: mc.OpSet, BodyLen: 1<<32 - 1}).Put(b)
				case 3: // a valid magic with random lengths
					b = make([]byte, mc.HeaderLen+rng.IntN(64))
					(&mc.Header{Magic: mc.MagicRequest, Opcode: mc.Opcode(rng.Uint32()), KeyLen: uint16(rng.Uint32()), ExtLen: uint8(rng.Uint32()), BodyLen: rng.Uint32N(100)}).Put(b)
				}
				_, _ = c.Write(b)
				_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				_, _ = c.Read(make([]byte, 256))
				c.Close()
			}
		}(i)
	}
	errs := make(chan error, 10)
	for ci := 0; ci < 10; ci++ {
		go func(ci int) { errs <- runMixed(p.Addr, 1000+ci, 300) }(ci)
	}
	for ci := 0; ci < 10; ci++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	close(stop)
	wg.Wait()
}

// The upstream's recovery runs on the real clock (its timeouts, its
// reconnection backoff and its health probes do not read the engine's
// clock): these are its figures' targets, which BenchmarkUpstreamRecovery
// reports; the tests below fail only at coarseFactor times them, a
// breakage, not a slow machine.
const (
	// resumeTarget: memcached back on its port gets traffic again (the
	// reconnection backoff is at most 400 ms, jittered down to half).
	resumeTarget = time.Second
	// ejectTarget: with eject_after_failures = 2 and eject_retry = 500 ms,
	// a dead server's keys are served by the other within the retry
	// interval plus detection (two probes 100 ms apart).
	ejectTarget = time.Second
	// rejoinTarget: a server back on its port is in the ring again
	// (eject_retry 500 ms, then a probe).
	rejoinTarget = time.Second
	coarseFactor = 10
)

// TestUpstreamKilledUnderLoad: memcached dies under load; every client gets
// its answers (success before, Etmpfail after), never a hang; memcached
// back on the same port: traffic flows again without restarting the proxy
// (within coarseFactor times resumeTarget here; BenchmarkUpstreamRecovery
// reports how soon).
func TestUpstreamKilledUnderLoad(t *testing.T) {
	upstreamKilledUnderLoad(t)
}

// upstreamKilledUnderLoad runs TestUpstreamKilledUnderLoad's scenario and
// returns how long after memcached's restart its clients had 100 more
// successes.
func upstreamKilledUnderLoad(t testing.TB) time.Duration {
	const upstreamTimeout = time.Second
	m := testmc.Start(t)
	p := startProxyTo(t, m, testConfig{upstream: `timeout = "1s"`, throttle: `capacity = "unlimited"`, loops: 2})
	var ok, tmpfail, other atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := 0; i < 8; i++ {
		c := dial(t, p.Addr)
		c.Timeout = coarseFactor * upstreamTimeout // a hang, not a slow answer
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			key := []byte("load" + strconv.Itoa(i))
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := c.Set(key, []byte("v"))
				switch {
				case err != nil:
					t.Errorf("client %d: no answer: %v", i, err)
					return
				case r.Status() == mc.StatusSuccess:
					ok.Add(1)
				case r.Status() == mc.StatusEtmpfail:
					tmpfail.Add(1)
				default:
					other.Add(1)
				}
			}
		}(i)
	}
	defer func() { close(stop); wg.Wait() }()
	eventually(t, 30*time.Second, "traffic", func() bool { return ok.Load() > 100 })
	m.Stop()
	eventually(t, coarseFactor*upstreamTimeout, "Etmpfail answers after the kill", func() bool { return tmpfail.Load() > 10 })
	before := ok.Load()
	m.Restart(t)
	back := time.Now()
	eventually(t, coarseFactor*resumeTarget, "traffic after memcached is back", func() bool { return ok.Load() > before+100 })
	resumed := time.Since(back)
	if other.Load() != 0 {
		t.Errorf("%d answers with unexpected statuses", other.Load())
	}
	t.Logf("ok %d, Etmpfail %d; traffic resumed %v after memcached came back", ok.Load(), tmpfail.Load(), resumed)
	return resumed
}

// TestTwoServersEjection: keys are spread over two servers; one is killed
// with ejection on and its keys are served by the other; once it is back,
// the distribution returns (each within coarseFactor times its target
// here; BenchmarkUpstreamRecovery reports how soon).
func TestTwoServersEjection(t *testing.T) {
	twoServersEjection(t)
}

// twoServersEjection runs TestTwoServersEjection's scenario and returns
// how long after the kill every key of the dead server was served by the
// other, and how long after its restart it was back in the ring.
func twoServersEjection(t testing.TB) (ejected, rejoined time.Duration) {
	p, a, b := startTwoServerProxy(t, "eject_after_failures = 2\neject_retry = \"500ms\"")
	c := dial(t, p.Addr)
	keys := make([]string, 200)
	onB := 0
	for i := range keys {
		keys[i] = "key-" + strconv.Itoa(i)
		if r, err := c.Set([]byte(keys[i]), []byte(keys[i])); err != nil || r.Status() != mc.StatusSuccess {
			t.Fatal(err, r)
		}
	}
	home := map[string]*testmc.Server{}
	for _, k := range keys {
		inA, inB := onServer(t, a, k), onServer(t, b, k)
		if inA == inB {
			t.Fatalf("key %s on both or neither server", k)
		}
		if inB {
			onB++
			home[k] = b
		} else {
			home[k] = a
		}
	}
	if onB < 50 || onB > 150 {
		t.Fatalf("%d of 200 keys on the second server: not spread", onB)
	}
	b.Stop()
	killed := time.Now()
	// Every key can be written and read again, through server a.
	eventually(t, coarseFactor*ejectTarget, "keys of the dead server to be served by the other", func() bool {
		for _, k := range keys {
			if home[k] != b {
				continue
			}
			if r, err := c.Set([]byte(k), []byte("moved")); err != nil || r.Status() != mc.StatusSuccess {
				return false
			}
		}
		return true
	})
	ejected = time.Since(killed)
	t.Logf("dead server's keys served by the other %v after the kill", ejected)
	for _, k := range keys {
		want := k
		if home[k] == b {
			want = "moved"
		}
		if r, err := c.Get([]byte(k)); err != nil || string(r.Value) != want {
			t.Fatalf("get %s: %v %+v, want %q", k, err, r, want)
		}
	}
	// Back: keys go home again.
	b.Restart(t)
	restarted := time.Now()
	eventually(t, coarseFactor*rejoinTarget, "the server to be back in the ring", func() bool {
		for _, k := range keys {
			if home[k] == b {
				if r, err := c.Set([]byte(k), []byte("home")); err != nil || r.Status() != mc.StatusSuccess {
					return false
				}
				return onServer(t, b, k)
			}
		}
		return false
	})
	rejoined = time.Since(restarted)
	t.Logf("the server back in the ring %v after its restart", rejoined)
	for _, k := range keys {
		if home[k] != b {
			continue
		}
		if r, err := c.Set([]byte(k), []byte("home")); err != nil || r.Status() != mc.StatusSuccess || !onServer(t, b, k) {
			t.Fatalf("key %s not back on its server", k)
		}
	}
	return ejected, rejoined
}

// TestReloadUnderLoad: a reload that adds a server and changes limits
// drops no client connection and loses no request.
func TestReloadUnderLoad(t *testing.T) {
	p, a, b := startTwoServerProxy(t, "")
	_ = a
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var done atomic.Int64
	var failures atomic.Int64
	var clients []*mcclient.Client
	for i := 0; i < 8; i++ {
		clients = append(clients, dial(t, p.Addr))
	}
	for i, c := range clients {
		wg.Add(1)
		go func(i int, c *mcclient.Client) {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				key := []byte(fmt.Sprintf("r%d-%d", i, n%50))
				val := []byte(fmt.Sprintf("v%d", n))
				r, err := c.Set(key, val)
				if err != nil || r.Status() != mc.StatusSuccess {
					failures.Add(1)
					t.Errorf("client %d set: %v %v", i, err, r)
					return
				}
				// A reload that changes the servers moves keys: right
				// after it a GET may miss, or find an older value this
				// client wrote where the key lived before (as with any
				// ketama client). It must never fail, nor return a value
				// that is not this client's.
				r, err = c.Get(key)
				if err == nil && r.Status() == mc.StatusSuccess {
					var got int
					if _, perr := fmt.Sscanf(string(r.Value), "v%d", &got); perr != nil || got > n || got%50 != n%50 {
						err = fmt.Errorf("value %q is not one this client wrote for %s", r.Value, key)
					}
				} else if err == nil && r.Status() != mc.StatusKeyEnoent {
					err = fmt.Errorf("status %s", r.Status())
				}
				if err != nil {
					failures.Add(1)
					t.Errorf("client %d get: %v", i, err)
					return
				}
				done.Add(1)
			}
		}(i, c)
	}
	eventually(t, 30*time.Second, "load", func() bool { return done.Load() > 200 })
	third := testmc.Start(t)
	for round := 0; round < 3; round++ {
		servers := []string{a.Addr, b.Addr}
		if round%2 == 0 {
			servers = append(servers, third.Addr)
		}
		tc := testConfig{throttle: fmt.Sprintf("capacity = %d", 1000000+round)}
		cfg, err := bucketcfg.Parse([]byte(tc.render(p.opts.listen, servers, p.StatePath)))
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Reload(cfg); err != nil {
			t.Fatal(err)
		}
		n := done.Load()
		eventually(t, 30*time.Second, "load after reload", func() bool { return done.Load() > n+200 })
	}
	close(stop)
	wg.Wait()
	if failures.Load() != 0 || p.Connections() != int64(len(clients)) {
		t.Fatalf("failures %d, connections %d (want 0 and %d)", failures.Load(), p.Connections(), len(clients))
	}
	if got := p.Engine().Capacity(); got != 1000002 {
		t.Fatalf("capacity after reloads %v", got)
	}
}

// TestMalformedRequestsAnsweredLocally: requests memcached would answer
// with Einval and a closed connection (shared by other clients) are
// refused by the proxy; other clients' requests in flight are unaffected.
func TestMalformedRequestsAnsweredLocally(t *testing.T) {
	p := startProxy(t, testConfig{loops: 1})
	victim, attacker := dial(t, p.Addr), dial(t, p.Addr)
	if r, err := victim.Set([]byte("v"), []byte("x")); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	bad := []mcclient.Request{
		{Opcode: mc.OpVersion, Key: []byte("x")},
		{Opcode: mc.OpGet, Extras: []byte{1}, Key: []byte("k")},
		{Opcode: mc.OpSet, Extras: []byte{1, 2, 3, 4}, Key: []byte("k"), Value: []byte("v")},
		{Opcode: mc.OpDelete, Extras: []byte{1}, Key: []byte("k")},
		{Opcode: mc.OpIncrement, Key: []byte("k")},
	}
	for round := 0; round < 20; round++ {
		for _, rq := range bad {
			attacker.Send(rq)
		}
		for i := 0; i < 5; i++ {
			victim.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("v")})
		}
		_ = attacker.Flush()
		_ = victim.Flush()
		for range bad {
			r, err := attacker.Read()
			if err != nil || r.Status() != mc.StatusEinval || len(r.Value) == 0 {
				t.Fatalf("malformed request: %v %+v, want Einval with a reason", err, r)
			}
		}
		for i := 0; i < 5; i++ {
			r, err := victim.Read()
			if err != nil || r.Status() != mc.StatusSuccess {
				t.Fatalf("victim's GET while another client sends malformed requests: %v %+v", err, r)
			}
		}
	}
}

// TestResponseBytesBounded: a client that pipelines large reads and never
// reads its responses is paused or disconnected, so the memory held for
// it stays bounded (400 GETs of 1 MB would be 400 MB).
func TestResponseBytesBounded(t *testing.T) {
	p := startProxy(t, testConfig{throttle: `capacity = "unlimited"`})
	c := dial(t, p.Addr)
	big := bytes.Repeat([]byte("x"), 1000*1000)
	if r, err := c.Set([]byte("big"), big); err != nil || r.Status() != mc.StatusSuccess {
		t.Fatal(err, r)
	}
	_ = c.Conn().(*net.TCPConn).SetReadBuffer(4096)
	for i := 0; i < 400; i++ {
		c.Send(mcclient.Request{Opcode: mc.OpGet, Key: []byte("big")})
	}
	_ = c.Flush()
	// The session stops dispatching once the responses of its reads in
	// flight could pass maxResponseBytes (or, if some have arrived before
	// the rest of its requests, at 4 MiB unsent), and holds at most that
	// much; a client holding more is disconnected. Memory is measured once
	// the reads it was allowed have been answered.
	eventually(t, 30*time.Second, "the non-reading client to be paused with its reads answered, or disconnected", func() bool {
		if p.Connections() == 0 {
			return true
		}
		paused, answered := false, true
		p.eachLoop(func(lp *loop) {
			done := make(chan struct{})
			_ = lp.el.Execute(t.Context(), gnet.RunnableFunc(func(context.Context) error {
				paused = paused || len(lp.paused) > 0
				answered = answered && lp.pool.Inflight() == 0
				close(done)
				return nil
			}))
			<-done
		})
		return paused && answered
	})
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	if ms.HeapInuse > 160<<20 {
		t.Fatalf("heap in use %d MB with a non-reading client: unbounded", ms.HeapInuse>>20)
	}
	t.Logf("heap in use %d MB", ms.HeapInuse>>20)
}

// A stop requested while the proxy is starting returns once Serve has
// failed to listen, instead of waiting for a start that never comes
// (kvthrottle serve got SIGTERM and hung).
func TestShutdownWhenServeCannotListen(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg, err := bucketcfg.Parse([]byte(testConfig{}.render(taken.Addr().String(), []string{"127.0.0.1:1"}, filepath.Join(t.TempDir(), "state.json"))))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Config: cfg, Logger: testLogger(t), NoMetrics: true})
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stopped <- srv.Shutdown(ctx)
	}()
	if err := srv.Serve(); err == nil {
		t.Fatal("Serve on a taken address succeeded")
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Shutdown: %v; want nil at once (nothing to drain)", err)
	}
}
