package upstream

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// maxStatBody bounds one STAT answer frame a count accepts.
const maxStatBody = 4096

// CurrItems asks every server in force for its general statistics and
// returns the sum of their curr_items (the items memcached holds). It
// fails when any server does not answer within timeout: the caller cannot
// then know that the servers are empty. Safe for concurrent use; it dials
// its own connections (over TLS when the pool uses TLS) and closes them.
func (p *Pool) CurrItems(timeout time.Duration) (int64, error) {
	var total int64
	for _, addr := range p.set.Load().cfg.Servers {
		n, err := currItems(p.dialer, addr, timeout)
		if err != nil {
			return 0, fmt.Errorf("curr_items of %s: %w", addr, err)
		}
		total += n
	}
	return total, nil
}

var errNoCurrItems = errors.New("no curr_items in the STAT answer")

// currItems sends a binary STAT (no group) to addr and reads its answer
// up to the closing empty frame.
func currItems(d *dialer, addr string, timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	c, err := d.probeConn(addr, deadline)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(deadline)
	req := binary.AppendFrame(nil, binary.Header{Magic: binary.MagicRequest, Opcode: binary.OpStat, Opaque: 0x6b767469}, nil, nil, nil, nil)
	if _, err := c.Write(req); err != nil {
		return 0, err
	}
	r := bufio.NewReader(c)
	n, found := int64(0), false
	for {
		var hdr [binary.HeaderLen]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return 0, err
		}
		h, _ := binary.ParseHeader(hdr[:])
		if h.Magic != binary.MagicResponse || h.Opcode != binary.OpStat || h.Status() != binary.StatusSuccess ||
			h.BodyLen > maxStatBody || int(h.KeyLen)+int(h.ExtLen) > int(h.BodyLen) {
			return 0, errBadProbe
		}
		body := make([]byte, h.BodyLen)
		if _, err := io.ReadFull(r, body); err != nil {
			return 0, err
		}
		if h.KeyLen == 0 {
			if !found {
				return 0, errNoCurrItems
			}
			return n, nil
		}
		key := body[h.ExtLen : int(h.ExtLen)+int(h.KeyLen)]
		if string(key) == "curr_items" {
			v, err := strconv.ParseInt(string(body[int(h.ExtLen)+int(h.KeyLen):]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("curr_items: %w", err)
			}
			n, found = v, true
		}
	}
}
