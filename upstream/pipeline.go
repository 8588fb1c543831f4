package upstream

// The requests in flight on a Conn, oldest first, are a ring of entries:
// ring[head] is the oldest of n, and the last unsent of them are still
// buffered in Conn.out (their sent time is 0).

// entry is one request in flight, sent or buffered.
type entry struct {
	opaque uint32
	quiet  bool
	stream bool  // STAT: several responses, the last with an empty key
	rawKey uint8 // meta: the length of the key a reply may echo raw (ForwardMeta)
	w      Waiter
	sent   int64 // unix nanoseconds when flushed, 0 while buffered
}

// push appends e as the newest request in flight, growing the ring when
// it is full.
func (c *Conn) push(e entry) {
	if c.n == len(c.ring) {
		nr := make([]entry, 2*len(c.ring))
		for i := 0; i < c.n; i++ {
			nr[i] = c.ring[(c.head+i)%len(c.ring)]
		}
		c.ring, c.head = nr, 0
	}
	c.ring[(c.head+c.n)%len(c.ring)] = e
	c.n++
	c.unsent++
}

// front returns the oldest request in flight; c.n must be > 0.
func (c *Conn) front() *entry { return &c.ring[c.head] }

// pop removes and returns the oldest request in flight; c.n must be > 0.
func (c *Conn) pop() entry {
	e := c.ring[c.head]
	c.ring[c.head] = entry{}
	c.head = (c.head + 1) % len(c.ring)
	c.n--
	if c.unsent > c.n {
		c.unsent = c.n
	}
	return e
}

// roomCheck runs the NotifyRoom callbacks once at most half of
// MaxInflight is in flight.
func (c *Conn) roomCheck() {
	if len(c.waitingUp) > 0 && c.n <= c.cfg.MaxInflight/2 {
		c.wakeWaiters()
	}
}

// wakeWaiters runs and forgets every NotifyRoom callback.
func (c *Conn) wakeWaiters() {
	ws := c.waitingUp
	c.waitingUp = nil
	for _, fn := range ws {
		fn()
	}
}
