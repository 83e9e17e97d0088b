// SPDX-License-Identifier: MIT

package topology

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/syncbuf"
)

// Process is a command started in the background by Start. Its stdout and
// stderr are captured for failure messages. It is killed (its process
// group, by PID) at cleanup if still running. Safe for concurrent use.
type Process struct {
	Cmd  *exec.Cmd
	Name string // for messages: "NS: name args"

	out  *syncbuf.Buffer // stdout
	err  *syncbuf.Buffer // stderr
	done chan struct{}
	// waitErr is set before done is closed.
	waitErr error
}

// Start runs name in ns as u (nil means root) in the background and
// registers its termination with t.Cleanup. It fails the test if the
// command cannot be started. If the test fails, the cleanup logs the
// process's output.
func (tp *Topology) Start(t testing.TB, ns string, u *User, name string, args ...string) *Process {
	t.Helper()
	return startProcess(t, tp.Command(context.Background(), ns, u, name, args...), ns+": "+name+" "+strings.Join(args, " "))
}

// startProcess starts cmd (its own process group) in the background like
// Start, naming it name in messages.
func startProcess(t testing.TB, cmd *exec.Cmd, name string) *Process {
	t.Helper()
	p := &Process{
		Cmd:  cmd,
		Name: name,
		out:  &syncbuf.Buffer{},
		err:  &syncbuf.Buffer{},
		done: make(chan struct{}),
	}
	cmd.Stdout, cmd.Stderr = p.out, p.err
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.Name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() && (p.Stdout() != "" || p.Stderr() != "") {
			t.Logf("%s\n--- stdout ---\n%s\n--- stderr ---\n%s", p.Name, tail(p.Stdout(), 4000), tail(p.Stderr(), 8000))
		}
	})
	return p
}

// Stdout returns the output captured so far.
func (p *Process) Stdout() string { return p.out.String() }

// Stderr returns the error output captured so far.
func (p *Process) Stderr() string { return p.err.String() }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and its exit code (see
// ExitCode) if so.
func (p *Process) Exited() (bool, int) {
	select {
	case <-p.done:
		return true, ExitCode(p.waitErr)
	default:
		return false, 0
	}
}

// WaitStdout waits up to timeout for the process's output to contain s;
// it reports false if the process exited or time ran out first.
func (p *Process) WaitStdout(s string, timeout time.Duration) bool {
	return Poll(timeout, func() bool {
		ok, _ := p.Exited()
		return ok || strings.Contains(p.Stdout(), s)
	}) && strings.Contains(p.Stdout(), s)
}

// Poll calls cond, at once and then every 20 ms, until it returns true or
// timeout passes; it reports whether cond returned true. It is the one
// bounded wait on a condition of the tests: where an event has no
// channel to wait on, poll it with Poll rather than a loop of sleeps.
func Poll(timeout time.Duration, cond func() bool) bool {
	return PollEvery(timeout, 20*time.Millisecond, cond)
}

// PollEvery is Poll with another interval between the calls of cond: for
// a condition that is costly to check (it runs a command) or that must
// not be asked too often (each refused try counts against a rate limit).
func PollEvery(timeout, every time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			return cond()
		case <-tick.C:
		}
	}
	return true
}

// Signal sends sig to the process itself (not its group).
func (p *Process) Signal(sig syscall.Signal) error {
	return syscall.Kill(p.Cmd.Process.Pid, sig)
}

// Wait waits up to timeout for the process to exit and returns its exit
// code, or an error on timeout.
func (p *Process) Wait(timeout time.Duration) (int, error) {
	select {
	case <-p.done:
		return ExitCode(p.waitErr), nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("%s: still running after %v", p.Name, timeout)
	}
}

// Kill kills the process group with SIGKILL and waits (bounded) for the
// process to be reaped. It is idempotent.
func (p *Process) Kill() {
	select {
	case <-p.done:
		// Children that outlived the leader still carry the group id.
		_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
		return
	default:
	}
	_ = syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
	}
}

// Describe returns the name, exit state and output tails, for messages.
func (p *Process) Describe() string {
	state := "running"
	if ok, code := p.Exited(); ok {
		state = fmt.Sprintf("exited %d", code)
	}
	return fmt.Sprintf("%s (%s)\n--- stdout ---\n%s\n--- stderr ---\n%s", p.Name, state, tail(p.Stdout(), 2000), tail(p.Stderr(), 6000))
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
