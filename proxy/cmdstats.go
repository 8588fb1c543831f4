package proxy

import (
	"strconv"

	"github.com/kvthrottle/kvthrottle/proto/binary"
)

// A bucket's command counters, named as memcached names its own in the
// general stats group (cmd_get, get_hits ...), so that a tenant's clients
// read their bucket's figures where they read memcached's. Each metered
// command adds to them once it completes: on its loop's lane while it was
// admitted through the lane's lease (folded into the bucket with the
// lease's units, lane.addUnits), else to the bucket directly.

// cmdStat indexes a bucket's command counters.
type cmdStat uint8

const (
	csCmdGet cmdStat = iota
	csCmdSet
	csCmdTouch
	csGetHits
	csGetMisses
	csDeleteMisses
	csDeleteHits
	csIncrMisses
	csIncrHits
	csDecrMisses
	csDecrHits
	csTouchHits
	csTouchMisses
	nCmdStats
	csNone = nCmdStats // no counter
)

// cmdStatNames are the counters' stat names, in memcached's order.
var cmdStatNames = [nCmdStats]string{
	csCmdGet: "cmd_get", csCmdSet: "cmd_set", csCmdTouch: "cmd_touch",
	csGetHits: "get_hits", csGetMisses: "get_misses",
	csDeleteMisses: "delete_misses", csDeleteHits: "delete_hits",
	csIncrMisses: "incr_misses", csIncrHits: "incr_hits",
	csDecrMisses: "decr_misses", csDecrHits: "decr_hits",
	csTouchHits: "touch_hits", csTouchMisses: "touch_misses",
}

// cmdStatsOf returns the counters a completed command of opcode op adds
// one to: its command count and its hit or miss count (csNone: none). hit
// says the command succeeded (a read: found its item; see slot.hit).
func cmdStatsOf(op binary.Opcode, hit bool) (cmd, outcome cmdStat) {
	pick := func(h, m cmdStat) cmdStat {
		if hit {
			return h
		}
		return m
	}
	switch op {
	case binary.OpGet, binary.OpGetQ, binary.OpGetK, binary.OpGetKQ:
		return csCmdGet, pick(csGetHits, csGetMisses)
	case binary.OpTouch, binary.OpGAT, binary.OpGATQ, binary.OpGATK, binary.OpGATKQ:
		return csCmdTouch, pick(csTouchHits, csTouchMisses)
	case binary.OpSet, binary.OpSetQ, binary.OpAdd, binary.OpAddQ, binary.OpReplace, binary.OpReplaceQ,
		binary.OpAppend, binary.OpAppendQ, binary.OpPrepend, binary.OpPrependQ:
		return csCmdSet, csNone
	case binary.OpDelete, binary.OpDeleteQ:
		return csNone, pick(csDeleteHits, csDeleteMisses)
	case binary.OpIncrement, binary.OpIncrementQ:
		return csNone, pick(csIncrHits, csIncrMisses)
	case binary.OpDecrement, binary.OpDecrementQ:
		return csNone, pick(csDecrHits, csDecrMisses)
	}
	return csNone, csNone
}

// countCmd counts a completed metered command of sl's: on the lane it was
// leased from, else on its bucket.
func countCmd(sl *slot) {
	cmd, outcome := cmdStatsOf(sl.req.op, sl.hit)
	if l := sl.leased; l != nil {
		if cmd != csNone {
			l.cmds[cmd]++
		}
		if outcome != csNone {
			l.cmds[outcome]++
		}
		return
	}
	if cmd != csNone {
		sl.bkt.cmds[cmd].Add(1)
	}
	if outcome != csNone {
		sl.bkt.cmds[outcome].Add(1)
	}
}

// addCmds folds the lane's command counts into its bucket's.
func (l *lane) addCmds() {
	for i, n := range l.cmds {
		if n > 0 {
			l.b.cmds[i].Add(n)
			l.cmds[i] = 0
		}
	}
}

// appendCmdStats appends bucket b's command counters as stats.
func appendCmdStats(kv [][2]string, b *bucket) [][2]string {
	for i := range b.cmds {
		kv = append(kv, [2]string{cmdStatNames[i], strconv.FormatUint(b.cmds[i].Load(), 10)})
	}
	return kv
}
