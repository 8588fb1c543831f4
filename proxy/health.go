package proxy

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// health probes every memcached server once per interval with a NOOP on a
// connection of its own, so readiness and kvthrottle_upstream_up do not
// depend on client traffic. Its goroutine is owned by the Server: started
// by Serve, stopped by Shutdown.
type health struct {
	servers  []string
	up       []atomic.Bool
	timeout  time.Duration
	interval time.Duration
	log      zerolog.Logger
	stop     chan struct{}
	wg       sync.WaitGroup
}

func newHealth(servers []string, timeout time.Duration, log zerolog.Logger) *health {
	return &health{
		servers:  servers,
		up:       make([]atomic.Bool, len(servers)),
		timeout:  min(timeout, time.Second),
		interval: time.Second,
		log:      log,
		stop:     make(chan struct{}),
	}
}

func (h *health) start() {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(h.interval)
		defer t.Stop()
		for {
			h.probeAll()
			select {
			case <-h.stop:
				return
			case <-t.C:
			}
		}
	}()
}

func (h *health) close() {
	close(h.stop)
	h.wg.Wait()
}

func (h *health) probeAll() {
	for i, addr := range h.servers {
		err := probe(addr, h.timeout)
		was := h.up[i].Swap(err == nil)
		switch {
		case err != nil && was:
			h.log.Warn().Str("server", addr).Err(err).Msg("upstream server stopped answering")
		case err == nil && !was:
			h.log.Info().Str("server", addr).Msg("upstream server answers")
		}
	}
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

// probe sends a NOOP to addr and waits for its response.
func probe(addr string, timeout time.Duration) error {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	req := binary.AppendFrame(nil, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpNoop, Opaque: 0x6b767468}, nil, nil, nil, nil)
	if _, err := c.Write(req); err != nil {
		return err
	}
	var resp [binary.HeaderLen]byte
	if _, err := io.ReadFull(c, resp[:]); err != nil {
		return err
	}
	h, _ := binary.ParseHeader(resp[:])
	if h.Magic != binary.MagicResponse || h.Opcode != binary.OpNoop {
		return errBadProbe
	}
	return nil
}

var errBadProbe = errorString("unexpected response to NOOP")

type errorString string

func (e errorString) Error() string { return string(e) }
