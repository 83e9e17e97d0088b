// SPDX-License-Identifier: MIT

package reexec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	envTestFD   = "REEXEC_TEST_FD"
	envTestMode = "REEXEC_TEST_MODE"
)

// TestMain makes the test binary its own helper child when envTestFD is
// set, as the real callers' main does.
func TestMain(m *testing.M) {
	if _, ok := os.LookupEnv(envTestFD); ok {
		os.Exit(child(os.Getenv(envTestMode)))
	}
	os.Exit(m.Run())
}

// child runs one of the test children and returns its exit code.
func child(mode string) int {
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
	}
	return 5
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
