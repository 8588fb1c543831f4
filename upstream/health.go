package upstream

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// healthConfig configures probing and ejection.
type healthConfig struct {
	timeout    time.Duration // per probe
	interval   time.Duration // between probes of a server
	ejectAfter int           // failures in a row before ejection; 0: never
	ejectRetry time.Duration // how long an ejected server stays out
}

// health probes every memcached server of one server list with a VERSION
// on a connection of its own, so readiness and the servers' up state do
// not depend on client traffic, and ejects servers that fail ejectAfter
// times in a row. Its goroutine is owned by the Pool: started by
// Pool.Start (or by Pool.Update for a new list of a started Pool), stopped
// by Pool.Close (or by the Update that replaces the list).
type health struct {
	servers []string
	cfg     healthConfig
	log     zerolog.Logger
	dialer  *dialer // TLS or not (tls.go)

	up      []atomic.Bool
	ejected []atomic.Bool
	alive   atomic.Pointer[[]bool] // nil while no server is ejected

	versions []atomic.Pointer[[]byte] // each server's VERSION answer, from its last good probe
	itemMax  []atomic.Int64           // each server's item_size_max, from its last probe that told it; 0: unknown
	itemMin  atomic.Int64             // the least of itemMax's known figures (settings.go); 0: none known
	// asks: when each server is next asked for its `stats settings`
	// (settings.go; prober-owned).
	asks []settingsAsk

	kick    chan struct{} // a loop saw a connection fail: probe now
	stop    chan struct{}
	wg      sync.WaitGroup
	once    sync.Once
	started bool // start was called (under Pool.mu; read by tests)
}

func newHealth(servers []string, cfg healthConfig, log zerolog.Logger, d *dialer) *health {
	if cfg.timeout <= 0 || cfg.timeout > time.Second {
		cfg.timeout = time.Second
	}
	if cfg.interval <= 0 {
		cfg.interval = time.Second
	}
	return &health{
		servers:  servers,
		cfg:      cfg,
		log:      log,
		dialer:   d,
		up:       make([]atomic.Bool, len(servers)),
		ejected:  make([]atomic.Bool, len(servers)),
		versions: make([]atomic.Pointer[[]byte], len(servers)),
		itemMax:  make([]atomic.Int64, len(servers)),
		asks:     make([]settingsAsk, len(servers)),
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
}

// start starts the prober goroutine; the caller (the Pool, under its
// mutex) calls it at most once and stops it with close.
func (h *health) start() {
	h.started = true
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		fails := make([]int, len(h.servers))
		retryAt := make([]time.Time, len(h.servers))
		t := time.NewTicker(h.cfg.interval)
		defer t.Stop()
		for {
			h.probeAll(fails, retryAt)
			select {
			case <-h.stop:
				return
			case <-t.C:
			case <-h.kick:
			}
		}
	}()
}

// close stops the prober and waits for it; safe to call twice.
func (h *health) close() {
	h.once.Do(func() { close(h.stop) })
	h.wg.Wait()
}

// connFailed tells the prober that a loop lost a connection; it probes at
// once instead of at the next interval. Safe from any goroutine.
func (h *health) connFailed() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

func (h *health) probeAll(fails []int, retryAt []time.Time) {
	changed := false
probes:
	for i, addr := range h.servers {
		select {
		case <-h.stop: // closing: do not hold it up with more probes
			break probes
		default:
		}
		now := time.Now()
		if h.ejected[i].Load() && now.Before(retryAt[i]) {
			continue
		}
		if !h.up[i].Load() {
			h.asks[i].answered() // down or never up (maybe restarted with another -I): ask when it answers
		}
		ask := h.asks[i].due()
		v, itemMax, err := probe(h.dialer, addr, h.cfg.timeout, ask)
		if err == nil {
			if old := h.versions[i].Load(); old == nil || !bytes.Equal(*old, v) {
				h.versions[i].Store(&v)
			}
			switch {
			case itemMax > 0:
				h.itemMax[i].Store(itemMax)
				h.asks[i].answered()
			case ask:
				h.asks[i].lost(h.maxSettingsGap())
			}
		}
		was := h.up[i].Swap(err == nil)
		switch {
		case err != nil && was:
			h.log.Warn().Str("server", addr).Err(err).Msg("upstream server stopped answering")
		case err == nil && !was:
			h.log.Info().Str("server", addr).Msg("upstream server answers")
		}
		if err == nil {
			fails[i] = 0
			if h.ejected[i].Swap(false) {
				h.log.Info().Str("server", addr).Msg("upstream server back: its keys return to it")
				changed = true
			}
			continue
		}
		fails[i]++
		if h.cfg.ejectAfter > 0 && fails[i] >= h.cfg.ejectAfter {
			retryAt[i] = now.Add(h.cfg.ejectRetry)
			if !h.ejected[i].Swap(true) {
				h.log.Warn().Str("server", addr).Int("failures", fails[i]).Dur("retry_in", h.cfg.ejectRetry).
					Msg("upstream server ejected: its keys go to the other servers")
				changed = true
			}
		}
	}
	if changed {
		h.publish()
	}
	if least := h.minItemSize(); least != h.itemMin.Load() {
		h.itemMin.Store(least) // only on a change: the loops read it with every write
	}
}

// maxSettingsGap is maxSettingsGap in probes of a server: a minute's
// worth at the probe interval, at least one.
func (h *health) maxSettingsGap() int {
	return max(1, int(maxSettingsGap/h.cfg.interval))
}

// publish makes the ejection state visible to the loops.
func (h *health) publish() {
	alive := make([]bool, len(h.servers))
	any := false
	for i := range alive {
		alive[i] = !h.ejected[i].Load()
		any = any || !alive[i]
	}
	if !any {
		h.alive.Store(nil)
		return
	}
	h.alive.Store(&alive)
}

// inherit starts h, not yet started, from what old last saw of the servers
// both probe: whether each answered, its VERSION and its item_size_max.
// So a reload that keeps a server does not make it look down (readiness,
// VERSION) nor forget its item size limit until the new prober's first
// probe, which asks every server for its settings (old's ask schedule is
// its prober's own, not read here).
func (h *health) inherit(old *health) {
	for i, addr := range h.servers {
		if j := slices.Index(old.servers, addr); j >= 0 {
			h.up[i].Store(old.up[j].Load())
			h.versions[i].Store(old.versions[j].Load())
			h.itemMax[i].Store(old.itemMax[j].Load())
		}
	}
	h.itemMin.Store(h.minItemSize())
}

// anyUp reports whether at least one server answered the last probe.
func (h *health) anyUp() bool {
	for i := range h.up {
		if h.up[i].Load() {
			return true
		}
	}
	return false
}

// version returns the VERSION answer of the first server that answered
// its last probe, or nil when none did. The slice must not be modified.
// Safe from any goroutine.
func (h *health) version() []byte {
	for i := range h.up {
		if h.up[i].Load() {
			if v := h.versions[i].Load(); v != nil {
				return *v
			}
		}
	}
	return nil
}

// maxVersionLen bounds the VERSION answer a probe accepts (memcached's is
// a few bytes, such as "1.6.18").
const maxVersionLen = 64

// probe sends a VERSION to addr, over TLS when d makes TLS connections,
// and returns its answer; VERSION costs memcached no more than a NOOP, and
// the proxy answers its clients' VERSION with it (Pool.Version). Then,
// with settings, it asks for the server's `stats settings` and returns its
// item_size_max (settings.go), 0 when the server does not tell it (that
// does not make the server down; a server that never answers it holds the
// probe up to timeout, which is why the prober asks it less and less
// often, settingsAsk).
func probe(d *dialer, addr string, timeout time.Duration, settings bool) ([]byte, int64, error) {
	deadline := time.Now().Add(timeout)
	c, err := d.probeConn(addr, deadline)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	v, err := readVersion(c)
	if err != nil {
		return nil, 0, err
	}
	var itemMax int64
	if settings {
		itemMax, _ = readItemSizeMax(c)
	}
	return v, itemMax, nil
}

// readVersion sends a VERSION on c and returns its answer.
func readVersion(c io.ReadWriter) ([]byte, error) {
	req := binary.AppendFrame(nil, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpVersion, Opaque: 0x6b767468}, nil, nil, nil, nil)
	if _, err := c.Write(req); err != nil {
		return nil, err
	}
	var resp [binary.HeaderLen]byte
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		return nil, err
	}
	h, _ := binary.ParseHeader(resp[:])
	if h.Magic != binary.MagicResponse || h.Opcode != binary.OpVersion || h.Status() != binary.StatusSuccess ||
		h.BodyLen == 0 || h.BodyLen > maxVersionLen || h.ExtLen != 0 || h.KeyLen != 0 {
		return nil, errBadProbe
	}
	v := make([]byte, h.BodyLen)
	if _, err := io.ReadFull(c, v); err != nil {
		return nil, err
	}
	return v, nil
}

var errBadProbe = errors.New("unexpected response to VERSION")
