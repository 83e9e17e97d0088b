// SPDX-License-Identifier: MIT

package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// logDir is where one configuration's daemons write their output: a
// directory under the run's result directory (bench/results/STAMP/logs/…).
type logDir string

// file returns a new file name in d for name ("ocserv" → ocserv.log, then
// ocserv.2.log, …).
func (d logDir) file(name string) string {
	p := filepath.Join(string(d), name+".log")
	for i := 2; ; i++ {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			return p
		}
		p = filepath.Join(string(d), fmt.Sprintf("%s.%d.log", name, i))
	}
}

// daemon is a background command whose stdout and stderr go to a file
// (not to memory: vpnns, ocserv and iperf3 -s print per packet or per
// second for as long as they run). Its process group is killed at cleanup.
type daemon struct {
	cmd  *osexec.Cmd
	log  string
	done chan struct{}
	err  error // set before done is closed
}

// startDaemon starts name in namespace ns as u (nil: root) with stdin,
// output appended to a new file in logs named after tag.
func startDaemon(t *testing.T, tp *topology.Topology, logs logDir, tag, ns string, u *topology.User, stdin, name string, args ...string) *daemon {
	t.Helper()
	if err := os.MkdirAll(string(logs), 0o755); err != nil {
		t.Fatalf("log dir: %v", err)
	}
	path := logs.file(tag)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("log file: %v", err)
	}
	fmt.Fprintf(f, "# %s %s: %s %s\n", time.Now().UTC().Format(time.RFC3339), ns, name, strings.Join(args, " "))
	cmd := tp.Command(context.Background(), ns, u, name, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	d := &daemon{cmd: cmd, log: path, done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		f.Close()
		close(d.done)
	}()
	t.Cleanup(d.kill)
	return d
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// exitedCode is like topology.Process.Exited.
func (d *daemon) exitedCode() (bool, int) {
	select {
	case <-d.done:
		return true, topology.ExitCode(d.err)
	default:
		return false, 0
	}
}

// wait waits up to timeout for the daemon to exit and returns its code.
func (d *daemon) wait(timeout time.Duration) (int, error) {
	select {
	case <-d.done:
		return topology.ExitCode(d.err), nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s: still running after %v", d.log, timeout)
	}
}

// kill kills the daemon's process group by PID and waits (bounded) for it.
func (d *daemon) kill() {
	_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-d.done:
	case <-time.After(10 * time.Second):
	}
}

// output returns the last 6000 bytes of the daemon's log file.
func (d *daemon) output() string { return tailFile(d.log, 6000) }

// contains reports whether the log file holds s (read in full: for
// start-up markers, while the file is small).
func (d *daemon) contains(s string) bool {
	b, _ := os.ReadFile(d.log)
	return strings.Contains(string(b), s)
}

// describe is the log's name, state and tail, for messages.
func (d *daemon) describe() string {
	state := "running"
	if ok, code := d.exitedCode(); ok {
		state = fmt.Sprintf("exited %d", code)
	}
	return fmt.Sprintf("%s (%s):\n%s", d.log, state, d.output())
}

func tailFile(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return string(b)
}
