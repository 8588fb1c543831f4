package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"
)

const (
	latKeys      = 1000
	latValueSize = 100
	latSetEvery  = 10 // one SET per 10 requests, the rest GETs (9:1 like memcaslap)
)

type latResult struct {
	samples  []time.Duration
	requests int
	elapsed  time.Duration
}

func (l latResult) pct(p float64) time.Duration {
	if len(l.samples) == 0 {
		return 0
	}
	i := int(p*float64(len(l.samples)) + 0.5)
	return l.samples[min(max(i-1, 0), len(l.samples)-1)]
}

func latKey(i int) []byte { return []byte("benchtable:lat:" + strconv.Itoa(i)) }

// runLatency measures the latency of a fixed, moderate request rate,
// directly, through the proxy and through the bare forwarder.
func runLatency(ctx context.Context, o *options, mc *memcached, px, bare, before *proxyProc, rep *report) error {
	live := []int{mc.pid(), px.pid(), bare.pid()}
	sides := []struct {
		name string
		addr string
		res  *latResult
	}{{"direct", mc.addr, &rep.latDirect}, {"proxy", px.addr, &rep.latProxy}, {"bare forwarder", bare.addr, &rep.latBare}}
	if before != nil {
		live = append(live, before.pid())
		sides = append(sides, struct {
			name string
			addr string
			res  *latResult
		}{"kvthrottle before", before.addr, &rep.latBefore})
	}
	section := takeCPU(live...)
	defer func() { rep.latLoad = loadBetween(section, takeCPU(live...)) }()
	warm := time.Second
	if o.quick {
		warm = 500 * time.Millisecond
	}
	for _, side := range sides {
		if err := populate(side.addr); err != nil {
			return fmt.Errorf("latency: populate %s: %w", side.addr, err)
		}
		res, err := fixedRate(ctx, tcpDialer(side.addr), o.latConns, o.latRate, warm, o.latDur)
		if err != nil {
			return fmt.Errorf("latency via %s: %w", side.addr, err)
		}
		*side.res = res
		logf("latency %s: %d requests at %.0f/s, p50 %v, p99 %v", side.name, len(res.samples),
			float64(res.requests)/res.elapsed.Seconds(), res.pct(0.50), res.pct(0.99))
	}
	return nil
}

// populate sets every key the load generator reads.
func populate(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	val := make([]byte, latValueSize)
	var batch []byte
	for i := 0; i < latKeys; i++ {
		batch = appendRequest(batch, opSet, uint32(i), setExtras, latKey(i), val)
	}
	if _, err := c.Write(batch); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	var hdr [headerLen]byte
	for i := 0; i < latKeys; i++ {
		st, _, err := readResponse(r, &hdr)
		if err != nil {
			return err
		}
		if st != 0 {
			return fmt.Errorf("SET status 0x%x", st)
		}
	}
	return nil
}

// fixedRate runs conns connections (opened with dial), each sending one request every
// conns/rate seconds (staggered) and waiting for its response, for warm +
// measure; the latency of each request sent after the warm-up is the time
// from just before its write to the end of its response.
func fixedRate(ctx context.Context, dial dialer, conns, rate int, warm, measure time.Duration) (latResult, error) {
	interval := time.Duration(float64(time.Second) * float64(conns) / float64(rate))
	start := time.Now().Add(50 * time.Millisecond)
	warmEnd := start.Add(warm)
	end := warmEnd.Add(measure)

	var (
		mu       sync.Mutex
		all      []time.Duration
		requests int
		firstErr error
		wg       sync.WaitGroup
	)
	cs := make([]net.Conn, conns)
	for i := range cs {
		c, err := dial()
		if err != nil {
			for _, c := range cs[:i] {
				c.Close()
			}
			return latResult{}, err
		}
		_ = c.SetDeadline(end.Add(10 * time.Second))
		cs[i] = c
	}
	stop := context.AfterFunc(ctx, func() {
		for _, c := range cs {
			c.Close()
		}
	})
	defer stop()
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()

	for id, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(id), 42))
			r := bufio.NewReaderSize(c, 4096)
			val := make([]byte, latValueSize)
			samples := make([]time.Duration, 0, int(measure/interval)+2)
			buf := make([]byte, 0, 256)
			var hdr [headerLen]byte
			n := 0
			offset := time.Duration(id) * interval / time.Duration(conns)
			for i := 0; ; i++ {
				due := start.Add(offset + time.Duration(i)*interval)
				if !due.Before(end) {
					break
				}
				if d := time.Until(due); d > 0 {
					time.Sleep(d)
				}
				key := latKey(rng.IntN(latKeys))
				if rng.IntN(latSetEvery) == 0 {
					buf = appendRequest(buf[:0], opSet, uint32(i), setExtras, key, val)
				} else {
					buf = appendRequest(buf[:0], opGet, uint32(i), nil, key, nil)
				}
				sent := time.Now()
				if _, err := c.Write(buf); err != nil {
					setErr(&mu, &firstErr, err)
					return
				}
				st, opaque, err := readResponse(r, &hdr)
				took := time.Since(sent)
				if err != nil {
					setErr(&mu, &firstErr, err)
					return
				}
				if st != 0 || opaque != uint32(i) {
					setErr(&mu, &firstErr, fmt.Errorf("response status 0x%x opaque %d, want 0 and %d", st, opaque, i))
					return
				}
				if !due.Before(warmEnd) {
					samples = append(samples, took)
					n++
				}
			}
			mu.Lock()
			all = append(all, samples...)
			requests += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return latResult{}, ctx.Err()
	}
	if firstErr != nil {
		return latResult{}, firstErr
	}
	slices.Sort(all)
	return latResult{samples: all, requests: requests, elapsed: measure}, nil
}

func setErr(mu *sync.Mutex, dst *error, err error) {
	mu.Lock()
	defer mu.Unlock()
	if *dst == nil {
		*dst = err
	}
}
