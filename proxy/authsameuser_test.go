package proxy

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestWrongPasswordFloodSparesSameUserPool: from 127.0.0.1, 8 connections
// keep sending wrong PLAIN passwords for the pool user (someone who knows the
// application's user name, behind the same NAT or on the same host), and
// its own pool of 32 connections then logs in from the same address
// with the right password, the cache cold (bcrypt at its default cost).
// Issue 27 point 2 asks that the credentials that failed be penalised, not
// the address's correct ones: every login of the pool should succeed
// (within auth_timeout). docs/operations.md keys the penalty on the user
// and address, which makes this a choice to revisit, not a regression.
//
// Seen on main (issue 27 review): 0 of 32 succeed. The penalty is kept per
// user and address, and its bound of 8 distinct credentials waiting per
// user and address is filled by the flood's distinct wrong passwords, so
// the right one is refused at once with Etmpfail ("too many
// authentications in progress; retry"). With pylibmc through the built
// proxy: 0 of 64 beside 8 flooding connections, 0 of 32 beside 4, 32 of 32
// (in 5 s) beside 1.
func TestWrongPasswordFloodSparesSameUserPool(t *testing.T) {
	t.Skip("issue 27 review: a wrong-password flood for a user from an address refuses that user's correct logins from the address (0 of 32 beside 8 flooding connections)")
	const pool, flooders = 32, 8
	p := startProxy(t, testConfig{tail: poolTail(t)})
	stop := make(chan struct{})
	var refused atomic.Int64
	var fw sync.WaitGroup
	var seq atomic.Int64
	for range flooders {
		fw.Add(1)
		go func() {
			defer fw.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				rc := dialFrom(t, p.Addr, "127.0.0.1")
				_ = rc.c.SetDeadline(time.Now().Add(20 * time.Second))
				for {
					good, err := tryPlain(rc, poolUser, fmt.Sprintf("wrong-%d", seq.Add(1)))
					if err != nil || good {
						break
					}
					refused.Add(1)
				}
			}
		}()
	}
	defer func() { close(stop); fw.Wait() }()
	eventually(t, 10*time.Second, "the flood to be refused", func() bool {
		return refused.Load() >= 1
	})
	time.Sleep(3 * time.Second) // as long as an application takes to notice and restart its pool
	var ok atomic.Int64
	var wg sync.WaitGroup
	for range pool {
		rc := dialFrom(t, p.Addr, "127.0.0.1")
		_ = rc.c.SetDeadline(time.Now().Add(15 * time.Second))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if good, err := tryPlain(rc, poolUser, poolPass); good {
				ok.Add(1)
			} else if err != nil {
				t.Logf("the pool user's login: %v", err)
			}
		}()
	}
	wg.Wait()
	if got := ok.Load(); got != pool {
		t.Errorf("beside a flood of wrong passwords for %s: %d of %d of its correct logins succeeded, want all", poolUser, got, pool)
	}
}
