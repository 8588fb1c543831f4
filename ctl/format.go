package ctl

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
)

// formatStats returns STAT pairs as aligned "key value" lines.
func formatStats(kv [][2]string) string {
	w := 0
	for _, p := range kv {
		w = max(w, len(p[0]))
	}
	var b strings.Builder
	for _, p := range kv {
		fmt.Fprintf(&b, "%-*s %s\n", w, sanitize(p[0]), sanitize(p[1]))
	}
	return b.String()
}

// formatThrottleTable returns the STAT group "throttle" as a node summary
// and a table with one row per bucket, sorted by name. In fleet mode the
// summary also names the fleet's state and this instance's shares, and the
// table gains LOCAL_RES and LOCAL_HARD (this instance's shares) beside the
// fleet's RESERVED and HARD_LIMIT, and FLEET/S (the whole fleet's usage,
// "-" until known) beside UNITS/S (this instance's).
func formatThrottleTable(ts mcclient.ThrottleStats) string {
	var b strings.Builder
	fl := ts.Fleet
	fmt.Fprintf(&b, "node capacity:  %s units/s\n", ts.Node.Capacity)
	if fl == nil {
		fmt.Fprintf(&b, "node free pool: %s units/s%s\n\n", ts.Node.FreePool, poolMode(ts.Node.FreePoolMode))
	} else {
		fmt.Fprintf(&b, "node free pool: %s units/s%s\n", ts.Node.FreePool, poolMode(ts.Node.FreePoolMode))
		fmt.Fprintf(&b, "fleet:          %s\n", fleetStatus(fl))
		fmt.Fprintf(&b, "this instance:  %s, capacity %s units/s, free pool %s units/s\n\n",
			sanitize(fl.Instance), fl.LocalCapacity, fl.LocalFreePool)
	}
	buckets := slices.Clone(ts.Buckets)
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].Name < buckets[j].Name })
	rows := [][]string{{"BUCKET", "RESERVED", "HARD_LIMIT", "WEIGHT", "UNITS/S", "UNITS", "READ", "WRITE", "COMMANDS", "THROTTLED", "REJECTED", "HELD", "CONNS"}}
	if fl != nil {
		rows[0] = slices.Insert(rows[0], 3, "LOCAL_RES", "LOCAL_HARD")
		rows[0] = slices.Insert(rows[0], 7, "FLEET/S")
	}
	for _, bs := range buckets {
		row := []string{
			bs.Name, bs.Reserved.String(), bs.HardLimit.String(), weightText(bs),
			u64(bs.UnitsPerSec), u64(bs.UnitsTotal), u64(bs.ReadUnitsTotal), u64(bs.WriteUnitsTotal),
			u64(bs.CommandsTotal), u64(bs.ThrottledTotal), u64(bs.RejectedTotal),
			u64(bs.HeldSessions), u64(bs.Connections),
		}
		if fl != nil {
			row = slices.Insert(row, 3, bs.LocalReserved.String(), bs.LocalHardLimit.String())
			row = slices.Insert(row, 7, fleetUnits(bs))
		}
		rows = append(rows, row)
	}
	if len(buckets) == 0 {
		b.WriteString("no buckets visible\n")
		return b.String()
	}
	b.WriteString(alignTable(rows))
	return b.String()
}

// weightText is a bucket's weight, "-" when the server does not report it
// (a proxy that predates weights).
func weightText(bs mcclient.BucketStats) string {
	if !bs.HasWeight {
		return "-"
	}
	return u64(bs.Weight)
}

// alignTable lays out rows as columns separated by two spaces: the first
// column left-aligned, the others (numbers) right-aligned.
func alignTable(rows [][]string) string {
	var widths []int
	for _, r := range rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		for i, c := range r {
			switch {
			case i == 0:
				fmt.Fprintf(&b, "%-*s", widths[i], c)
			default:
				fmt.Fprintf(&b, "  %*s", widths[i], c)
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// fleetStatus describes the fleet's state in one line: how many instances,
// whether the store answers, and whether the on_store_loss rule applies.
func fleetStatus(fl *mcclient.FleetStats) string {
	s := fmt.Sprintf("%d instances", fl.Instances)
	if fl.Instances == 1 {
		s = "1 instance"
	}
	if fl.StoreUp {
		s += ", store up"
	} else {
		s += ", store DOWN"
	}
	if fl.Fallback {
		s += ", fallback (on_store_loss)"
	}
	return s
}

// fleetUnits is the fleet's usage of a bucket in units/s, "-" until known.
func fleetUnits(bs mcclient.BucketStats) string {
	if !bs.HasFleetUnits {
		return "-"
	}
	return u64(bs.FleetUnitsPerSec)
}

// u64 formats n in decimal.
func u64(n uint64) string { return strconv.FormatUint(n, 10) }

// sanitize replaces control characters so that text from the server cannot
// drive the terminal.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return '?'
		}
		return r
	}, s)
}
