package ctl

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/throttle"
)

var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]`)

// topFrames runs Top and returns its raw output and its frames, each a
// list of lines with the escape sequences removed.
func topFrames(t *testing.T, o Options, to TopOptions) (string, [][]string) {
	t.Helper()
	var b bytes.Buffer
	if err := Top(context.Background(), o, to, &b); err != nil {
		t.Fatalf("top: %v", err)
	}
	out := b.String()
	var frames [][]string
	for _, fr := range strings.Split(out, ansiHome)[1:] {
		frames = append(frames, strings.Split(strings.TrimSuffix(ansiEscape.ReplaceAllString(fr, ""), "\n"), "\n"))
	}
	return out, frames
}

func TestCtlTop(t *testing.T) {
	t.Setenv("LINES", "")
	f := startFake(t, false)
	for _, cols := range []int{80, 50, 132} {
		t.Run(fmt.Sprint(cols), func(t *testing.T) {
			t.Setenv("COLUMNS", fmt.Sprint(cols))
			out, frames := topFrames(t, opts(f.addr, "admin", fakeAdminPW), TopOptions{Iterations: 2, Interval: 20 * time.Millisecond})
			if !strings.HasPrefix(out, ansiHideCursor+ansiClear+ansiHome) || !strings.HasSuffix(out, ansiShowCursor) {
				t.Errorf("cursor not hidden then restored: starts %q, ends %q", out[:min(20, len(out))], out[max(0, len(out)-20):])
			}
			if len(frames) != 2 {
				t.Fatalf("%d frames, want 2:\n%s", len(frames), out)
			}
			for i, fr := range frames {
				t.Logf("frame %d at %d columns:\n%s", i+1, cols, strings.Join(fr, "\n"))
				web, batch := -1, -1
				for j, l := range fr {
					if n := utf8.RuneCountInString(l); n > cols {
						t.Errorf("frame %d line %d is %d columns wide: %q", i+1, j, n, l)
					}
					switch {
					case strings.HasPrefix(l, "web "):
						web = j
					case strings.HasPrefix(l, "analy"):
						batch = j
					}
				}
				if web < 0 || batch < 0 || web > batch {
					t.Errorf("frame %d: web at line %d, analytics at line %d; want both, web (busier) first", i+1, web, batch)
				}
				if all := strings.Join(fr, "\n"); !strings.Contains(all, "capacity 25000/s  free pool 15000/s (fcfs)") || !strings.Contains(all, "used 16600/s (66%)") {
					t.Errorf("frame %d lacks the node header", i+1)
				}
				// The weights, in the last column, at 80 columns and more.
				for _, l := range fr {
					fs := strings.Fields(l)
					if cols < 80 || len(fs) < 3 {
						continue
					}
					last := fs[len(fs)-1]
					switch {
					case fs[0] == "BUCKET" && last != "WEIGHT", fs[0] == "web" && last != "250", strings.HasPrefix(fs[0], "analy") && last != "1":
						t.Errorf("frame %d: no weight at the end of %q", i+1, l)
					}
				}
			}
			// The second frame has a rate of held commands for web.
			for _, l := range frames[1] {
				if fs := strings.Fields(l); cols >= 80 && strings.HasPrefix(l, "web ") && fs[len(fs)-4] == "-" { // THR/S HELD CONNS WEIGHT
					t.Errorf("no throttled/s in the second frame: %q", l)
				}
			}
		})
	}
}

func TestCtlTopFewLines(t *testing.T) {
	t.Setenv("COLUMNS", "80")
	t.Setenv("LINES", "7")
	f := startFake(t, false)
	_, frames := topFrames(t, opts(f.addr, "", ""), TopOptions{Iterations: 1})
	if len(frames) != 1 || len(frames[0]) != 6 || !strings.HasPrefix(frames[0][5], "... and 2 more buckets") {
		t.Fatalf("frames: %q", frames)
	}
}

func TestTopBar(t *testing.T) {
	lim := func(n uint64) throttle.Limit { return throttle.Limit(n) }
	unl := throttle.Unlimited
	cases := []struct {
		name           string
		width          int
		use            uint64
		reserved, hard throttle.Limit
		scale          uint64
		want           string
	}{
		{"marks", 18, 30, lim(35), lim(80), 100, "[#####|......:   ]"},
		{"use past reservation", 12, 70, lim(20), lim(100), 100, "[#|#####..:]"},
		{"at hard limit", 12, 100, lim(20), lim(100), 100, "[#|#######:]"},
		{"over hard limit", 12, 100, lim(10), lim(50), 100, "[|###:#####]"},
		{"unlimited hard limit", 12, 50, lim(0), unl, 100, "[#####.....]"},
		{"unlimited reservation", 12, 0, unl, unl, 100, "[..........]"},
		{"reservation equals hard limit", 12, 0, lim(50), lim(50), 100, "[....:     ]"},
		{"tiny use shows", 12, 1, lim(0), unl, 1000000, "[#.........]"},
		{"zero scale", 12, 0, lim(0), unl, 0, "[..........]"},
		{"zero scale, zero hard limit", 12, 0, lim(0), lim(0), 0, "[:         ]"},
		{"zero hard limit", 12, 0, lim(0), lim(0), 100, "[:         ]"},
		{"too narrow", 1, 5, lim(1), lim(10), 10, "[:]"},
	}
	for _, tc := range cases {
		if got := renderBar(tc.width, tc.use, tc.reserved, tc.hard, tc.scale); got != tc.want {
			t.Errorf("%s: renderBar(%d, %d, %v, %v, %d) = %q, want %q", tc.name, tc.width, tc.use, tc.reserved, tc.hard, tc.scale, got, tc.want)
		}
	}
	// Always exactly the width asked for.
	for w := 3; w < 40; w++ {
		for _, use := range []uint64{0, 1, 33, 99, 100} {
			if got := renderBar(w, use, lim(use/2), lim(100), 100); len(got) != w {
				t.Errorf("renderBar(%d, %d) = %q: %d columns", w, use, got, len(got))
			}
		}
	}
}

func TestTopHuman(t *testing.T) {
	for x, want := range map[float64]string{
		0: "0", 0.25: "0.2", 7: "7", 9999: "9999", 9999.6: "10.0k", 16600: "16.6k", 123456: "123k",
		999999: "1.00M", 1234567: "1.23M", 123456789012: "123G", 1e21: "1000E",
	} {
		if got := human(x); got != want {
			t.Errorf("human(%v) = %q, want %q", x, got, want)
		}
	}
}

// A top frame of a fleet instance at 80 columns, once the fleet's usage of
// every bucket is known: the fleet's line, FLEET/S right after UNITS/S,
// and bars marking this instance's shares.
func TestTopFleetFrame(t *testing.T) {
	now := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	v := &topView{addr: "127.0.0.1:11211", width: 80}
	for n := 1; n <= 2; n++ {
		ts, err := mcclient.ParseThrottleStats(fakeFleetThrottleStats(n))
		if err != nil {
			t.Fatal(err)
		}
		v.update(ts, now.Add(time.Duration(n)*time.Second))
	}
	got := strings.Join(v.lines("", now), "\n")
	want := strings.Join([]string{
		"kvthrottle top  127.0.0.1:11211                          10:00:00  Ctrl-C quits",
		"capacity 25000/s  free pool 15000/s (fcfs)  fleet used 23300/s (93%)  buckets 2",
		"fleet: 3 instances, store up  local capacity 18000/s  local used 16600/s (92%)",
		"bar: # local use  | local reserved  : local hard limit  (full bar = 15000/s)",
		"",
		"BUCKET    USE        UNITS/S FLEET/S RESERVED    HARD  THR/S  HELD CONNS WEIGHT",
		"web       [##|####:]   14500   19800    10000   20000     50     3   250    250",
		"analytic~ [#.......]    2100    3500        0   unlim      0     0    12      1",
	}, "\n")
	if got != want {
		t.Fatalf("frame:\n%s\nwant:\n%s", got, want)
	}
}

// ctl top against a fleet instance, from wide to narrow terminals: the
// fleet's usage is "-" until known, FLEET/S is the last number column to go
// after UNITS/S, and no line is wider than the terminal.
func TestCtlTopFleet(t *testing.T) {
	t.Setenv("LINES", "")
	for _, tc := range []struct {
		cols int
		hdr  []string // the number columns
	}{
		{132, []string{"UNITS/S", "FLEET/S", "RESERVED", "HARD", "THR/S", "HELD", "CONNS", "WEIGHT"}},
		{80, []string{"UNITS/S", "FLEET/S", "RESERVED", "HARD", "THR/S", "HELD", "CONNS", "WEIGHT"}},
		{50, []string{"UNITS/S", "FLEET/S", "RESERVED"}},
		{40, []string{"UNITS/S", "FLEET/S"}},
		{30, []string{"UNITS/S"}},
	} {
		t.Run(fmt.Sprint(tc.cols), func(t *testing.T) {
			t.Setenv("COLUMNS", fmt.Sprint(tc.cols))
			f := startFleetFake(t) // a fresh one: its first answer lacks a fleet usage
			out, frames := topFrames(t, opts(f.addr, "admin", fakeAdminPW), TopOptions{Iterations: 2, Interval: 20 * time.Millisecond})
			if len(frames) != 2 {
				t.Fatalf("%d frames, want 2:\n%s", len(frames), out)
			}
			for i, fr := range frames {
				t.Logf("frame %d at %d columns:\n%s", i+1, tc.cols, strings.Join(fr, "\n"))
				all := strings.Join(fr, "\n")
				if !strings.Contains(all, "fleet: 3 instances, store up") || !strings.Contains(all, "local capacity 18000/s") {
					t.Errorf("frame %d lacks the fleet's line", i+1)
				}
				if fleetUsed := []string{"fleet used -/s", "fleet used 23300/s (93%)"}[i]; !strings.Contains(all, fleetUsed) {
					t.Errorf("frame %d lacks %q", i+1, fleetUsed)
				}
				rows := map[string][]string{}
				for j, l := range fr {
					if n := utf8.RuneCountInString(l); n > tc.cols {
						t.Errorf("frame %d line %d is %d columns wide: %q", i+1, j, n, l)
					}
					fs := strings.Fields(l)
					if len(fs) > 2 && (fs[0] == "BUCKET" || fs[0] == "web" || strings.HasPrefix(fs[0], "analy")) {
						rows[fs[0][:3]] = fs[2:] // after the name and the bar
					}
				}
				if fmt.Sprint(rows["BUC"]) != fmt.Sprint(tc.hdr) {
					t.Fatalf("frame %d: number columns %q, want %q", i+1, rows["BUC"], tc.hdr)
				}
				// UNITS/S is this instance's, FLEET/S the fleet's.
				wantWeb := []string{"14500", "19800"}
				wantAna := [][]string{{"2100", "-"}, {"2100", "3500"}}[i]
				if n := min(len(tc.hdr), 2); fmt.Sprint(rows["web"][:n]) != fmt.Sprint(wantWeb[:n]) || fmt.Sprint(rows["ana"][:n]) != fmt.Sprint(wantAna[:n]) {
					t.Errorf("frame %d: web %q, analytics %q", i+1, rows["web"], rows["ana"])
				}
			}
		})
	}
}
