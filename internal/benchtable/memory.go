package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"time"
)

type memResult struct {
	conns              int
	rssBeforeKB        int64
	rssAfterKB         int64
	hwmKB              int64
	fdsBefore, fdsWith int
}

// runMemory opens o.idleConns connections to the proxy, each sending one
// NOOP and reading its response, then reads the proxy's VmRSS.
func runMemory(ctx context.Context, o *options, px *proxyProc, cl *cleaner, rep *report) error {
	time.Sleep(500 * time.Millisecond)
	pid := px.pid()
	var res memResult
	var err error
	if res.rssBeforeKB, err = procStatusKB(pid, "VmRSS"); err != nil {
		return err
	}
	res.fdsBefore = openFDs(pid)

	conns := make([]net.Conn, o.idleConns)
	var mu sync.Mutex
	closeAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for i, c := range conns {
			if c != nil {
				c.Close()
				conns[i] = nil
			}
		}
	}
	cl.add(closeAll)
	defer closeAll()

	noop := appendRequest(nil, opNoop, 7, nil, nil, nil)
	const workers = 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	next := make(chan int)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				c, err := net.DialTimeout("tcp", px.addr, 10*time.Second)
				if err != nil {
					errs <- fmt.Errorf("connection %d: %w", i, err)
					return
				}
				mu.Lock()
				conns[i] = c
				mu.Unlock()
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				st, err := roundTrip(c, bufio.NewReaderSize(c, 64), noop)
				if err == nil && st != 0 {
					err = fmt.Errorf("NOOP status 0x%x", st)
				}
				if err != nil {
					errs <- fmt.Errorf("connection %d: %w", i, err)
					return
				}
				_ = c.SetDeadline(time.Time{})
			}
		}()
	}
	began := time.Now()
feed:
	for i := range conns {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			wg.Wait()
			return fmt.Errorf("idle connections: %w", err)
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	select {
	case err := <-errs:
		return fmt.Errorf("idle connections: %w", err)
	default:
	}
	logf("%d idle connections open to the proxy in %v", len(conns), time.Since(began).Round(time.Millisecond))
	time.Sleep(time.Second) // let the proxy settle
	if err := px.ensureAlive(); err != nil {
		return err
	}
	if res.rssAfterKB, err = procStatusKB(pid, "VmRSS"); err != nil {
		return err
	}
	res.hwmKB, _ = procStatusKB(pid, "VmHWM")
	res.fdsWith = openFDs(pid)
	res.conns = len(conns)
	logf("proxy RSS: %.1f MB before, %.1f MB with %d idle connections (%d open fds)", mb(res.rssBeforeKB), mb(res.rssAfterKB), res.conns, res.fdsWith)
	rep.mem = &res
	return nil
}

// mb converts kB (as /proc reports, 1024 bytes) to MB (10^6 bytes).
func mb(kb int64) float64 { return float64(kb) * 1024 / 1e6 }
