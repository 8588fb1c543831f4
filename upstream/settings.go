package upstream

import (
	"errors"
	"io"
	"strconv"
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// memcached's item size limit (its -I, `stats settings` item_size_max):
// the health prober asks each server for it beside its VERSION, and the
// proxy refuses a write larger than the limit of the key's server itself
// (LoopPool.ItemSizeMaxFor), as memcached would refuse it, instead of
// sending it the value.
//
// When the prober asks (settingsAsk): at every probe while the server
// answers; after an ask that got no figure (lost, late, or not memcached's
// answer: each holds the probe up to its timeout), again one probe later,
// then with the gap doubling up to a minute's worth of probes
// (maxSettingsGap), until an answer gives a figure; at the first probe
// after the server was down (a restart may change -I) at once. A figure
// stays in force until a later answer replaces it.

// maxSettingsGap is the longest wait, in time, between two asks of a
// server whose asks go unanswered.
const maxSettingsGap = time.Minute

// settingsAsk is the prober's schedule of one server's `stats settings`
// asks, counted in probes of that server (a probe brought forward by a
// lost connection counts too). The zero value asks at the next probe.
type settingsAsk struct {
	skip int // probes left to make without asking
	gap  int // probes from the last unanswered ask to the next; 0: the last ask was answered
}

// due reports whether this probe asks, and counts the probe.
func (a *settingsAsk) due() bool {
	if a.skip > 0 {
		a.skip--
		return false
	}
	return true
}

// answered: the ask gave a figure, or the server was down (ask at once
// when it answers again); the next probe asks.
func (a *settingsAsk) answered() { *a = settingsAsk{} }

// lost: the ask gave no figure; the next ask comes after twice the last
// gap (one probe the first time), at most maxGap probes.
func (a *settingsAsk) lost(maxGap int) {
	a.gap = max(1, min(2*a.gap, maxGap))
	a.skip = a.gap - 1
}

// maxSettingsFrames bounds the frames a probe reads of a `stats settings`
// answer (memcached 1.6 sends about 80, and an empty one last).
const maxSettingsFrames = 512

// maxSettingsBody bounds one frame of that answer.
const maxSettingsBody = 4096

// errBadSettings: the server's `stats settings` answer is not memcached's.
var errBadSettings = errors.New("unexpected response to STAT settings")

// readItemSizeMax sends a binary STAT "settings" on c and returns the
// item_size_max it reports, in bytes; 0 and an error when the answer does
// not say (a server that is not memcached, or an unexpected frame). The
// caller has set c's deadline.
func readItemSizeMax(c io.ReadWriter) (int64, error) {
	req := binary.AppendFrame(nil, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpStat, Opaque: 0x6b767469}, nil, nil, []byte("settings"), nil)
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	var found int64
	var hdr [binary.HeaderLen]byte
	body := make([]byte, 0, 256)
	for range maxSettingsFrames {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			return 0, err
		}
		h, _ := binary.ParseHeader(hdr[:])
		if h.Magic != binary.MagicResponse || h.Opcode != binary.OpStat || h.Status() != binary.StatusSuccess ||
			h.BodyLen > maxSettingsBody || h.Validate(maxSettingsBody) != nil {
			return 0, errBadSettings
		}
		body = body[:h.BodyLen]
		if _, err := io.ReadFull(c, body); err != nil {
			return 0, err
		}
		key := body[int(h.ExtLen) : int(h.ExtLen)+int(h.KeyLen)]
		if len(key) == 0 { // the end of the answer
			if found <= 0 {
				return 0, errBadSettings
			}
			return found, nil
		}
		if string(key) == "item_size_max" {
			v, err := strconv.ParseInt(string(body[int(h.ExtLen)+int(h.KeyLen):]), 10, 64)
			if err != nil || v <= 0 {
				return 0, errBadSettings
			}
			found = v
		}
	}
	return 0, errBadSettings
}

// minItemSize returns the smallest item_size_max among the servers whose
// probes reported one, 0 when none did.
func (h *health) minItemSize() int64 {
	var least int64
	for i := range h.itemMax {
		if v := h.itemMax[i].Load(); v > 0 && (least == 0 || v < least) {
			least = v
		}
	}
	return least
}

// ItemSizeMax returns the smallest item size limit (memcached's -I,
// `stats settings` item_size_max) among the servers in force, as their
// health probes last reported it, or 0 when no server has reported one
// yet. A server keeps the figure of its last answer while it is down. It
// bounds ItemSizeMaxFor from below: a write no longer than it fits every
// server whose limit is known. Safe from any goroutine; two atomic loads.
func (p *Pool) ItemSizeMax() int64 { return p.set.Load().health.itemMin.Load() }

// LeastItemSizeMax is Pool.ItemSizeMax of the server list the loop routes
// with (LoopPool.Tick adopts a new one).
func (lp *LoopPool) LeastItemSizeMax() int64 { return lp.set.health.itemMin.Load() }

// ItemSizeMaxFor returns the item size limit of the server Pick (and
// every group's Pick) sends key to now, on the server list the loop routes
// with: the key's own server on the ring, or, while that one is ejected,
// the server that takes its keys; 0 when that server has not told its
// limit yet. A server that is down but not ejected still gets its keys,
// and keeps its last figure for them; once ejected, its figure applies to
// no key. Only the loop's goroutine may call it; it allocates nothing.
func (lp *LoopPool) ItemSizeMaxFor(key []byte) int64 {
	set := lp.set
	return set.health.itemMax[set.server(key)].Load()
}
