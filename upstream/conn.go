// Package upstream holds kvthrottle's memcached servers and its
// connections to them.
//
// A Pool is the set of servers in force: the ketama Ring over them, the
// health prober that ejects servers that stop answering and lets them back,
// and the VERSION their probes read. Each gnet event loop has its LoopPool
// view of it, which picks the Conn for a key and adopts the servers of a
// reload (Pool.Update). The proxy asks the pool for a connection and never
// dials or probes a server itself.
//
// Each gnet event loop owns one Conn per server in each of its Groups (the
// LoopPool's default group, and one per bucket in the proxy). Client
// requests from every session of that loop routed to the group are
// pipelined on it with rewritten opaques, and the responses are matched
// back to the Waiter that sent each request. All
// methods of Conn must be called on the owning event loop, except where a
// comment says otherwise; the package takes no lock on the request path.
//
// Quiet commands: memcached answers requests on a connection in order and
// sends nothing for a GETQ miss or a SETQ success. When a response arrives
// for a later request, every earlier quiet request still waiting is known
// to have completed silently. Conn appends a NOOP of its own to every batch
// that ends with a quiet request, so no quiet request stays unresolved.
package upstream

import (
	"sync/atomic"
	"time"

	"github.com/panjf2000/gnet/v2"

	"github.com/kvthrottle/kvthrottle/internal/connbridge"
	"github.com/kvthrottle/kvthrottle/proto/binary"
	"github.com/kvthrottle/kvthrottle/proto/text"
)

// Waiter receives the outcome of one request sent upstream. Its methods are
// called on the owning event loop, exactly once per request except Deliver,
// which a STAT request receives once per stat line (done false) and once
// for the terminating frame (done true). A frame passed to Deliver aliases
// the connection's input buffer: copy what must outlive the call.
type Waiter interface {
	Deliver(f *binary.Frame, done bool)
	// Silent: a quiet request completed without a response.
	Silent()
	// Fail: the request will get no response from memcached (the
	// connection is down, died or timed out); reason is short and
	// human-readable, and says so when the request had been written to
	// the server and so may have run.
	Fail(status binary.Status, reason string)
}

// Config is the static configuration of a Conn.
type Config struct {
	// Addr is the memcached server as host:port.
	Addr string
	// Timeout bounds a connect, and how long the oldest request written
	// to the server may wait for its response, counted from when it was
	// written or, if later, from when the server last answered (a server
	// answers in order: a request waits only once those before it are
	// answered, and a long pipeline of large responses that keeps
	// arriving is not a dead server). Zero means 2 s.
	Timeout time.Duration
	// MaxInflight bounds the requests in flight on the connection (sent
	// or buffered). Zero means 4096.
	MaxInflight int
	// AfterRead, when not nil, is called on the loop after each batch of
	// responses has been delivered (the proxy flushes client output there).
	AfterRead func()
	// OnState, when not nil, is called on the loop when the connection
	// goes up or down.
	OnState func(c *Conn, up bool, err error)
	// Observe, when not nil, receives each request's round trip in
	// seconds (from the write of its batch to its response).
	Observe func(seconds float64)

	dialer *dialer // the Pool's (TLS, tls.go); nil: plain TCP
}

type state uint8

const (
	stateIdle       state = iota // never connected, or backoff elapsed
	stateConnecting              // a dial is in progress; requests queue
	stateUp                      // connected
	stateDown                    // failed; new requests fail until the backoff elapses
)

// Conn is one pipelined connection to a memcached server, owned by one
// event loop. The zero value is not usable; use New.
type Conn struct {
	cfg   Config
	loop  gnet.EventLoop
	gc    gnet.Conn
	state state

	out       []byte // requests not yet written
	lastQuiet bool   // the last request appended to out is quiet
	ring      []entry
	head, n   int // ring[head] is the oldest of n entries
	unsent    int // entries at the tail whose sent time is 0
	opaque    uint32

	failures  int       // consecutive failed connects / deaths
	retryAt   time.Time // while down: when the next connect may start
	closed    bool
	dialGen   uint64    // incremented per dial, so stale results are ignored
	dialedAt  time.Time // when the current dial started
	lastErr   error
	now       int64        // unix ns at the start of the current read batch
	frame     binary.Frame // the response being delivered (a field: waiters get a pointer to it)
	waitingUp []func()     // callbacks to run when room frees up

	meta     *Conn             // the text sibling for meta commands (meta.go); nil until Meta
	isMeta   bool              // this is a meta sibling: text replies
	mresp    text.MetaResponse // the meta reply being delivered
	metaNeed int               // bytes a meta reply still arriving needs buffered

	answered   uint64 // response frames matched, ever
	seenAnswer uint64 // answered as of the last CheckTimeout
	answerAt   int64  // unix ns: the CheckTimeout that first saw answered at its current value

	tlsDial bool                          // the dial in progress is over TLS (tls.go)
	pend    atomic.Pointer[pendingBridge] // a TLS dial's bridge, from its goroutine to HandleOpen
	bridge  *connbridge.Bridge            // gc's bridge when over TLS
}

// New returns a Conn for cfg owned by loop. It does not connect until the
// first request (Forward).
func New(cfg Config, loop gnet.EventLoop) *Conn {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 4096
	}
	return &Conn{cfg: cfg, loop: loop, ring: make([]entry, 64)}
}

// Addr returns the server address.
func (c *Conn) Addr() string { return c.cfg.Addr }

// Up reports whether the connection is established.
func (c *Conn) Up() bool { return c.state == stateUp }

// Inflight returns the number of requests sent or buffered and not yet
// answered, its meta sibling's included.
func (c *Conn) Inflight() int {
	if c.meta != nil {
		return c.n + c.meta.n
	}
	return c.n
}

// Full reports whether the connection holds MaxInflight requests; callers
// should wait (see NotifyRoom) before sending more.
func (c *Conn) Full() bool { return c.n >= c.cfg.MaxInflight }

// NotifyRoom registers fn to run on the loop once the connection has room
// for more requests again (or fails). Each fn runs once.
func (c *Conn) NotifyRoom(fn func()) { c.waitingUp = append(c.waitingUp, fn) }
