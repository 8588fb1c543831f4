package upstream

import (
	"errors"
	"io"
	"strconv"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// memcached's item size limit (its -I, `stats settings` item_size_max):
// the health prober asks each server for it beside its VERSION, and the
// proxy refuses a write larger than the smallest of them itself, as
// memcached would refuse it, instead of sending it the value.

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
// yet. A server keeps the figure of its last good probe while it is down.
// Safe from any goroutine; two atomic loads.
func (p *Pool) ItemSizeMax() int64 { return p.set.Load().health.itemMin.Load() }
