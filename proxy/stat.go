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

// stat answers STAT (text: stats), in the shapes memcached 1.6 answers
// them, so that no client waits for an answer that does not come:
//   - the general group: for admins, memcached's own (server-wide);
//     for others, the proxy's view of their own bucket (generalStats);
//   - "throttle": the proxy's (throttleStats);
//   - a group memcached does not know (statGroupOf): memcached's answer,
//     ERROR for a text client, KeyEnoent "Not found" for a binary one;
//   - memcached's other groups describe every tenant: forwarded for
//     admins, refused to others (statRefused); memcached's text-only
//     groups (conns, extstore, cachedump), which the binary protocol the
//     proxy speaks upstream cannot ask for, are empty for everyone.
func (s *session) stat(r *request) bool {
	group := string(r.key)
	text := s.codec == codec(&s.text)
	switch {
	case group == "throttle":
		s.statReply(r, s.throttleStats())
	case group == "" && !s.isAdmin():
		s.statReply(r, s.generalStats())
	case group == "" || s.isAdmin() && statGroupOf(group, text) == statForward:
		return s.forward(r, nil)
	case statGroupOf(group, text) == statUnknown:
		s.localStatus(r, binary.StatusKeyEnoent, statNotFound)
	case statGroupOf(group, text) == statEmpty:
		s.statReply(r, nil)
	default:
		s.statRefused(r, group)
	}
	return true
}

// statNotFound is memcached's binary answer to a stats group it does not
// know (a text client gets ERROR: appendTextError).
const statNotFound = "Not found"

// statGroup is what the proxy does with a stats group memcached answers.
type statGroup uint8

const (
	statUnknown statGroup = iota // memcached does not know it
	statForward                  // memcached's; admins only
	statEmpty                    // memcached's text-only groups: empty
)

// statGroupOf classifies a stats group other than the general one and
// "throttle" as memcached 1.6 does for a client of that protocol (text:
// true). memcached's binary protocol takes "reset", "settings" and
// "detail" by prefix; its text protocol compares whole words and knows a
// few groups more.
func statGroupOf(group string, text bool) statGroup {
	switch group {
	case "items", "slabs", "sizes", "sizes_enable", "sizes_disable", "settings", "reset", "detail":
		return statForward
	case "conns", "extstore", "cachedump":
		if text {
			return statEmpty
		}
	}
	if !text {
		for _, p := range [...]string{"reset", "settings", "detail"} {
			if strings.HasPrefix(group, p) {
				return statForward
			}
		}
	}
	return statUnknown
}

// statRefused answers a group of memcached's the session may not see as
// memcached answers a group with nothing to show, so that every client
// reads the answer to its end and goes on: an empty group (text: END; a
// binary client: the terminator alone). Clients read a binary STAT answer
// either as a stream of stats up to a success frame with no key (dalli,
// libmemcached, spymemcached, memjs ...), or, for the groups memcached
// answers with a single frame (reset, detail), as one frame (dalli's
// reset_stats): those get KeyEnoent with the reason, memcached's answer to
// a detail command it does not take.
func (s *session) statRefused(r *request, group string) {
	if s.codec != codec(&s.text) && (strings.HasPrefix(group, "reset") || strings.HasPrefix(group, "detail")) {
		s.localStatus(r, binary.StatusKeyEnoent, "STAT "+group+" needs the admin privilege")
		return
	}
	s.statReply(r, nil)
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

// generalStats is the general group of a session that is not an admin's:
// memcached's names for what the proxy knows of the session's bucket. Its
// pid, uptime and time are the proxy's; its version is memcached's, the
// VERSION command's answer (absent while no server's is known, when
// VERSION is forwarded); curr_connections, the command counters
// (cmdstats.go), cmd_total and units_total are the bucket's. memcached's
// item and memory counters (curr_items, bytes ...) are not shown: they
// count every tenant's items, and the proxy cannot count a bucket's.
func (s *session) generalStats() [][2]string {
	srv := s.lp.srv
	now := time.Now()
	kv := [][2]string{
		{"pid", strconv.Itoa(os.Getpid())},
		{"uptime", strconv.FormatInt(int64(now.Sub(srv.started)/time.Second), 10)},
		{"time", strconv.FormatInt(now.Unix(), 10)},
	}
	if v := srv.pool.Version(); v != nil {
		kv = append(kv, [2]string{"version", string(v)})
	}
	kv = append(kv, [2]string{"kvthrottle_version", srv.version})
	if s.user != nil {
		kv = append(kv, [2]string{"user", s.user.Name})
	}
	if b := s.bkt; b != nil {
		s.lp.settleLeases() // the commands answered before this one included
		st := b.tb.Stats()
		kv = append(kv,
			[2]string{"bucket", b.name},
			[2]string{"curr_connections", strconv.FormatInt(b.conns.Load(), 10)})
		kv = appendCmdStats(kv, b)
		kv = append(kv,
			[2]string{"cmd_total", strconv.FormatUint(st.Commands, 10)},
			[2]string{"units_total", strconv.FormatUint(st.Units, 10)},
		)
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
