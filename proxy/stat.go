package proxy

import (
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/kvthrottle/kvthrottle/fleet"
	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// stat answers STAT. The general group and the "throttle" group are
// answered by the proxy and show a tenant only its own bucket; other
// groups are memcached's and, since they describe every tenant, are
// forwarded for admins only (statRefused answers the others).
func (s *session) stat(r *request) bool {
	group := string(r.key)
	switch group {
	case "":
		s.statReply(r, s.generalStats())
	case "throttle":
		s.statReply(r, s.throttleStats())
	default:
		if !s.isAdmin() {
			s.statRefused(r, group)
			return true
		}
		return s.forward(r, nil)
	}
	return true
}

// statRefused answers a STAT group the session may not see, in a shape
// every binary client reads to its end. Clients read a STAT answer in one
// of two ways: as a stream of stats up to a success frame with no key and
// no body (dalli, python-binary-memcached, libmemcached, spymemcached,
// memjs; dalli skips error frames and the python client any frame with a
// body, so an error frame leaves both waiting for their timeout, as it does
// against memcached itself), or, for the groups memcached answers with a
// single frame (reset, detail ...), as one frame (dalli's reset_stats).
// So the streamed groups get a well-formed, empty group holding one stat,
// "error", whose value is the reason; the single-frame groups get what
// memcached answers for a group it does not know: KeyEnoent (0x01), the
// reason as the body, and no terminator.
//
// A text client gets an error line instead ("CLIENT_ERROR STAT items needs
// the admin privilege"): text stats are lines, and a reason with spaces in
// a STAT line reads as its first word to most parsers.
func (s *session) statRefused(r *request, group string) {
	reason := "STAT " + group + " needs the admin privilege"
	if s.codec == codec(&s.text) {
		s.localStatus(r, binary.StatusEaccess, reason)
		return
	}
	if strings.HasPrefix(group, "reset") || strings.HasPrefix(group, "detail") {
		s.localStatus(r, binary.StatusKeyEnoent, reason)
		return
	}
	s.statReply(r, [][2]string{{"error", reason}})
}

// statReply queues one STAT response per pair, then the terminator.
func (s *session) statReply(r *request, kv [][2]string) {
	q := r.head()
	s.local(q, func(b []byte) []byte {
		for _, p := range kv {
			b = s.codec.appendResponse(b, q, response{op: q.op, status: binary.StatusSuccess, key: []byte(p[0]), value: []byte(p[1])})
		}
		return s.codec.appendResponse(b, q, response{op: q.op, status: binary.StatusSuccess})
	})
}

func (s *session) generalStats() [][2]string {
	srv := s.lp.srv
	now := time.Now()
	kv := [][2]string{
		{"pid", strconv.Itoa(os.Getpid())},
		{"uptime", strconv.FormatInt(int64(now.Sub(srv.started)/time.Second), 10)},
		{"time", strconv.FormatInt(now.Unix(), 10)},
		{"version", srv.version},
	}
	if s.user != nil {
		kv = append(kv, [2]string{"user", s.user.Name})
	}
	if b := s.bkt; b != nil {
		st := b.tb.Stats()
		kv = append(kv,
			[2]string{"bucket", b.name},
			[2]string{"curr_connections", strconv.FormatInt(b.conns.Load(), 10)},
			[2]string{"cmd_total", strconv.FormatUint(st.Commands, 10)},
			[2]string{"units_total", strconv.FormatUint(st.Units, 10)},
		)
	}
	if s.isAdmin() {
		kv = append(kv, [2]string{"total_connections", strconv.FormatInt(srv.conns.Load(), 10)})
	}
	return kv
}

// throttleStats is the "throttle" group: the node, then each bucket the
// session may see (admins: all; others: their own).
func (s *session) throttleStats() [][2]string {
	srv := s.lp.srv
	s.lp.settleLeases() // the commands answered before this one, pipelined with it, included
	ten := srv.ten.Load()
	kv := [][2]string{
		{"node:capacity", ten.cfg.Throttle.Capacity.String()},
		{"node:free_pool", freePool(ten.cfg).String()},
		{"node:free_pool_mode", srv.throttle.FreePoolMode().String()},
	}
	var grants *fleet.Grants
	if fs, ok := srv.Fleet(); ok {
		grants = srv.fleet.fl.Grants()
		kv = append(kv,
			[2]string{"fleet:instance", fs.Instance},
			[2]string{"fleet:store_up", strconv.FormatBool(fs.StoreUp)},
			[2]string{"fleet:fallback", strconv.FormatBool(fs.Fallback)},
			[2]string{"fleet:instances", strconv.Itoa(fs.Instances)},
			[2]string{"node:local_capacity", srv.throttle.Capacity().String()},
			[2]string{"node:local_free_pool", srv.throttle.FreePool().String()},
		)
	}
	var bs []*bucket
	if s.isAdmin() {
		for name := range ten.buckets {
			if b := ten.bucket(name); b != nil {
				bs = append(bs, b)
			}
		}
		sort.Slice(bs, func(i, j int) bool { return bs[i].name < bs[j].name })
	} else if s.bkt != nil {
		// The session's own bucket, even if a reload is removing it
		// right now (the table may no longer list it).
		bs = []*bucket{s.bkt}
	}
	for _, b := range bs {
		name := b.name
		st := b.tb.Stats()
		p := "bucket:" + name + ":"
		u := func(v uint64) string { return strconv.FormatUint(v, 10) }
		res, hard := ten.limits(name, st)
		kv = append(kv,
			[2]string{p + "reserved", res.String()},
			[2]string{p + "hard_limit", hard.String()},
			[2]string{p + "weight", strconv.Itoa(b.tb.Weight())},
			[2]string{p + "units_per_sec", strconv.FormatInt(int64(st.UnitsPerSecond+0.5), 10)},
			[2]string{p + "units_total", u(st.Units)},
			[2]string{p + "read_units_total", u(b.readUnits.Load())},
			[2]string{p + "write_units_total", u(b.writeUnits.Load())},
			[2]string{p + "commands_total", u(st.Commands)},
			[2]string{p + "throttled_total", u(st.Held)},
			[2]string{p + "rejected_total", u(st.Rejected)},
			[2]string{p + "held_sessions", strconv.Itoa(st.Waiting)},
			[2]string{p + "connections", strconv.FormatInt(b.conns.Load(), 10)},
		)
		if grants != nil {
			// This instance's shares, and the whole fleet's usage.
			kv = append(kv,
				[2]string{p + "local_reserved", st.Reserved.String()},
				[2]string{p + "local_hard_limit", st.HardLimit.String()})
			if bg, ok := grants.Bucket(name); ok && bg.FleetUnitsPerSecond >= 0 {
				kv = append(kv, [2]string{p + "fleet_units_per_sec", strconv.FormatInt(int64(bg.FleetUnitsPerSecond+0.5), 10)})
			}
		}
	}
	return kv
}
