// SPDX-License-Identifier: MIT

package client

import (
	"bufio"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// becomeSubreaper makes processes that the job leaves behind (daemons,
// background children of an exiting shell) children of airlock run
// instead of init, so that killLeftovers can find them: without a
// namespace there is no other handle on them.
func becomeSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", err)
	}
	return nil
}

// killLeftovers kills, by PID, the processes the job left running (now
// airlock run's children, see becomeSubreaper) and reaps them, round after
// round as their own children are reparented, for at most max. Call it
// only after the job itself has been waited for.
func killLeftovers(log *slog.Logger, max time.Duration) {
	self := os.Getpid()
	deadline := time.Now().Add(max)
	for {
		kids := childrenOf(self)
		for _, pid := range kids {
			log.Debug("killing process the job left behind", "pid", pid)
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		// Reap whatever has exited (killed now or orphaned and exited
		// earlier); never blocks.
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
		if len(kids) == 0 || time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// childrenOf lists the processes whose parent is ppid, from /proc.
func childrenOf(ppid int) []int {
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if parentOf(pid) == ppid {
			out = append(out, pid)
		}
	}
	return out
}

// parentOf reads PPid from /proc/PID/status (0 if it cannot).
func parentOf(pid int) int {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
