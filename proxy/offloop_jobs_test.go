package proxy

import "testing"

// Shutdown's wait for off-loop work ends once the work counted before it
// has ended, and nothing counts after it began: a late hand-off is refused
// rather than racing the wait.
func TestJobGroupRefusesWorkOnceClosed(t *testing.T) {
	t.Parallel()
	var g jobGroup
	if !g.add() {
		t.Fatal("an open group refused work")
	}
	waited := g.closeAndWait()
	select {
	case <-waited:
		t.Fatal("the wait ended with work still counted")
	default:
	}
	if g.add() {
		t.Fatal("a closed group counted new work")
	}
	g.done()
	<-waited
}
