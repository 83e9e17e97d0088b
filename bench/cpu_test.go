// SPDX-License-Identifier: MIT

package bench

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// clockTicks is USER_HZ, the unit of the times in /proc/PID/stat (100 on
// every Linux architecture Go supports here).
const clockTicks = 100

// treesCPU returns the CPU seconds (user+system, including reaped
// children) of the process trees rooted at roots.
func treesCPU(roots []int) float64 {
	var s float64
	seen := map[int]bool{}
	for _, r := range roots {
		s += treeCPU(r, seen, 0)
	}
	return s
}

func treeCPU(pid int, seen map[int]bool, depth int) float64 {
	if seen[pid] || depth > 32 {
		return 0
	}
	seen[pid] = true
	s := procCPU(pid)
	for _, c := range children(pid) {
		s += treeCPU(c, seen, depth+1)
	}
	return s
}

// procCPU returns utime+stime+cutime+cstime of pid in seconds, 0 if gone.
func procCPU(pid int) float64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	// Fields after ")": state(3) ... utime(14) stime(15) cutime(16) cstime(17).
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0
	}
	var ticks float64
	for _, k := range []int{11, 12, 13, 14} {
		v, _ := strconv.ParseFloat(f[k], 64)
		ticks += v
	}
	return ticks / clockTicks
}

// children returns the PIDs of the live children of pid (all threads).
func children(pid int) []int {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/children")
	var out []int
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// comm returns the command name of pid.
func comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

// findDescendant returns the first descendant of root (breadth first)
// whose comm is name, or 0.
func findDescendant(root int, name string) int {
	queue := []int{root}
	for n := 0; len(queue) > 0 && n < 1000; n++ {
		p := queue[0]
		queue = queue[1:]
		if p != root && comm(p) == name {
			return p
		}
		queue = append(queue, children(p)...)
	}
	return 0
}

// cpuTimes is the machine-wide line "cpu" of /proc/stat, in ticks.
type cpuTimes struct{ busy, total float64 }

func cpuStat() cpuTimes {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var c cpuTimes
	for i, s := range f[1:] {
		v, _ := strconv.ParseFloat(s, 64)
		if i >= 8 { // guest and guest_nice are included in user and nice
			break
		}
		c.total += v
		if i != 3 && i != 4 { // idle, iowait
			c.busy += v
		}
	}
	return c
}

// busyCores returns how many cores were busy on average between before
// and c.
func (c cpuTimes) busyCores(before cpuTimes) float64 {
	dt := c.total - before.total
	if dt <= 0 {
		return 0
	}
	return (c.busy - before.busy) / dt * float64(runtime.NumCPU())
}

// busyCores samples the machine's busy cores over window.
func busyCores(window time.Duration) float64 {
	c0 := cpuStat()
	time.Sleep(window)
	return cpuStat().busyCores(c0)
}

// loadAvg1 returns the 1-minute load average (-1 if unreadable).
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}
