package proxy

import (
	"testing"

	"github.com/rs/zerolog"
)

// The session's pause transitions, written out with the code that makes
// each: setPause must allow exactly these and refuse every other move,
// leaving the state as it was. A change to pauseMoves that the session code
// does not make (or a transition it makes that the table lacks) fails here;
// checkPauseMoves catches the second kind under real traffic too.
func TestPauseTransitions(t *testing.T) {
	t.Parallel()
	legal := map[[2]pauseState]string{
		{running, waitingUpstream}: "forward: the upstream connection is full",
		{running, waitingOffLoop}:  "offLoop: a command runs off the loop",
		{running, held}:            "throttled: the bucket may not run the command yet",
		{running, heldOnReads}:     "throttled: the engine waits for the bucket's reads in flight",
		{running, outputPaused}:    "onTraffic: mustPause",
		{waitingUpstream, running}: "unpause: the upstream connection has room",
		{waitingOffLoop, running}:  "offLoopCall.answer: the off-loop command is answered",
		{held, running}:            "wakeDue, wakeAll, retryHeld; unhold (close, reload)",
		{heldOnReads, running}:     "wakeDue, wakeAll; unhold (close, reload)",
		{heldOnReads, held}:        "finish: one of its reads settled, queued for lp.retry",
		{outputPaused, running}:    "resumePaused: canResume",
		{running, waitingOrder}:    "forward: a meta command after classic ones in flight, or the reverse",
		{waitingOrder, running}:    "retryHeld: the commands it waited for completed",
		{running, waitingCeiling}:  "raiseCeiling: its write waits for a raise of its bucket's ceiling",
		{waitingCeiling, running}:  "retryCeiling: the raise's old reads settled, or its class was saved",
		{running, waitingFlush}:    "waitFlush: a key command while its bucket's FLUSH is being saved",
		{waitingFlush, running}:    "wakeAll: the FLUSH is in effect; unhold (close, reload)",
	}
	for from := range numPauseStates {
		for to := range numPauseStates + 1 { // one past the last: invalid
			why, want := legal[[2]pauseState{from, to}]
			srv := &Server{log: zerolog.Nop()}
			s := &session{lp: &loop{srv: srv}, pause: from}
			got := s.setPause(to)
			switch {
			case got != want:
				t.Errorf("%v -> %v: allowed %v, want %v %s", from, to, got, want, why)
			case got && s.pause != to:
				t.Errorf("%v -> %v allowed, but the state is %v", from, to, s.pause)
			case !got && s.pause != from:
				t.Errorf("%v -> %v refused, but the state changed to %v", from, to, s.pause)
			case !got && srv.badPauseMoves.Load() != 1:
				t.Errorf("%v -> %v refused, counted %d times; want 1", from, to, srv.badPauseMoves.Load())
			}
		}
	}
}

// unhold ends a hold or a wait for a FLUSH, and nothing else: a session
// paused for another reason keeps its state (closing it must not forget an
// outstanding off-loop answer or upstream wait).
func TestUnholdLeavesOtherPauses(t *testing.T) {
	t.Parallel()
	for p := range numPauseStates {
		srv := &Server{log: zerolog.Nop()}
		s := &session{lp: &loop{srv: srv}, pause: p}
		s.unhold()
		want := p
		if p == held || p == heldOnReads || p == waitingFlush {
			want = running
		}
		if s.pause != want || srv.badPauseMoves.Load() != 0 {
			t.Errorf("unhold from %v: state %v (%d refused); want %v", p, s.pause, srv.badPauseMoves.Load(), want)
		}
	}
}
