package ctl

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/throttle"
)

// ANSI sequences used by top: nothing beyond what every terminal emulator
// (and an SSH session's pty) understands.
const (
	ansiClear      = "\x1b[2J" // erase the whole screen
	ansiHome       = "\x1b[H"  // cursor to row 1, column 1
	ansiEraseLine  = "\x1b[K"  // erase to the end of the line
	ansiEraseBelow = "\x1b[J"  // erase to the end of the screen
	ansiHideCursor = "\x1b[?25l"
	ansiShowCursor = "\x1b[?25h"
)

// topMinRows is the least number of terminal rows top assumes: the
// header lines, one line for buckets and the last line left empty.
const topMinRows = 7

// topView holds what top shows between two frames.
type topView struct {
	addr   string
	width  int // terminal columns; lines use at most width-1
	height int // terminal rows, 0 when unknown

	stats     mcclient.ThrottleStats
	throttled map[string]float64 // commands held per second, by bucket
	prevTotal map[string]uint64  // throttled_total at prevAt
	prevAt    time.Time
}

// update records fresh stats taken at now and derives the per-second rate
// of held commands from the previous ones.
func (v *topView) update(ts mcclient.ThrottleStats, now time.Time) {
	dt := now.Sub(v.prevAt).Seconds()
	rates := make(map[string]float64, len(ts.Buckets))
	totals := make(map[string]uint64, len(ts.Buckets))
	for _, b := range ts.Buckets {
		totals[b.Name] = b.ThrottledTotal
		if prev, ok := v.prevTotal[b.Name]; ok && dt > 0 && b.ThrottledTotal >= prev {
			rates[b.Name] = float64(b.ThrottledTotal-prev) / dt
		}
	}
	v.stats, v.throttled, v.prevTotal, v.prevAt = ts, rates, totals, now
}

// topColumn is a number column of a bucket row: its title and width
// (each column is preceded by a space).
type topColumn struct {
	title string
	width int
}

// topColumns are the number columns, most important first: a narrow
// terminal drops them from the right. WEIGHT (of the bucket's share of the
// free pool in fair mode, "-" when the server does not report it) is a
// setting, not live, so it goes first.
var topColumns = []topColumn{
	{"UNITS/S", 7}, {"RESERVED", 8}, {"HARD", 7}, {"THR/S", 6}, {"HELD", 5}, {"CONNS", 5}, {"WEIGHT", 6},
}

// topFleetColumns are the number columns in fleet mode: FLEET/S (the
// whole fleet's usage) ranks second, after this instance's UNITS/S;
// RESERVED and HARD are then the fleet's limits.
var topFleetColumns = slices.Insert(slices.Clone(topColumns), 1, topColumn{"FLEET/S", 7})

// topLayout returns the widths of the bucket name and of the bar, and how
// many of cols fit, for a line of at most usable columns. A narrow
// terminal loses the last number columns first (the first one always
// stays), then name width.
func topLayout(usable, longestName int, cols []topColumn) (nameW, barW, ncols int) {
	const minName, minBar = 6, 10
	ncols = len(cols)
	fixed := func() int {
		w := 1 // the space between name and bar
		for _, c := range cols[:ncols] {
			w += 1 + c.width
		}
		return w
	}
	for ncols > 1 && fixed()+minName+minBar > usable {
		ncols--
	}
	nameW = min(max(longestName, minName), 12)
	barW = usable - fixed() - nameW
	if barW < minBar { // shorter names first
		nameW = max(minName, nameW-(minBar-barW))
		barW = max(usable-fixed()-nameW, 3)
	}
	if extra := barW - 30; extra > 0 && longestName > nameW { // wide terminal
		g := min(extra, min(longestName, 32)-nameW)
		nameW += g
		barW -= g
	}
	return nameW, barW, ncols
}

// lines returns the lines of one frame (without line ends or escapes),
// each at most v.width-1 columns wide. In fleet mode a header line gives
// the fleet's state and this instance's capacity, FLEET/S follows
// UNITS/S, and each bar shows this instance's usage against its own
// shares (local reserved and hard limit).
func (v *topView) lines(status string, now time.Time) []string {
	usable := v.width - 1
	ts := v.stats
	fl := ts.Fleet
	cols := topColumns
	// The limits the bar marks: the instance's own in fleet mode.
	marks := func(b mcclient.BucketStats) (reserved, hard throttle.Limit) { return b.Reserved, b.HardLimit }
	if fl != nil {
		cols = topFleetColumns
		marks = func(b mcclient.BucketStats) (throttle.Limit, throttle.Limit) {
			return b.LocalReserved, b.LocalHardLimit
		}
	}
	buckets := slices.Clone(ts.Buckets)
	slices.SortStableFunc(buckets, func(a, b mcclient.BucketStats) int {
		switch {
		case a.UnitsPerSec != b.UnitsPerSec:
			if a.UnitsPerSec > b.UnitsPerSec {
				return -1
			}
			return 1
		default:
			return strings.Compare(a.Name, b.Name)
		}
	})
	var used, fleetUsed, scale uint64
	fleetKnown := len(buckets) > 0 // the fleet's usage of every bucket
	longest := 0
	for _, b := range buckets {
		used += b.UnitsPerSec
		fleetUsed += b.FleetUnitsPerSec
		fleetKnown = fleetKnown && b.HasFleetUnits
		scale = max(scale, b.UnitsPerSec)
		res, hard := marks(b)
		if n, ok := hard.Finite(); ok {
			scale = max(scale, uint64(n))
		}
		if n, ok := res.Finite(); ok {
			scale = max(scale, uint64(n))
		}
		longest = max(longest, len(b.Name))
	}

	var out []string
	title := "kvthrottle top  " + sanitize(v.addr)
	clock := now.Format("15:04:05") + "  Ctrl-C quits"
	if pad := usable - utf8.RuneCountInString(title) - len(clock); pad >= 2 {
		title += strings.Repeat(" ", pad) + clock
	}
	out = append(out, title)
	parts := []string{
		"capacity " + ts.Node.Capacity.String() + "/s",
		"free pool " + ts.Node.FreePool.String() + "/s" + poolMode(ts.Node.FreePoolMode),
		"used " + strconv.FormatUint(used, 10) + "/s",
	}
	legend := []string{"bar: # units/s", "| reserved", ": hard limit"}
	if fl == nil {
		if c, ok := ts.Node.Capacity.Finite(); ok && c > 0 {
			parts[2] += fmt.Sprintf(" (%.0f%%)", 100*float64(used)/float64(c))
		}
	} else {
		// The node's limits are the fleet's: set the fleet's usage
		// against them (once known for every bucket), and this
		// instance's against its own share.
		parts[2] = "fleet used -/s"
		if fleetKnown {
			parts[2] = "fleet used " + strconv.FormatUint(fleetUsed, 10) + "/s"
			if c, ok := ts.Node.Capacity.Finite(); ok && c > 0 {
				parts[2] += fmt.Sprintf(" (%.0f%%)", 100*float64(fleetUsed)/float64(c))
			}
		}
		legend = []string{"bar: # local use", "| local reserved", ": local hard limit"}
	}
	parts = append(parts, fmt.Sprintf("buckets %d", len(buckets)))
	out = append(out, fitParts(parts, usable)...)
	if fl != nil {
		here := "local used " + strconv.FormatUint(used, 10) + "/s"
		if c, ok := fl.LocalCapacity.Finite(); ok && c > 0 {
			here += fmt.Sprintf(" (%.0f%%)", 100*float64(used)/float64(c))
		}
		out = append(out, fitParts([]string{"fleet: " + fleetStatus(fl), "local capacity " + fl.LocalCapacity.String() + "/s", here}, usable)...)
	}
	out = append(out, fitParts(append(legend, "(full bar = "+strconv.FormatUint(scale, 10)+"/s)"), usable)...)
	out = append(out, status)

	nameW, barW, ncols := topLayout(usable, longest, cols)
	hdr := fmt.Sprintf("%-*s %-*s", nameW, "BUCKET", barW, "USE")
	for _, c := range cols[:ncols] {
		hdr += fmt.Sprintf(" %*s", c.width, c.title)
	}
	out = append(out, hdr)
	if len(buckets) == 0 {
		out = append(out, "no buckets visible")
	}
	room := len(buckets)
	if v.height > 0 {
		// The last line stays free: a newline there would scroll.
		if avail := v.height - 1 - len(out); avail < len(buckets) {
			room = max(avail-1, 0)
		}
	}
	for _, b := range buckets[:room] {
		thr := "-"
		if r, ok := v.throttled[b.Name]; ok {
			thr = human(r)
		}
		res, hard := marks(b)
		row := fmt.Sprintf("%-*s %s", nameW, truncName(b.Name, nameW), renderBar(barW, b.UnitsPerSec, res, hard, scale))
		weight := "-"
		if b.HasWeight {
			weight = fitNumber(b.Weight, topColumns[6].width)
		}
		vals := []string{
			fitNumber(b.UnitsPerSec, topColumns[0].width), fitLimit(b.Reserved, topColumns[1].width),
			fitLimit(b.HardLimit, topColumns[2].width), thr,
			fitNumber(b.HeldSessions, topColumns[4].width), fitNumber(b.Connections, topColumns[5].width), weight,
		}
		if fl != nil {
			fleet := "-"
			if b.HasFleetUnits {
				fleet = fitNumber(b.FleetUnitsPerSec, topFleetColumns[1].width)
			}
			vals = slices.Insert(vals, 1, fleet)
		}
		for i, val := range vals[:ncols] {
			row += fmt.Sprintf(" %*s", cols[i].width, val)
		}
		out = append(out, row)
	}
	if room < len(buckets) {
		out = append(out, fmt.Sprintf("... and %d more buckets (enlarge the terminal and set LINES)", len(buckets)-room))
	}
	for i, l := range out {
		out[i] = clip(l, usable)
	}
	return out
}

// poolMode returns " (MODE)" for the free pool's sharing mode, "" when the
// server does not say (a proxy that predates it).
func poolMode(mode string) string {
	if mode == "" {
		return ""
	}
	return " (" + sanitize(mode) + ")"
}

// render returns the bytes of one frame: with ANSI, drawn over the
// previous frame from the top left corner (erasing what is left of it);
// without, followed by a blank line.
func (v *topView) render(lines []string, ansi, first bool) string {
	var b strings.Builder
	if !ansi {
		for _, l := range lines {
			b.WriteString(l)
			b.WriteByte('\n')
		}
		b.WriteByte('\n')
		return b.String()
	}
	if first {
		b.WriteString(ansiClear)
	}
	b.WriteString(ansiHome)
	for _, l := range lines {
		b.WriteString(l)
		b.WriteString(ansiEraseLine)
		b.WriteByte('\n')
	}
	b.WriteString(ansiEraseBelow)
	return b.String()
}

// renderBar returns a gauge of exactly width columns (at least 3):
// "[" + width-2 cells + "]". Cells up to use/scale are '#', the others '.'
// up to the hard limit and ' ' beyond it; '|' marks the reservation (none
// when it is 0 or unlimited) and ':' the hard limit (none when unlimited),
// each in the cell whose right edge is nearest its value; the hard-limit
// mark wins when both fall in one cell. With scale 0 every value counts as
// 0: an empty gauge, with the hard-limit mark first when the limit is finite.
func renderBar(width int, use uint64, reserved, hard throttle.Limit, scale uint64) string {
	n := max(width, 3) - 2
	frac := func(x uint64) float64 {
		if scale == 0 {
			return 0
		}
		return min(float64(x)/float64(scale), 1)
	}
	mark := func(x uint64) int {
		return min(max(int(math.Round(frac(x)*float64(n)))-1, 0), n-1)
	}
	fill := int(math.Round(frac(use) * float64(n)))
	if use > 0 && scale > 0 && fill == 0 {
		fill = 1 // any use shows
	}
	hardAt := n
	hardUnits, hardFinite := hard.Finite()
	if hardFinite {
		hardAt = mark(uint64(hardUnits))
	}
	cells := make([]byte, n)
	for i := range cells {
		switch {
		case i < fill:
			cells[i] = '#'
		case i > hardAt:
			cells[i] = ' '
		default:
			cells[i] = '.'
		}
	}
	if r, ok := reserved.Finite(); ok && r > 0 {
		cells[mark(uint64(r))] = '|'
	}
	if hardFinite {
		cells[hardAt] = ':'
	}
	return "[" + string(cells) + "]"
}

// human formats a non-negative rate or count in at most 5 columns:
// exact below 10000 (one decimal below 10 when fractional), otherwise
// three significant digits and a k, M, G, T, P or E suffix.
func human(x float64) string {
	switch {
	case x < 0 || math.IsNaN(x):
		return "-"
	case x < 10 && x != math.Trunc(x):
		return strconv.FormatFloat(x, 'f', 1, 64)
	case x < 9999.5:
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	const suffixes = "kMGTPE"
	for i := range len(suffixes) {
		x /= 1000
		if x < 999.5 || i == len(suffixes)-1 {
			switch {
			case x < 9.995:
				return strconv.FormatFloat(x, 'f', 2, 64) + suffixes[i:i+1]
			case x < 99.95:
				return strconv.FormatFloat(x, 'f', 1, 64) + suffixes[i:i+1]
			default:
				return strconv.FormatFloat(x, 'f', 0, 64) + suffixes[i:i+1]
			}
		}
	}
	return "-" // not reached
}

// fitNumber returns n in full when it fits in w columns, else human(n).
func fitNumber(n uint64, w int) string {
	if s := strconv.FormatUint(n, 10); len(s) <= w {
		return s
	}
	return human(float64(n))
}

// fitLimit is fitNumber for a limit, "unlim" when unlimited.
func fitLimit(l throttle.Limit, w int) string {
	n, ok := l.Finite()
	if !ok {
		return "unlim"
	}
	return fitNumber(uint64(n), w)
}

// truncName shortens name to w columns, marking the cut with '~'.
func truncName(name string, w int) string {
	name = sanitize(name)
	if utf8.RuneCountInString(name) <= w {
		return name
	}
	r := []rune(name)
	if w <= 1 {
		return string(r[:max(w, 0)])
	}
	return string(r[:w-1]) + "~"
}

// fitParts joins parts with two spaces into as few lines of at most w
// columns as it can (a part wider than w gets a line of its own).
func fitParts(parts []string, w int) []string {
	var lines []string
	cur := ""
	for _, p := range parts {
		switch {
		case cur == "":
			cur = p
		case utf8.RuneCountInString(cur)+2+utf8.RuneCountInString(p) <= w:
			cur += "  " + p
		default:
			lines = append(lines, cur)
			cur = p
		}
	}
	return append(lines, cur)
}

// clip cuts s to at most w runes.
func clip(s string, w int) string {
	if utf8.RuneCountInString(s) <= w {
		return s
	}
	return string([]rune(s)[:max(w, 0)])
}
