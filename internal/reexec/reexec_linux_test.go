// SPDX-License-Identifier: MIT

package reexec

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/test/topology"
)

const (
	envTestFD     = "REEXEC_TEST_FD"
	envTestMode   = "REEXEC_TEST_MODE"
	envTestConfig = "REEXEC_TEST_CONFIG"
)

// TestMain makes the test binary its own helper child when envTestFD is
// set, as the real callers' main does.
func TestMain(m *testing.M) {
	if _, ok := os.LookupEnv(envTestFD); ok {
		os.Exit(child(os.Getenv(envTestMode)))
	}
	if mode, ok := os.LookupEnv(envTestMiddle); ok {
		os.Exit(middle(mode))
	}
	os.Exit(m.Run())
}

// child runs one of the test children and returns its exit code.
func child(mode string) int {
	if mode == "deferred" {
		// The config comes on the pipe that envTestConfig names; the
		// reply's note says what arrived.
		var v struct {
			N int
			S string
		}
		c, err := FromEnvConfig(envTestFD, os.Getenv(envTestConfig), &v, "decode test config")
		if err != nil {
			return 1
		}
		defer c.Close()
		if c.ReplyNote(nil, fmt.Sprintf("%d %d", v.N, len(v.S))) != nil {
			return 2
		}
		return 0
	}
	if mode == "badconfig" {
		var v struct{ N int }
		if _, err := FromEnvConfig(envTestFD, `{"N":"x"}`, &v, "decode test config"); err == nil {
			return 6
		}
		return 1
	}
	c, err := FromEnv(envTestFD)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer c.Close()
	switch mode {
	case "fds":
		// A pipe whose write end carries a message, and its read end.
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			c.Reply(&StepError{Step: "make pipe", Err: err})
			return 1
		}
		unix.Write(p[1], []byte("hello"))
		if err := c.Reply(nil, p[0], p[1]); err != nil {
			return 1
		}
		if !c.WaitGo() {
			return 3
		}
		return 0
	case "fail":
		_, err := unix.Open("/nonexistent/reexec", unix.O_RDONLY, 0)
		c.Reply(fmt.Errorf("open: %w", &StepError{Step: "open the thing", Op: "open", Err: err}))
		return 1
	case "silent":
		return 4
	case "hang":
		time.Sleep(30 * time.Second)
	case "exec-other-thread", "execve-other-thread":
		if err := c.Reply(nil); err != nil || !c.WaitGo() {
			return 3
		}
		err := onOtherThread(func() error {
			fmt.Printf("%s%d %d\n", execTIDMarker, unix.Gettid(), os.Getpid())
			if mode == "execve-other-thread" {
				return syscall.Exec("/bin/sleep", []string{"sleep", "30"}, nil)
			}
			return c.Exec("/bin/sleep", []string{"sleep", "30"}, nil)
		})
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 5
}

// onOtherThread runs f on a goroutine locked to a thread other than the
// process's first one (which carries the parent-death signal) and returns
// its error.
func onOtherThread(f func() error) error {
	for {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread()
			if unix.Gettid() == os.Getpid() {
				errc <- nil
				select {} // keep the first thread busy; try again
			}
			errc <- f()
		}()
		if err := <-errc; err != nil {
			return err
		}
	}
}

const (
	// envTestMiddle selects middle mode: the parent that dies.
	envTestMiddle = "REEXEC_TEST_MIDDLE"
	execTIDMarker = "EXEC-TID "
)

// middle starts a child in mode with the parent-death signal set, lets it
// go, prints its PID and sleeps until the test kills it.
func middle(mode string) int {
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), envTestMode+"="+mode)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p, err := Start(cmd, envTestFD)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if _, err := p.Receive(context.Background()); err != nil || p.Go() != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("CHILD %d\n", cmd.Process.Pid)
	time.Sleep(60 * time.Second)
	return 0
}

func startChild(t *testing.T, mode string) (*exec.Cmd, *Parent) {
	t.Helper()
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), envTestMode+"="+mode)
	cmd.Stderr = os.Stderr
	p, err := Start(cmd, envTestFD)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		p.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, p
}

// startDeferred starts a child in deferred mode with StartDeferred.
func startDeferred(t *testing.T) (*exec.Cmd, *Parent) {
	t.Helper()
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = append(os.Environ(), envTestMode+"=deferred")
	cmd.Stderr = os.Stderr
	p, err := StartDeferred(cmd, envTestFD, envTestConfig)
	if err != nil {
		t.Fatalf("StartDeferred: %v", err)
	}
	t.Cleanup(func() {
		p.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd, p
}

// TestDeferredConfig sends a child started before its config is known
// its config on the pipe, small and larger than a pipe's buffer.
func TestDeferredConfig(t *testing.T) {
	for _, size := range []int{0, 1 << 20} {
		cmd, p := startDeferred(t)
		cfg := struct {
			N int
			S string
		}{42, strings.Repeat("x", size)}
		if err := p.SendConfig(cfg); err != nil {
			t.Fatalf("SendConfig: %v", err)
		}
		if err := p.SendConfig(cfg); err == nil {
			t.Errorf("second SendConfig: got nil error, want one")
		}
		if _, err := p.Receive(context.Background()); err != nil {
			t.Fatalf("Receive: %v", err)
		}
		if got, want := p.Note(), fmt.Sprintf("42 %d", size); got != want {
			t.Errorf("config the child read: got %q, want %q", got, want)
		}
		if err := cmd.Wait(); err != nil {
			t.Errorf("child: got %v, want exit 0", err)
		}
	}
}

// TestDeferredConfigGiveUp checks that a child waiting for its config
// gives up when the parent closes its end without sending one.
func TestDeferredConfigGiveUp(t *testing.T) {
	cmd, p := startDeferred(t)
	p.Close()
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("child after Close: got %v, want exit status 1", err)
	}
}

// TestSendConfigStarted checks that SendConfig refuses a child that
// Start started (its config was in its environment).
func TestSendConfigStarted(t *testing.T) {
	_, p := startChild(t, "fds")
	if err := p.SendConfig(1); err == nil {
		t.Errorf("SendConfig to a child of Start: got nil error, want one")
	}
}

func TestReplyWithDescriptors(t *testing.T) {
	cmd, p := startChild(t, "fds")
	files, err := p.Receive(context.Background(), "pipe-r", "pipe-w")
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	defer files[0].Close()
	defer files[1].Close()
	if files[0].Name() != "pipe-r" {
		t.Errorf("name: got %q, want pipe-r", files[0].Name())
	}
	// The child still holds the write end: read what it wrote, no more.
	b := make([]byte, 5)
	if _, err := io.ReadFull(files[0], b); err != nil || string(b) != "hello" {
		t.Errorf("read passed pipe: got %q, %v, want hello", b, err)
	}
	if err := p.Go(); err != nil {
		t.Fatalf("Go: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("child after Go: got %v, want exit 0", err)
	}
}

func TestReplyStepError(t *testing.T) {
	_, p := startChild(t, "fail")
	_, err := p.Receive(context.Background(), "x")
	var ce *ChildError
	if !errors.As(err, &ce) {
		t.Fatalf("Receive: got %v, want a *ChildError", err)
	}
	if ce.Reply.Step != "open the thing" || ce.Reply.Op != "open" {
		t.Errorf("step, op: got %q, %q, want %q, %q", ce.Reply.Step, ce.Reply.Op, "open the thing", "open")
	}
	if !errors.Is(err, unix.ENOENT) {
		t.Errorf("errors.Is(%v, ENOENT): got false, want true", err)
	}
	if want := "open the thing: no such file or directory"; err.Error() != want {
		t.Errorf("message: got %q, want %q", err.Error(), want)
	}
}

func TestNoReply(t *testing.T) {
	_, p := startChild(t, "silent")
	if _, err := p.Receive(context.Background()); !errors.Is(err, ErrNoReply) {
		t.Errorf("Receive: got %v, want ErrNoReply", err)
	}
}

func TestReceiveCanceled(t *testing.T) {
	_, p := startChild(t, "hang")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := p.Receive(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Receive: got %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Receive returned after %v, want about 200ms", d)
	}
}

func TestWaitGoEOF(t *testing.T) {
	cmd, p := startChild(t, "fds")
	files, err := p.Receive(context.Background(), "r", "w")
	if err != nil {
		t.Fatalf("Receive: %v", err)
	}
	files[0].Close()
	files[1].Close()
	p.Close()
	var ee *exec.ExitError
	if err := cmd.Wait(); !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("child after Close: got %v, want exit status 3 (WaitGo false)", err)
	}
}

func TestFromEnvConfigBad(t *testing.T) {
	_, p := startChild(t, "badconfig")
	_, err := p.Receive(context.Background())
	var ce *ChildError
	if !errors.As(err, &ce) || ce.Reply.Step != "decode test config" {
		t.Errorf("Receive: got %v, want the failed step %q", err, "decode test config")
	}
}

// TestExecKeepsParentDeath: a child that execs from a thread other than
// its first (as a Go child's main goroutine may, after it moved) loses the
// parent-death signal with a plain execve, so the program outlives the
// parent; with Child.Exec it dies with it.
func TestExecKeepsParentDeath(t *testing.T) {
	for _, tc := range []struct {
		mode     string
		survives bool
	}{{"execve-other-thread", true}, {"exec-other-thread", false}} {
		t.Run(tc.mode, func(t *testing.T) {
			mid := exec.Command("/proc/self/exe")
			mid.Env = append(os.Environ(), envTestMiddle+"="+tc.mode)
			mid.Stderr = os.Stderr
			out, err := mid.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := mid.Start(); err != nil {
				t.Fatal(err)
			}
			defer mid.Wait()
			defer mid.Process.Kill()
			var child, tid, pid int
			sc := bufio.NewScanner(out)
			for (child == 0 || tid == 0) && sc.Scan() {
				fmt.Sscanf(sc.Text(), "CHILD %d", &child)
				fmt.Sscanf(sc.Text(), execTIDMarker+"%d %d", &tid, &pid)
			}
			if child == 0 || tid == 0 || pid != child || tid == pid {
				t.Fatalf("child %d exec'd from thread %d of %d: want a thread other than the first", child, tid, pid)
			}
			defer unix.Kill(child, unix.SIGKILL)
			if !topology.Poll(10*time.Second, func() bool {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", child))
				return string(comm) == "sleep\n"
			}) {
				t.Fatalf("child %d did not exec sleep", child)
			}
			mid.Process.Kill()
			mid.Wait()
			// The parent-death signal went out before the parent became
			// a zombie; give the child's own exit a moment.
			wait := 5 * time.Second
			if tc.survives {
				wait = time.Second // what dies, dies in milliseconds
			}
			gone := topology.Poll(wait, func() bool { return exited(child) })
			if gone == tc.survives {
				t.Errorf("%s: child exited after its parent's death: %v, want %v", tc.mode, gone, !tc.survives)
			}
		})
	}
}

// exited reports whether pid is gone or a zombie.
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i > 0 && i+2 < len(b) && b[i+2] == 'Z'
}
