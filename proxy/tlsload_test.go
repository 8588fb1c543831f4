package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// loadWorker runs SET-then-GET round trips with value checks on one TLS
// connection until stopped; the first failure ends it and is kept.
type loadWorker struct {
	name string
	conn *tls.Conn
	// step does one SET and GET of the worker's n-th key and value and
	// checks the answers.
	step func(n int) error

	done atomic.Int64 // round trips completed
	err  atomic.Pointer[error]
}

// run loops step until stop is closed or a step fails; wg is Done at the
// end.
func (w *loadWorker) run(stop <-chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		default:
		}
		_ = w.conn.SetDeadline(time.Now().Add(clientPatience))
		if err := w.step(n); err != nil {
			err = fmt.Errorf("%s, round trip %d: %w", w.name, n, err)
			w.err.Store(&err)
			return
		}
		w.done.Add(1)
	}
}

// binaryWorker: SET and GET over the binary protocol, keys and values
// naming the worker and the round trip.
func binaryWorker(name string, conn *tls.Conn) *loadWorker {
	c := mcclient.New(conn)
	w := &loadWorker{name: name, conn: conn}
	w.step = func(n int) error {
		key := fmt.Appendf(nil, "%s-%d", name, n%32)
		val := fmt.Appendf(nil, "%s value %d %s", name, n, bytes.Repeat([]byte{'x'}, n%200))
		r, err := c.Set(key, val)
		if err != nil {
			return fmt.Errorf("SET: %w", err)
		}
		if r.Status() != mc.StatusSuccess {
			return fmt.Errorf("SET: status %v", r.Status())
		}
		r, err = c.Get(key)
		if err != nil {
			return fmt.Errorf("GET: %w", err)
		}
		if r.Status() != mc.StatusSuccess || !bytes.Equal(r.Value, val) {
			return fmt.Errorf("GET: status %v, value %q, want %q", r.Status(), r.Value, val)
		}
		return nil
	}
	return w
}

// textWorker: set and get over the text protocol.
func textWorker(name string, conn *tls.Conn) *loadWorker {
	br := bufio.NewReader(conn)
	w := &loadWorker{name: name, conn: conn}
	var want []byte
	w.step = func(n int) error {
		key := fmt.Sprintf("%s-%d", name, n%32)
		val := fmt.Sprintf("%s value %d %s", name, n, bytes.Repeat([]byte{'y'}, n%200))
		if _, err := fmt.Fprintf(conn, "set %s 7 0 %d\r\n%s\r\nget %s\r\n", key, len(val), val, key); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		want = fmt.Appendf(want[:0], "STORED\r\nVALUE %s 7 %d\r\n%s\r\nEND\r\n", key, len(val), val)
		got := make([]byte, len(want))
		if _, err := io.ReadFull(br, got); err != nil {
			return fmt.Errorf("read: %w (got %q)", err, got)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("got %q, want %q", got, want)
		}
		return nil
	}
	return w
}

// certSerial is the serial number of the first certificate in pemBytes.
func certSerial(t *testing.T, pemBytes []byte) string {
	t.Helper()
	b, _ := pem.Decode(pemBytes)
	if b == nil {
		t.Fatal("no PEM block")
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.String()
}

// TestTLSRotationUnderLoad: certificates rotated by reload (what SIGHUP
// does: the file re-read, Server.Reload) while TLS clients run SET/GET
// round trips drop nothing. Binary clients (one logged in by SASL) and a
// text client check every answer; after each of several rotations, each to
// a certificate of a new CA, a client trusting only that CA gets in and is
// served the new certificate (its serial), then joins the load; the
// clients from before keep going. Meanwhile a churning client, trusting
// every CA of the test, keeps opening connections: every handshake
// succeeds, whichever certificate it meets.
func TestTLSRotationUnderLoad(t *testing.T) {
	const rotations = 4
	s := startTLSProxy(t, false, "")
	cfgPath := filepath.Join(s.dir, "kvthrottle.toml")
	if err := os.WriteFile(cfgPath, []byte(s.tc.render(s.p.Addr, []string{s.p.MC.Addr}, s.p.StatePath)), 0o600); err != nil {
		t.Fatal(err)
	}
	cas := []*testcerts.CA{s.ca}
	for i := 1; i <= rotations; i++ {
		cas = append(cas, testcerts.NewCA(t, fmt.Sprintf("kvthrottle rotation CA %d", i)))
	}
	allCAs := x509.NewCertPool()
	for _, ca := range cas {
		allCAs.AddCert(ca.Cert)
	}
	dialWith := func(roots *x509.CertPool) (*tls.Conn, error) {
		d := &net.Dialer{Timeout: time.Minute}
		return tls.DialWithDialer(d, "tcp", s.p.TLSAddr(), &tls.Config{RootCAs: roots, ServerName: "localhost"})
	}
	served := func(c *tls.Conn) string { return c.ConnectionState().PeerCertificates[0].SerialNumber.String() }

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	var workers []*loadWorker
	start := func(w *loadWorker) {
		t.Cleanup(func() { w.conn.Close() })
		workers = append(workers, w)
		wg.Add(1)
		go w.run(stop, &wg)
	}
	open := func(roots *x509.CertPool) *tls.Conn {
		t.Helper()
		c, err := dialWith(roots)
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		return c
	}

	// The clients from before the first rotation.
	firstSerial := ""
	for i := 0; i < 3; i++ {
		c := open(s.ca.Pool())
		firstSerial = served(c)
		start(binaryWorker(fmt.Sprintf("bin%d", i), c))
	}
	sasl := open(s.ca.Pool())
	if err := mcclient.New(sasl).AuthPlain("bob", "bob-pw"); err != nil {
		t.Fatalf("SASL PLAIN over TLS: %v", err)
	}
	start(binaryWorker("bob", sasl))
	start(textWorker("text0", open(s.ca.Pool())))

	// The churning client: a new connection, one VERSION, closed; again.
	var churned, churnFailed atomic.Int64
	var churnErr atomic.Pointer[error]
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			err := func() error {
				c, err := dialWith(allCAs)
				if err != nil {
					return err
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(clientPatience))
				r, err := mcclient.New(c).Do(mcclient.Request{Opcode: mc.OpVersion})
				if err != nil {
					return err
				}
				return r.Err()
			}()
			if err != nil {
				churnFailed.Add(1)
				churnErr.Store(&err)
			}
			churned.Add(1)
		}
	}()

	// progress waits until every worker has completed at least n more
	// round trips than in before (and the churner made more connections),
	// failing on any worker's error.
	snapshot := func() []int64 {
		out := make([]int64, len(workers)+1)
		for i, w := range workers {
			out[i] = w.done.Load()
		}
		out[len(workers)] = churned.Load()
		return out
	}
	checkErrs := func() {
		t.Helper()
		for _, w := range workers {
			if e := w.err.Load(); e != nil {
				t.Fatalf("a connection from before a rotation failed: %v", *e)
			}
		}
		if e := churnErr.Load(); e != nil {
			t.Fatalf("a new connection during the rotations failed: %v", *e)
		}
	}
	progress := func(before []int64, n int64, what string) {
		t.Helper()
		eventually(t, time.Minute, what, func() bool { // liveness
			checkErrs()
			for i, b := range before[:len(before)-1] {
				if workers[i].done.Load() < b+n {
					return false
				}
			}
			return churned.Load() > before[len(before)-1]
		})
	}
	progress(make([]int64, len(workers)+1), 20, "the load to run")

	serials := map[string]bool{firstSerial: true}
	for i := 1; i <= rotations; i++ {
		issued := cas[i].Server(t)
		issued.Write(t, s.dir, "server") // the files named by tls.cert_file and tls.key_file
		want := certSerial(t, issued.CertPEM)
		before := snapshot()
		cfg, err := bucketcfg.Load(cfgPath)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.p.Reload(cfg); err != nil {
			t.Fatalf("rotation %d: reload: %v", i, err)
		}
		// A client trusting only the new CA is served the new certificate.
		c := open(cas[i].Pool())
		if got := served(c); got != want {
			t.Fatalf("rotation %d: a new connection was served serial %s, want %s", i, got, want)
		}
		serials[want] = true
		if i%2 == 1 {
			start(binaryWorker(fmt.Sprintf("bin-r%d", i), c))
		} else {
			start(textWorker(fmt.Sprintf("text-r%d", i), c))
		}
		churnBefore := before[len(before)-1]
		before = append(before[:len(before)-1], 0, churnBefore) // the new worker's: 0
		// Every connection, from before and after, goes on: 20 more round
		// trips each after the rotation.
		progress(before, 20, fmt.Sprintf("round trips after rotation %d", i))
	}
	if len(serials) != rotations+1 {
		t.Fatalf("%d distinct serials served, want %d", len(serials), rotations+1)
	}
	close(stop)
	wg.Wait()
	checkErrs()
	if n := churnFailed.Load(); n != 0 {
		t.Fatalf("%d new connections failed during the rotations", n)
	}
	// The workers' connections are all still open and served.
	eventually(t, time.Minute, "the load connections, and only they, open", func() bool { return s.p.Connections() == int64(len(workers)) })
	var total int64
	for _, w := range workers {
		total += w.done.Load()
	}
	t.Logf("%d rotations; %d round trips on %d connections, %d connections opened meanwhile, none failed",
		rotations, total, len(workers), churned.Load())
}

// TestHandshakeConnBoundsComputing: handshakes hold a cpu slot only
// between their reads and writes, so however many are in progress, no
// more than the slots compute at once; one waiting for its client holds
// none; once released, the connection passes reads and writes through
// without slots, and a handshake whose context ends stops waiting for one.
func TestHandshakeConnBoundsComputing(t *testing.T) {
	const n = 8
	cpu := make(chan struct{}, 1)
	ctx := context.Background()

	// One whose client never speaks: blocked in Read, it holds no slot.
	silentSrv, silentCli := net.Pipe()
	defer silentCli.Close()
	silent := &handshakeConn{Conn: silentSrv, cpu: cpu, ctx: ctx}
	silentDone := make(chan struct{})
	go func() {
		defer close(silentDone)
		_, _ = silent.Read(make([]byte, 1))
		silent.release()
	}()

	var computing, most atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		srv, cli := net.Pipe()
		hc := &handshakeConn{Conn: srv, cpu: cpu, ctx: ctx}
		wg.Add(2)
		go func() { // the client: hello, then read the answer
			defer wg.Done()
			defer cli.Close()
			if _, err := cli.Write([]byte("hello")); err != nil {
				errs <- err
				return
			}
			if _, err := io.ReadFull(cli, make([]byte, 6)); err != nil {
				errs <- err
			}
		}()
		go func() { // the server: read, compute, write, compute, done
			defer wg.Done()
			defer srv.Close()
			compute := func() {
				c := computing.Add(1)
				for m := most.Load(); c > m && !most.CompareAndSwap(m, c); m = most.Load() {
				}
				time.Sleep(time.Millisecond) // work, with the slot held
				computing.Add(-1)
			}
			if _, err := io.ReadFull(hc, make([]byte, 5)); err != nil {
				errs <- err
				return
			}
			compute()
			if _, err := hc.Write([]byte("answer")); err != nil {
				errs <- err
				return
			}
			compute()
			hc.release()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if m := most.Load(); m != 1 {
		t.Fatalf("%d handshakes computed at once, want 1 (the slots)", m)
	}
	if len(cpu) != 0 {
		t.Fatalf("%d slots held after every handshake ended (the silent one waits for its client)", len(cpu))
	}
	silentCli.Close()
	<-silentDone

	// Released: no slot taken or needed, even with every slot held.
	srv, cli := net.Pipe()
	defer cli.Close()
	hc := &handshakeConn{Conn: srv, cpu: cpu, ctx: ctx}
	hc.release()
	cpu <- struct{}{}
	go func() { _, _ = cli.Write([]byte("x")) }()
	if _, err := hc.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	// Waiting for a slot ends with the handshake's context.
	cctx, cancel := context.WithCancel(ctx)
	srv2, cli2 := net.Pipe()
	defer cli2.Close()
	waiting := &handshakeConn{Conn: srv2, cpu: cpu, ctx: cctx}
	go func() { _, _ = cli2.Write([]byte("x")) }()
	read := make(chan error, 1)
	go func() { _, err := waiting.Read(make([]byte, 1)); read <- err }()
	cancel()
	select {
	case err := <-read:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a handshake whose context ended still waits for a slot")
	}
	if waiting.holding {
		t.Fatal("took a slot that was never free")
	}
	<-cpu
}
