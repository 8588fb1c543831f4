package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The machine is small and may be shared: cpuSnap measures how much CPU
// processes other than this program and its children used while a section
// ran, so a noisy result can be told from a slow proxy.

type cpuSnap struct {
	total   int64 // all jiffies of all CPUs
	userSys int64 // user+nice+system jiffies (process context)
	steal   int64
	ours    int64 // this process, its reaped children, and the live ones
	ok      bool
}

// takeCPU snapshots /proc/stat and the CPU time of this program, its reaped
// children (memcaslap, go test...) and the live children given.
func takeCPU(live ...int) cpuSnap {
	var s cpuSnap
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return s
	}
	v := make([]int64, 8)
	for i := range v {
		v[i], _ = strconv.ParseInt(f[i+1], 10, 64)
		s.total += v[i]
	}
	s.userSys = v[0] + v[1] + v[2]
	s.steal = v[7]
	self, err := procCPU("self", true)
	if err != nil {
		return s
	}
	s.ours = self
	for _, pid := range live {
		c, err := procCPU(strconv.Itoa(pid), true)
		if err != nil {
			return s
		}
		s.ours += c
	}
	s.ok = true
	return s
}

// procCPU returns utime+stime (+cutime+cstime) of /proc/PID/stat in jiffies.
func procCPU(pid string, children bool) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: split after its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("bad /proc/%s/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state); utime is field 14, so f[11].
	if len(f) < 15 {
		return 0, fmt.Errorf("short /proc/%s/stat", pid)
	}
	var sum int64
	n := 2
	if children {
		n = 4
	}
	for k := 0; k < n; k++ {
		v, _ := strconv.ParseInt(f[11+k], 10, 64)
		sum += v
	}
	return sum, nil
}

// cpuLoad is the share of the machine's CPU (all cores) used by others
// between two snapshots, and the share stolen by the hypervisor.
type cpuLoad struct {
	foreignPct, stealPct float64
	ok                   bool
}

func loadBetween(a, b cpuSnap) cpuLoad {
	if !a.ok || !b.ok || b.total <= a.total {
		return cpuLoad{}
	}
	total := float64(b.total - a.total)
	foreign := float64((b.userSys - a.userSys) - (b.ours - a.ours))
	return cpuLoad{
		foreignPct: max(0, 100*foreign/total),
		stealPct:   100 * float64(b.steal-a.steal) / total,
		ok:         true,
	}
}

func (l cpuLoad) String() string {
	if !l.ok {
		return "unknown"
	}
	s := fmt.Sprintf("%.0f%%", l.foreignPct)
	if l.stealPct >= 0.5 {
		s += fmt.Sprintf(" (+%.0f%% stolen by the hypervisor)", l.stealPct)
	}
	return s
}
