package proxy

// pauseState is why a session dispatches nothing of its client's input
// now, or running when it does. The states exclude one another: a session
// pauses for one reason at a time, since only a running session dispatches,
// and dispatching is what makes it pause. Only setPause changes it, along
// the transitions of pauseMoves.
//
// Orthogonal to it, and flags of their own:
//   - quitting and closed, the session's end: quitting (no more input is
//     read; the connection closes once its queued responses are out) and
//     closed (the connection is gone) are set once and never cleared,
//     whatever the pause state. A paused session may be told to quit (a
//     reload removed its user, it was evicted), and one that closes while
//     paused keeps its pause state (a hold ends at once: unhold) until
//     the event it waits for comes back and finds it closed (upstream
//     room, an off-loop result);
//   - laneWait, a place in the line for its bucket's lane (lane.go): taken
//     when it pauses for want of room for a read, kept across its pause
//     and the resumption until that read is dispatched;
//   - checking(), what a waitingOffLoop session waits for: its password
//     check, queued for or running on the auth worker (evictRank spares
//     it).
type pauseState uint8

const (
	// running: the session decodes and dispatches its client's frames.
	running pauseState = iota
	// waitingUpstream: the upstream connection for its next command is
	// full; the connection calls session.unpause when it has room.
	waitingUpstream
	// waitingOffLoop: a command of its runs off the loop (a password
	// check, an admin change, a FLUSH's state file write, the delay of a
	// refused SASL AUTH), and later commands must see its effects
	// (offloop.go).
	waitingOffLoop
	// held: its bucket may not run its next command yet; the loop wakes
	// it at the time the throttle engine computed, or when limits change
	// (hold.go).
	held
	// heldOnReads: held, and also re-tried as soon as one of its own
	// commands settles (the engine waits for the bucket's reads in flight
	// to settle their cost).
	heldOnReads
	// outputPaused: its client has too many responses pending or unread,
	// or no room for its next read (pause.go); it is in lp.paused.
	outputPaused
	// waitingOrder: its next command is a text meta command and classic
	// commands of its are in flight, or the reverse. The two go upstream
	// on different connections (upstream.Conn.Meta), which memcached runs
	// in no particular order between them, so it waits until those
	// complete (session.finish queues it for lp.retry).
	waitingOrder
	// waitingCeiling: its next command is a write that raises its
	// bucket's read ceiling, and waits for the reads billed under the old
	// class to settle and for the new class to be saved (ceilingraise.go).
	// Not a throttle hold: it waits for upstream answers and a file write,
	// not for time, so it has no wake-up time on the engine's clock; the
	// events that end the wait re-try it (wakeCeiling), and the loop's
	// tick re-tries it should one be missed (retryCeilingDue).
	waitingCeiling
	// waitingFlush: its next command is a key command of a bucket with a
	// FLUSH admitted and not yet in effect (its new namespace being
	// saved: flush.go). Not a throttle hold either: it waits for the
	// FLUSH, not for time; wakeAll re-tries it when the FLUSH completes.
	waitingFlush

	numPauseStates
)

var pauseNames = [numPauseStates]string{"running", "waitingUpstream", "waitingOffLoop", "held", "heldOnReads", "outputPaused", "waitingOrder", "waitingCeiling", "waitingFlush"}

func (p pauseState) String() string {
	if p < numPauseStates {
		return pauseNames[p]
	}
	return "pauseState(invalid)"
}

// pauseMoves lists the legal transitions: pauseMoves[from] has bit 1<<to
// set when a session may go from from to to. A session pauses only while
// running (dispatch); a heldOnReads session whose read settled is queued
// for a re-try and stays held until it runs (session.finish); every pause
// ends by running again.
var pauseMoves = [numPauseStates]uint16{
	running:         1<<waitingUpstream | 1<<waitingOffLoop | 1<<held | 1<<heldOnReads | 1<<outputPaused | 1<<waitingOrder | 1<<waitingCeiling | 1<<waitingFlush,
	waitingUpstream: 1 << running,
	waitingOffLoop:  1 << running,
	held:            1 << running,
	heldOnReads:     1<<running | 1<<held,
	outputPaused:    1 << running,
	waitingOrder:    1 << running,
	waitingCeiling:  1 << running,
	waitingFlush:    1 << running,
}

// setPause moves the session to pause state to and reports true, when
// pauseMoves allows the move from its current state; otherwise it changes
// nothing, logs the bug (the first time, then every 1000th), counts it in Server.badPauseMoves, and
// reports false. On the loop.
func (s *session) setPause(to pauseState) bool {
	from := s.pause
	if to < numPauseStates && pauseMoves[from]&(1<<to) != 0 {
		s.pause = to
		if to == running {
			s.startReading() // a paused session may have stopped reading (readgate.go)
		}
		return true
	}
	srv := s.lp.srv
	if n := srv.badPauseMoves.Add(1); n%1000 == 1 {
		srv.log.Error().Str("remote", s.remote).Stringer("from", from).Stringer("to", to).Uint64("total", n).
			Msg("bug: illegal session pause transition refused")
	}
	return false
}

// isHeld reports whether the session is held by the throttle (held or
// heldOnReads).
func (s *session) isHeld() bool { return s.pause == held || s.pause == heldOnReads }

// outPaused reports whether the session is paused for its output (pause.go).
func (s *session) outPaused() bool { return s.pause == outputPaused }

// wakeable reports whether the session waits for what wakeAll announces:
// held by the throttle, or waiting for its bucket's FLUSH.
func (s *session) wakeable() bool { return s.isHeld() || s.pause == waitingFlush }

// unhold ends a hold, or a wait for a FLUSH, without dispatching (the
// session closes, or is told to quit); a session paused otherwise is left
// as it is.
func (s *session) unhold() {
	if s.wakeable() {
		s.setPause(running)
	}
}
