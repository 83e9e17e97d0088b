// SPDX-License-Identifier: MIT

package reexec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// goByte is the parent's one message to the child: go on.
	goByte = 'g'
	// maxReplyLen bounds a child's reply message.
	maxReplyLen = 64 << 10
	// maxFDs bounds the descriptors one reply may carry: the gateway's
	// private namespace sends a TUN queue per core (up to 64) and its
	// listener.
	maxFDs = 72
)

// ErrNoReply means the child closed its end (usually: it exited) without
// sending its reply.
var ErrNoReply = errors.New("helper child exited before it replied")

// Reply is the child's one message. An empty Step means success; the
// descriptors are then attached.
type Reply struct {
	// Step is the setup step that failed, in words ("create tun in job
	// namespace").
	Step string `json:"step,omitempty"`
	// Op is the operation within the step, where the parent needs it to
	// tell causes apart ("open" for opening /dev/net/tun).
	Op string `json:"op,omitempty"`
	// Err is the error's text.
	Err string `json:"err,omitempty"`
	// Errno is the innermost errno, 0 if none.
	Errno int `json:"errno,omitempty"`
	// Note is what a successful child has to say beside its descriptors
	// (something it could not do and did without), for the parent's log.
	Note string `json:"note,omitempty"`
}

// StepError is a setup failure in the child: which step, which operation
// and why. It is safe to compare Step and Op to the caller's constants.
type StepError struct {
	Step string
	Op   string
	Err  error
}

func (e *StepError) Error() string { return e.Step + ": " + e.Err.Error() }
func (e *StepError) Unwrap() error { return e.Err }

// ReplyFor returns the failure reply for err: its step and operation if it
// is (or wraps) a [StepError], else the step "setup"; and its innermost
// errno.
func ReplyFor(err error) Reply {
	r := Reply{Step: "setup", Err: err.Error()}
	var se *StepError
	if errors.As(err, &se) {
		r.Step, r.Op, r.Err = se.Step, se.Op, se.Err.Error()
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		r.Errno = int(errno)
	}
	return r
}

// ChildError is the parent's view of a child's failed step. errors.Is
// matches its errno.
type ChildError struct{ Reply Reply }

func (e *ChildError) Error() string { return e.Reply.Step + ": " + e.Reply.Err }

// Unwrap returns the child's errno, nil if it had none.
func (e *ChildError) Unwrap() error {
	if e.Reply.Errno == 0 {
		return nil
	}
	return syscall.Errno(e.Reply.Errno)
}

// IdentityMapped returns process attributes for a child in a new user
// namespace (cloneflags must include CLONE_NEWUSER) where the caller's uid
// and gid map to themselves, so files and processes keep their owner, with
// caps as ambient capabilities: a non-root uid loses its capabilities on
// execve, and these (of the new user namespace only) are what the child
// needs for setup. The child gets SIGKILL when the thread that started it
// dies.
func IdentityMapped(cloneflags uintptr, caps ...uintptr) *syscall.SysProcAttr {
	uid, gid := os.Getuid(), os.Getgid()
	return &syscall.SysProcAttr{
		Cloneflags:                 cloneflags,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}},
		GidMappingsEnableSetgroups: false,
		AmbientCaps:                caps,
		Pdeathsig:                  syscall.SIGKILL,
	}
}

// Parent is the parent's end of the socketpair to a started child. It is
// not safe for concurrent use.
type Parent struct {
	conn *net.UnixConn
	note string // the last successful reply's note
	// config is the write end of the config pipe of a child started by
	// [StartDeferred], until [Parent.SendConfig]; nil otherwise.
	config *os.File
}

// configFDPrefix starts the value of a child's config variable when the
// config comes later on a pipe ([StartDeferred]): "fd:N".
const configFDPrefix = "fd:"

// maxConfigLen bounds a config read from a pipe: a job's environment
// (at most a few MB of argv and environment, ARG_MAX) in JSON.
const maxConfigLen = 16 << 20

// StartDeferred is [Start] for a child whose config is not known yet: it
// starts cmd at once, with the read end of a new pipe as another extra
// file named by envConfig ("fd:N"), so that the child's start (exec, its
// runtime, namespaces) overlaps whatever the parent does next, and the
// child's [Main] blocks until [Parent.SendConfig] writes the config.
func StartDeferred(cmd *exec.Cmd, envFD, envConfig string) (*Parent, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("config pipe: %w", err)
	}
	fd := 3 + len(cmd.ExtraFiles)
	cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, envConfig+"="+configFDPrefix+strconv.Itoa(fd))
	p, err := Start(cmd, envFD)
	r.Close()
	cmd.ExtraFiles = cmd.ExtraFiles[:len(cmd.ExtraFiles)-1]
	if err != nil {
		w.Close()
		return nil, err
	}
	p.config = w
	return p, nil
}

// SendConfig writes v, as JSON, to the config pipe of a child started by
// [StartDeferred] and closes it; it may be called once.
func (p *Parent) SendConfig(v any) error {
	if p.config == nil {
		return errors.New("send config: child was not started by StartDeferred, or config already sent")
	}
	w := p.config
	p.config = nil
	b, err := json.Marshal(v)
	if err != nil {
		w.Close()
		return fmt.Errorf("encode config: %w", err)
	}
	_, err = w.Write(b)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("send config: %w", err)
	}
	return nil
}

// Start starts cmd with the child's end of a new socketpair as its next
// extra file, named in cmd's environment as envFD=N (cmd.Env nil means
// os.Environ()). It does not wait for cmd; the caller does, and closes the
// returned Parent when done with it.
func Start(cmd *exec.Cmd, envFD string) (*Parent, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	pf := os.NewFile(uintptr(fds[0]), "reexec-parent")
	child := os.NewFile(uintptr(fds[1]), "reexec-child")
	c, err := net.FileConn(pf)
	pf.Close()
	if err != nil {
		child.Close()
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	// ExtraFiles[i] is descriptor 3+i in the child, close-on-exec cleared.
	fd := 3 + len(cmd.ExtraFiles)
	cmd.ExtraFiles = append(cmd.ExtraFiles, child)
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, envFD+"="+strconv.Itoa(fd))
	err = cmd.Start()
	child.Close()
	cmd.ExtraFiles = cmd.ExtraFiles[:len(cmd.ExtraFiles)-1]
	if err != nil {
		c.Close()
		return nil, err
	}
	return &Parent{conn: c.(*net.UnixConn)}, nil
}

// Receive reads the child's reply and returns the descriptors it sent,
// as files with the given names; the child must send exactly len(names).
// A failed step is a [*ChildError]; a child that went away without a
// reply, [ErrNoReply]. ctx bounds the wait. The files are close-on-exec.
func (p *Parent) Receive(ctx context.Context, names ...string) ([]*os.File, error) {
	stop := context.AfterFunc(ctx, func() { p.conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	buf := make([]byte, maxReplyLen)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	n, oobn, _, _, err := p.conn.ReadMsgUnix(buf, oob) // sets MSG_CMSG_CLOEXEC
	if err != nil && !errors.Is(err, io.EOF) {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, fmt.Errorf("read reply: %w", err)
	}
	fds, perr := parseRights(oob[:oobn])
	if n == 0 && len(fds) == 0 {
		return nil, ErrNoReply
	}
	var r Reply
	if err := json.Unmarshal(buf[:n], &r); err != nil {
		closeAll(fds)
		return nil, fmt.Errorf("decode reply: %w", err)
	}
	if r.Step != "" {
		closeAll(fds)
		return nil, &ChildError{Reply: r}
	}
	if perr != nil || len(fds) != len(names) {
		closeAll(fds)
		return nil, fmt.Errorf("child sent %d descriptors, want %d (%v)", len(fds), len(names), perr)
	}
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		files[i] = os.NewFile(uintptr(fd), names[i])
	}
	p.note = r.Note
	return files, nil
}

// Note returns the note of the successful reply [Parent.Receive] read
// ([Child.ReplyNote]), "" if none.
func (p *Parent) Note() string { return p.note }

// Go tells a child waiting in [Child.WaitGo] to go on.
func (p *Parent) Go() error {
	if _, err := p.conn.Write([]byte{goByte}); err != nil {
		return fmt.Errorf("tell child to go on: %w", err)
	}
	return nil
}

// Close closes the parent's end; a child waiting in [Child.WaitGo] (or
// for its config) sees end of file.
func (p *Parent) Close() error {
	if p.config != nil {
		p.config.Close()
		p.config = nil
	}
	return p.conn.Close()
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("parse control message: %w", err)
	}
	var fds []int
	for _, m := range msgs {
		f, err := unix.ParseUnixRights(&m)
		if err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("parse control message: %w", err)
		}
		fds = append(fds, f...)
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Child is the child's end of the socketpair.
type Child struct {
	fd   int
	ppid int // the parent that started the child, for Exec's check
}

// FromEnv returns the child's end named by the environment variable envFD,
// set close-on-exec so the job the child may exec does not inherit it. The
// variable is removed from the environment.
func FromEnv(envFD string) (*Child, error) {
	v := os.Getenv(envFD)
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("bad %s=%q", envFD, v)
	}
	os.Unsetenv(envFD)
	unix.CloseOnExec(fd)
	return &Child{fd: fd, ppid: os.Getppid()}, nil
}

// Main makes this process the helper child that the environment variable
// envConfig selects, if it is set: it gets the socket and decodes the
// config (the JSON value of envConfig, or what the parent writes to the
// pipe it names, "fd:N", [StartDeferred]) into cfg as FromEnvConfig does,
// runs main and exits with its code. A child that cannot get either says
// so on stderr ("airlock: NAME: ...") and exits 1. In any other process
// Main returns at once. Call it first thing in the binary's main, through
// the caller's Init.
func Main(name, envConfig, envFD string, cfg any, step string, main func(*Child) int) {
	raw, ok := os.LookupEnv(envConfig)
	if !ok {
		return
	}
	c, err := FromEnvConfig(envFD, raw, cfg, step)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: %s: %v\n", name, err)
		os.Exit(1)
	}
	code := main(c)
	c.Close()
	os.Exit(code)
}

// FromEnvConfig is FromEnv followed by decoding the child's JSON config
// raw into v; raw "fd:N" is a pipe to read it from, until the parent
// closes it ([Parent.SendConfig]). A config that does not decode (or a
// pipe closed without one: the parent gave up) is sent to the parent as
// the failure of step, and the error is returned with the Child closed.
func FromEnvConfig(envFD, raw string, v any, step string) (*Child, error) {
	c, err := FromEnv(envFD)
	if err != nil {
		return nil, err
	}
	b, err := readConfig(raw)
	if err == nil {
		err = json.Unmarshal(b, v)
	}
	if err != nil {
		err = &StepError{Step: step, Err: err}
		c.Reply(err)
		c.Close()
		return nil, err
	}
	return c, nil
}

// readConfig returns the config that raw is, or that the pipe it names
// ("fd:N") carries.
func readConfig(raw string) ([]byte, error) {
	v, ok := strings.CutPrefix(raw, configFDPrefix)
	if !ok {
		return []byte(raw), nil
	}
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("bad config descriptor %q", raw)
	}
	f := os.NewFile(uintptr(fd), "reexec-config")
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxConfigLen+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("read config: %w", err)
	case len(b) == 0:
		return nil, errors.New("the parent sent no config (it gave up)")
	case len(b) > maxConfigLen:
		return nil, fmt.Errorf("config longer than %d bytes", maxConfigLen)
	}
	return b, nil
}

// Reply sends the child's one message: success with fds attached if err is
// nil, else [ReplyFor](err) and no descriptors. The caller still owns fds.
func (c *Child) Reply(err error, fds ...int) error {
	return c.ReplyNote(err, "", fds...)
}

// ReplyNote is [Child.Reply] with a note for the parent beside a success
// ([Parent.Note]); a failure's reply carries no note.
func (c *Child) ReplyNote(err error, note string, fds ...int) error {
	r := Reply{Note: note}
	var oob []byte
	if err != nil {
		r = ReplyFor(err)
	} else if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	b, merr := json.Marshal(r)
	if merr != nil {
		return fmt.Errorf("encode reply: %w", merr)
	}
	_, serr := retryEINTR(func() (int, error) { return 0, unix.Sendmsg(c.fd, b, oob, nil, 0) })
	if serr != nil {
		return fmt.Errorf("send reply: %w", serr)
	}
	return nil
}

// WaitGo blocks until the parent calls [Parent.Go] and reports whether it
// did; false means the parent closed its end or died.
func (c *Child) WaitGo() bool {
	var b [1]byte
	n, err := retryEINTR(func() (int, error) { return unix.Read(c.fd, b[:]) })
	return err == nil && n == 1 && b[0] == goByte
}

// Close closes the child's end.
func (c *Child) Close() { unix.Close(c.fd) }

// Exec replaces the child with the program at path (argv, env), which is
// to die with the parent like the child (PR_SET_PDEATHSIG, SIGKILL). It
// returns only on failure; the socket may be closed before.
//
// The parent-death signal is a property of one thread, the one the parent
// forked (exec.Cmd sets it there), and new threads start without it. A Go
// child's main goroutine may have moved to another thread by the time it
// execs, and an execve from that thread makes it the whole process, without
// the signal: the job would then outlive the parent (a test found it in 3
// of 100 runs on a loaded machine). So Exec locks its goroutine to the
// current thread, sets the signal there, and only then checks that the
// parent is still the one that started the child (if it died in between,
// nobody would send the signal): set, then check, then exec from that very
// thread.
func (c *Child) Exec(path string, argv, env []string) error {
	runtime.LockOSThread() // for good: the thread becomes the program or the process exits
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("set parent-death signal: %w", err)
	}
	if os.Getppid() != c.ppid {
		return fmt.Errorf("parent %d exited", c.ppid)
	}
	return syscall.Exec(path, argv, env)
}

func retryEINTR(f func() (int, error)) (int, error) {
	for {
		n, err := f()
		if err != unix.EINTR {
			return n, err
		}
	}
}
