// SPDX-License-Identifier: MIT

package bench

import (
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

var flagPerf = flag.String("bench.perf", "", "directory for a perf profile of the gateway's and the client's processes during every measured point (empty: none); see bench/README.md, \"Profiling\"")

// profiler records one measured point of the processes under roots with
// perf (call graphs, 997 Hz) and, when stopped, writes perf's flat report
// (self time by symbol) beside the data, so a profile can be read without
// the binary it was taken from.
type profiler struct {
	cmd  *exec.Cmd
	data string
}

// startPerf starts perf on the trees under gw and cli, one profile each, or
// returns nil profilers when -bench.perf is unset or a tree is empty.
func startPerf(t *testing.T, what string, gw, cli []int) []*profiler {
	if *flagPerf == "" {
		return nil
	}
	if err := os.MkdirAll(*flagPerf, 0o755); err != nil {
		t.Fatalf("bench.perf: %v", err)
	}
	var ps []*profiler
	for _, side := range []struct {
		name  string
		roots []int
	}{{"gateway", gw}, {"client", cli}} {
		var pids []string
		seen := map[int]bool{}
		for _, r := range side.roots {
			for _, p := range tree(r, seen, 0) {
				pids = append(pids, strconv.Itoa(p))
			}
		}
		if len(pids) == 0 {
			continue
		}
		data := filepath.Join(*flagPerf, sanitize(what)+"."+side.name+".data")
		cmd := exec.Command("perf", "record", "-q", "-g", "-F", "997", "-o", data, "-p", strings.Join(pids, ","))
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatalf("bench.perf: start perf (apt install linux-perf): %v", err)
		}
		ps = append(ps, &profiler{cmd: cmd, data: data})
	}
	return ps
}

// stopPerf ends the recordings and writes each flat report.
func stopPerf(t *testing.T, ps []*profiler) {
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
			t.Errorf("bench.perf: perf did not stop within 30 s: %s", p.data)
			continue
		}
		out, err := exec.Command("perf", "report", "-i", p.data, "--stdio", "--no-children",
			"--sort", "dso,symbol", "--percent-limit", "0.5", "-g", "none").Output()
		if err != nil {
			t.Errorf("bench.perf: report %s: %v", p.data, err)
			continue
		}
		if err := os.WriteFile(strings.TrimSuffix(p.data, ".data")+".txt", out, 0o644); err != nil {
			t.Errorf("bench.perf: %v", err)
		}
	}
}

// tree lists pid and its descendants.
func tree(pid int, seen map[int]bool, depth int) []int {
	if seen[pid] || depth > 32 {
		return nil
	}
	seen[pid] = true
	out := []int{pid}
	for _, c := range children(pid) {
		out = append(out, tree(c, seen, depth+1)...)
	}
	return out
}
