package proxy

import (
	"context"
	"sync"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// jobGroup counts the work handed off the event loops (off-loop calls, the
// FLUSH writer), which Shutdown waits for. Unlike a bare sync.WaitGroup it
// refuses new work once Shutdown has begun its wait, so no new count can
// race that wait. Safe for concurrent use.
type jobGroup struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// add counts one more piece of work; false once the group is closed
// (nothing counted: the caller must not hand the work off).
func (g *jobGroup) add() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	return true
}

// done ends one counted piece of work.
func (g *jobGroup) done() { g.wg.Done() }

// closeAndWait refuses further work and returns a channel closed once the
// counted work has ended. Called once, by Shutdown.
func (g *jobGroup) closeAndWait() <-chan struct{} {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	ch := make(chan struct{})
	go func() { g.wg.Wait(); close(ch) }()
	return ch
}

// offLoopCall is one command of a session answered by work that may not
// run on the event loop: a password check (on the auth worker, auth.go),
// an admin change or a FLUSH (state file writes, admin.go), the delay
// before a refused SASL AUTH is answered. Between offLoop and answer the
// session dispatches nothing else (pause state waitingOffLoop), so that
// its later commands see the command's effects, and the answer takes the
// command's place in the response order.
//
// Work handed off the loop (handOff, run, after) counts in the Server's
// job group (Server.jobs) until it is handed back (back): Shutdown waits
// for it. The session may close meanwhile: the call then ends when it is
// back, its continuation not run.
//
// A call is made on the session's loop and touched there only, except
// back, which the goroutine the call was handed to calls.
type offLoopCall struct {
	s        *session
	sl       *slot // the command's place in the response queue
	answered bool
}

// offLoop queues r's place in the response order and pauses the session
// until the returned call is answered. On the loop, from dispatch.
func (s *session) offLoop(r *request) *offLoopCall {
	sl := s.later(r)
	s.setPause(waitingOffLoop)
	return &offLoopCall{s: s, sl: sl}
}

// handOff counts the call in the Server's job group and calls give, which
// hands it to another goroutine; that goroutine must call back exactly
// once. When give returns false, or the proxy is past waiting for its
// jobs (Shutdown), nothing was handed off: the count is undone, and the
// call is still the caller's, on the loop. On the loop.
func (c *offLoopCall) handOff(give func() bool) bool {
	jobs := &c.s.lp.srv.jobs
	if !jobs.add() { // before the other goroutine can call back
		return false
	}
	if !give() {
		jobs.done()
		return false
	}
	return true
}

// run runs work on a goroutine of the Server's job group and answers the
// call, on the loop, with the response appendResp (work's result) appends.
// On the loop.
func (c *offLoopCall) run(work func() (appendResp func([]byte) []byte)) {
	if !c.handOff(func() bool {
		go func() { c.reply(work()) }()
		return true
	}) {
		c.answer(func(b []byte) []byte {
			return c.s.codec.appendError(b, c.sl.req, binary.StatusEtmpfail, "the proxy is shutting down")
		})
	}
}

// after hands the call to a timer that fires when the engine's clock
// reads at, then runs then on the loop as back does. at is a reading, not
// a delay: a clock moved between the caller's reading and the arming
// would fire a delay late. On the loop.
func (c *offLoopCall) after(at time.Duration, then func()) {
	if !c.handOff(func() bool {
		c.s.lp.srv.throttle.AtFunc(at, func() { c.back(then) })
		return true
	}) {
		then() // shutting down: no delay
	}
}

// back hands the call back to its session's loop; from the goroutine it
// was handed to (handOff), once. On the loop, then runs, and must answer
// the call or hand it off again; once it is answered, the session
// dispatches its client's next commands. If the session has closed
// meanwhile, then is not run and the call ends there. The call's count in
// the job group ends on the loop, after then (which may have counted a
// new hand-off first), so Shutdown's wait cannot end between the two; if
// the engine has stopped, the call is dropped with the connection and its
// count ends at once.
func (c *offLoopCall) back(then func()) {
	s := c.s
	jobs := &s.lp.srv.jobs
	err := s.lp.el.Execute(context.Background(), gnet.RunnableFunc(func(context.Context) error {
		defer jobs.done()
		if s.closed {
			c.answer(nil)
			return nil
		}
		then()
		if c.answered {
			s.resume()
		}
		return nil
	}))
	if err != nil {
		jobs.done()
	}
}

// reply is back with a continuation that answers the call with the
// response appendResp appends.
func (c *offLoopCall) reply(appendResp func([]byte) []byte) {
	c.back(func() { c.answer(appendResp) })
}

// answer ends the call with the response appendResp appends (nil only
// once the session has closed): the session runs again. Called from
// dispatch, the dispatch loop goes on; from back's then, back resumes the
// session. On the loop.
func (c *offLoopCall) answer(appendResp func([]byte) []byte) {
	s := c.s
	c.answered = true
	s.completeLater(c.sl, appendResp)
	s.setPause(running)
}
