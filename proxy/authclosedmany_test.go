package proxy

import (
	"fmt"
	"testing"
	"time"
)

// TestClosedWaitingLoginsLeaveNoCheckNorJob: logins waiting on a
// penalised user at an address leave their checks when their connections
// close, however many (here 2000 distinct guesses, one connection each,
// closed at once): every check is withdrawn, the queue's counts return to
// zero, and the off-loop job count a graceful shutdown waits for returns
// to zero without the clock moving (no check ran, none waits for a turn).
func TestClosedWaitingLoginsLeaveNoCheckNorJob(t *testing.T) {
	const n = 2000
	p, _ := startGuessProxy(t, testConfig{tail: poolTail(t)})
	src := authPair("127.0.0.1", poolUser)
	failFirstGuess(t, p)
	var conns []*rawConn
	for i := range n {
		conns = append(conns, sendGuess(t, p.Addr, fmt.Sprintf("guess-%d", i+1), 1)...)
	}
	eventually(t, livenessWait, "the guesses to wait", func() bool { k, _ := queuedChecks(p, src); return k == n })
	closeAll(conns)
	eventually(t, livenessWait, "the closed guesses to be withdrawn", func() bool {
		q := p.authQ
		q.mu.Lock()
		defer q.mu.Unlock()
		as := q.sources[src]
		return (as == nil || len(as.jobs) == 0) && q.n == 0 && q.over == 0
	})
	done := make(chan struct{})
	go func() { p.jobs.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(livenessWait):
		t.Fatal("the off-loop job count never returned to zero: a graceful shutdown would hang")
	}
}
