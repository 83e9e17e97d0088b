// SPDX-License-Identifier: MIT

package seccompnotify

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/reexec"
)

// envFD names the variable that tells a re-executed airlock it is the shim
// and which fd leads back to the parent.
const envFD = "AIRLOCK_SECCOMP_SHIM_FD"

// install sets no_new_privs and installs the filter on the calling thread;
// it returns the notification fd.
func install() (int, error) {
	arch, err := nativeArch()
	if err != nil {
		return -1, err
	}
	filter, err := assemble(Filter(arch, unix.SYS_CONNECT))
	if err != nil {
		return -1, err
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return -1, fmt.Errorf("%w: prctl(PR_SET_NO_NEW_PRIVS): %v", ErrUnavailable, err)
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	// WAIT_KILLABLE_RECV (Linux 5.19) keeps signals (Go's preemption
	// SIGURG, timers) from restarting a connect the supervisor is already
	// working on; older kernels refuse the flag, then go without it.
	flags := []uintptr{
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER | unix.SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER,
	}
	var errno syscall.Errno
	for _, fl := range flags {
		fd, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, fl, uintptr(unsafe.Pointer(&prog)))
		runtime.KeepAlive(filter)
		if e == 0 {
			return int(fd), nil
		}
		errno = e
		if e != unix.EINVAL {
			break
		}
	}
	return -1, fmt.Errorf("%w: seccomp(SECCOMP_SET_MODE_FILTER, NEW_LISTENER): %v", ErrUnavailable, errno)
}

// stepInstall names the shim's one setup step in its errors.
const stepInstall = "install seccomp filter"

// Init turns a process started by [Start] into the shim: it installs the
// filter, sends the notification fd to the parent and execs the job. In any
// other process it returns at once. Call it first thing in main.
func Init() {
	if _, ok := os.LookupEnv(envFD); !ok {
		return
	}
	c, err := reexec.FromEnv(envFD)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: seccomp shim: %v\n", err)
		os.Exit(125)
	}
	// The filter belongs to this thread, and execve keeps the calling
	// thread's filter: both must happen on the same thread.
	runtime.LockOSThread()
	lfd, err := install()
	if err != nil {
		_ = c.Reply(&reexec.StepError{Step: stepInstall, Err: err})
		os.Exit(125)
	}
	if err := c.Reply(nil, lfd); err != nil {
		fmt.Fprintf(os.Stderr, "airlock: seccomp shim: send listener: %v\n", err)
		os.Exit(125)
	}
	unix.Close(lfd)
	// Wait until the parent holds the listener, so no connect of the job
	// can find nobody listening (it would fail with ENOSYS).
	if !c.WaitGo() {
		os.Exit(125)
	}
	c.Close()
	os.Exit(execJob(c, os.Args[1:]))
}

// execJob execs args like a shell would, dying with the parent (see
// reexec.Child.Exec); it returns only on failure, with the shell's exit
// code: 127 if the command is not found, 126 if it cannot be executed.
func execJob(c *reexec.Child, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "airlock: no command")
		return 127
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: %s: %v\n", args[0], err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return 127
		}
		return 126
	}
	err = c.Exec(path, args, os.Environ())
	fmt.Fprintf(os.Stderr, "airlock: exec %q: %v\n", args[0], err)
	if errors.Is(err, unix.ENOENT) {
		return 127
	}
	return 126
}

// Start starts cmd (its Path and Args are the job's command line, looked
// up in PATH by the shim) under the connect filter, by re-executing this
// binary as the shim, and returns the filter's notification fd for
// [Serve]. ready, if not nil, is called once the filter is in place, just
// before the shim execs the job. The binary's main must call [Init]. If the
// filter cannot be installed, the shim exits without running the job and
// the error matches [ErrUnavailable].
func Start(cmd *exec.Cmd, ready func()) (*os.File, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find own executable: %w", err)
	}
	cmd.Path = exe
	cmd.Args = append([]string{exe}, cmd.Args...)
	ctl, err := reexec.Start(cmd, envFD)
	if err != nil {
		return nil, fmt.Errorf("start seccomp shim: %w", err)
	}
	defer ctl.Close()
	fail := func(err error) (*os.File, error) {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, err
	}
	files, err := ctl.Receive(context.Background(), "seccomp-listener")
	var ce *reexec.ChildError
	switch {
	case errors.As(err, &ce):
		return fail(shimError{ce})
	case err != nil:
		return fail(fmt.Errorf("seccomp shim exited before reporting (%v)", err))
	}
	if ready != nil {
		ready()
	}
	if err := ctl.Go(); err != nil {
		files[0].Close()
		return fail(fmt.Errorf("seccomp shim: %w", err))
	}
	return files[0], nil
}

// shimError is the shim's report that it could not install the filter:
// its message is the shim's, and it matches ErrUnavailable and the errno.
type shimError struct{ ce *reexec.ChildError }

func (e shimError) Error() string   { return e.ce.Reply.Err }
func (e shimError) Unwrap() []error { return []error{ErrUnavailable, e.ce} }
