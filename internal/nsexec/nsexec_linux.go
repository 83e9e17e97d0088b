// SPDX-License-Identifier: MIT

package nsexec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/reexec"
)

const (
	// DefaultTUNName is the TUN's name when Config.TUNName is empty.
	DefaultTUNName = "tun0"
	// DefaultMTU is the TUN's MTU when Config.MTU is 0 (WireGuard's default).
	DefaultMTU = 1420

	reapTimeout  = 5 * time.Second       // Cleanup's wait for the child after SIGKILL
	killPasses   = 50                    // bound on Cleanup's /proc scans
	killInterval = 10 * time.Millisecond // pause between scans that found processes
)

// Config describes the job and its namespace. The zero value is not
// usable: Args and Address are required.
type Config struct {
	// Args is the command and its arguments. Args[0] is looked up in the
	// job's PATH inside the namespace, after setup.
	Args []string
	// Env is the job's environment; nil means os.Environ().
	Env []string
	// Dir is the job's working directory; "" means the current one.
	Dir string
	// Stdin, Stdout and Stderr are the job's standard files; nil means
	// os.Stdin, os.Stdout, os.Stderr.
	Stdin, Stdout, Stderr *os.File

	// TUNName is the TUN device's name; "" means DefaultTUNName.
	TUNName string
	// Addrs are the job's tunnel addresses with their subnets' lengths,
	// e.g. 100.64.0.2/16 and fd00:a1::6440:2/48: at least one, at most
	// one per address family. The TUN gets each (without duplicate
	// address detection: the tunnel has no other hosts), and the default
	// route of each one's family (0.0.0.0/0, ::/0) goes through the TUN.
	Addrs []netip.Prefix
	// Gateways are the gateway's tunnel addresses, at most one per
	// family: the next hop of the default route of its family. A family
	// without one routes straight to the TUN.
	Gateways []netip.Addr
	// MTU is the TUN's MTU; 0 means DefaultMTU.
	MTU int
	// DNS are written as nameserver lines into the job's private
	// /etc/resolv.conf. If empty, /etc/resolv.conf is left as it is.
	DNS []netip.Addr
	// Logger receives lifecycle logs; nil discards them.
	Logger *slog.Logger
}

// withDefaults validates c and fills in defaults.
func (c Config) withDefaults() (Config, error) {
	if len(c.Args) == 0 || c.Args[0] == "" {
		return c, errors.New("no command to run")
	}
	var addrs, gws [ipfamily.N]bool
	for _, p := range c.Addrs {
		f := ipfamily.Of(p.Addr())
		if !p.IsValid() || f == nil || p.Addr().Is4In6() || addrs[f.Index] {
			return c, fmt.Errorf("tunnel addresses %v: want valid addresses, at most one per family", c.Addrs)
		}
		addrs[f.Index] = true
	}
	if len(c.Addrs) == 0 {
		return c, errors.New("no valid tunnel address")
	}
	for _, g := range c.Gateways {
		f := ipfamily.Of(g)
		if f == nil || gws[f.Index] || !addrs[f.Index] {
			return c, fmt.Errorf("gateway %s and addresses %v: want at most one gateway per family of the addresses (different families?)", g, c.Addrs)
		}
		gws[f.Index] = true
	}
	if c.TUNName == "" {
		c.TUNName = DefaultTUNName
	}
	if len(c.TUNName) >= unix.IFNAMSIZ {
		return c, fmt.Errorf("tun name %q longer than %d bytes", c.TUNName, unix.IFNAMSIZ-1)
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.MTU < 576 || c.MTU > 65535 {
		return c, fmt.Errorf("mtu %d out of range 576-65535", c.MTU)
	}
	return c.withFiles(), nil
}

// withFiles fills in the defaults of c's environment, standard files and
// logger.
func (c Config) withFiles() Config {
	if c.Env == nil {
		c.Env = os.Environ()
	}
	if c.Stdin == nil {
		c.Stdin = os.Stdin
	}
	if c.Stdout == nil {
		c.Stdout = os.Stdout
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Job is a command in its own namespace, started by [Start]. Its methods
// are safe for concurrent use.
type Job struct {
	cmd     *exec.Cmd
	log     *slog.Logger
	tun     *os.File
	netns   unix.Stat_t // device and inode of the job's network namespace
	statErr error       // why netns could not be read (Setup reports it)

	done    chan struct{} // closed when the child has been reaped
	status  int           // set before done is closed
	waitErr error         // set before done is closed
	cleanup sync.Once
	mu      sync.Mutex
	ctl     *reexec.Parent // guarded by mu; nil after Run or Cleanup
	setUp   bool           // guarded by mu; Setup was called
}

// Start starts the namespace child and waits until it has set up the
// namespace and handed over the TUN fd; ctx bounds only that wait. The job's
// command does not run until [Job.Run]. On success the caller must
// eventually call [Job.Cleanup] and owns [Job.TUN]. Errors are meant for
// the user and match [ErrUserNamespace], [ErrNoTUN], [ErrTUNPermission] or
// [ErrSetup] where they apply. It is [Prepare] then [Job.Setup] with the
// same cfg.
//
// The child gets SIGKILL when the OS thread that called Start exits
// (PR_SET_PDEATHSIG). Go keeps its threads for the life of the process
// unless a goroutine exits while locked to one (runtime.LockOSThread), so do
// not call Start from such a goroutine.
func Start(ctx context.Context, cfg Config) (*Job, error) {
	if _, err := cfg.withDefaults(); err != nil {
		return nil, fmt.Errorf("start job namespace: %w", err)
	}
	j, err := Prepare(cfg)
	if err != nil {
		return nil, err
	}
	if err := j.Setup(ctx, cfg); err != nil {
		return nil, err
	}
	return j, nil
}

// Prepare starts the namespace child for cfg's Args, Dir and standard
// files before the network settings are known: the namespaces are made and
// the child's runtime starts (a few milliseconds of exec and Go start-up)
// while the caller does something else, such as joining the gateway. The
// child then waits for [Job.Setup]. cfg.Env, the environment the child
// starts with, must hold nothing the job may not see: the child's
// environment can be read by the user's other processes until it execs
// the job with Setup's. Its other network fields are ignored. On success
// the caller must eventually call [Job.Cleanup], which also ends a child
// still waiting for Setup. Errors are as Start's.
func Prepare(cfg Config) (*Job, error) {
	if len(cfg.Args) == 0 || cfg.Args[0] == "" {
		return nil, errors.New("start job namespace: no command to run")
	}
	cfg = cfg.withFiles()
	cmd := &exec.Cmd{
		Path:   "/proc/self/exe",
		Args:   append([]string{childArg0}, cfg.Args...),
		Env:    jobEnv(cfg.Env),
		Dir:    cfg.Dir,
		Stdin:  cfg.Stdin,
		Stdout: cfg.Stdout,
		Stderr: cfg.Stderr,
		// The child clears its ambient capabilities before it execs the
		// job.
		SysProcAttr: reexec.IdentityMapped(unix.CLONE_NEWUSER|unix.CLONE_NEWNET|unix.CLONE_NEWNS,
			unix.CAP_NET_ADMIN, unix.CAP_SYS_ADMIN),
	}
	ctl, err := reexec.StartDeferred(cmd, envFD, envConfig)
	if err != nil {
		if isUserNSErrno(err) {
			return nil, readHostFacts().userNSError(fmt.Errorf("start namespace child: %w", err))
		}
		return nil, fmt.Errorf("start job namespace: start namespace child: %w", err)
	}
	j := &Job{cmd: cmd, log: cfg.Logger, ctl: ctl, done: make(chan struct{})}
	go j.reap()
	// The child has exec'd, so it is in the new namespaces already. A
	// child whose setup fails may exit (and be reaped) before this runs;
	// its reply, read by Setup, then says why, which matters more.
	if err := unix.Stat("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/net", &j.netns); err != nil {
		j.netns = unix.Stat_t{}
		j.statErr = err
	}
	return j, nil
}

// Setup sends a child started by [Prepare] its namespace settings (cfg's
// TUNName, Addrs, Gateways, MTU, DNS) and the job's environment (cfg.Env;
// nil means os.Environ()), and waits until it has set up the namespace and
// handed over the TUN fd; ctx bounds only that wait. It may be called
// once. On failure the job is cleaned up; errors are as Start's.
func (j *Job) Setup(ctx context.Context, cfg Config) error {
	cfg, err := cfg.withDefaults()
	if err != nil {
		j.Cleanup()
		return fmt.Errorf("start job namespace: %w", err)
	}
	j.mu.Lock()
	ctl, again := j.ctl, j.setUp
	j.setUp = true
	j.mu.Unlock()
	if ctl == nil || again {
		return errors.New("start job namespace: already set up or cleaned up")
	}
	if err := ctl.SendConfig(childConfig{
		TUNName: cfg.TUNName, Addrs: cfg.Addrs, Gateways: cfg.Gateways, MTU: cfg.MTU, DNS: cfg.DNS,
		Env: jobEnv(cfg.Env),
	}); err != nil {
		// The child died before it read it: its reply (if any) says why.
		j.log.Debug("namespace child's config", "err", err)
	}
	tun, err := j.receive(ctx, ctl)
	if err != nil {
		j.Cleanup()
		return err
	}
	if j.statErr != nil {
		tun.Close()
		j.Cleanup()
		return fmt.Errorf("start job namespace: read job's network namespace: %w", j.statErr)
	}
	j.tun = tun
	j.log.Info("job namespace ready", "pid", j.cmd.Process.Pid, "tun", cfg.TUNName,
		"addrs", cfg.Addrs, "mtu", cfg.MTU, "netns", j.netns.Ino)
	return nil
}

// receive reads the child's setup reply and returns the TUN it sent.
func (j *Job) receive(ctx context.Context, ctl *reexec.Parent) (*os.File, error) {
	files, err := ctl.Receive(ctx, tunPath)
	var ce *reexec.ChildError
	switch {
	case err == nil:
		return files[0], nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("start job namespace: %w", context.Cause(ctx))
	case errors.Is(err, reexec.ErrNoReply):
		// The child died before it could reply.
		select {
		case <-j.done:
		case <-time.After(reapTimeout):
		}
		return nil, fmt.Errorf("start job namespace: namespace child exited during setup (%s)", j.exitDescription())
	case errors.As(err, &ce):
		return nil, readHostFacts().setupError(ce.Reply)
	}
	return nil, fmt.Errorf("start job namespace: namespace child's reply: %w", err)
}

// reap waits for the child and records its status in shell convention.
func (j *Job) reap() {
	err := j.cmd.Wait()
	j.status = -1
	if st := j.cmd.ProcessState; st != nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok {
			switch {
			case ws.Exited():
				j.status = ws.ExitStatus()
			case ws.Signaled():
				j.status = 128 + int(ws.Signal())
			}
		}
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = nil
	}
	if err != nil {
		err = fmt.Errorf("wait for job: %w", err)
	}
	j.waitErr = err
	close(j.done)
}

func (j *Job) exitDescription() string {
	select {
	case <-j.done:
		if j.cmd.ProcessState != nil {
			return j.cmd.ProcessState.String()
		}
		return "unknown status"
	default:
		return "still running"
	}
}

// TUN returns the TUN device fd (IFF_TUN|IFF_NO_PI|IFF_VNET_HDR). It is the
// caller's after Start, to close when done; Cleanup does not close it.
func (j *Job) TUN() *os.File { return j.tun }

// Pid returns the PID of the namespace child, which becomes the job's
// command on Run.
func (j *Job) Pid() int { return j.cmd.Process.Pid }

// Run tells the namespace child to exec the job's command. It returns once
// the request is sent; a command that cannot be found or executed shows up
// in Wait as status 127 or 126, with a message on the job's stderr. Run may
// be called once.
func (j *Job) Run() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.ctl == nil {
		return errors.New("run job: already running or cleaned up")
	}
	err := j.ctl.Go()
	j.ctl.Close()
	j.ctl = nil
	if err != nil {
		return fmt.Errorf("run job: tell namespace child to exec: %w", err)
	}
	return nil
}

// Signal sends sig to the job's process. After the job has been reaped it
// returns os.ErrProcessDone.
func (j *Job) Signal(sig os.Signal) error {
	if err := j.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal job: %w", err)
	}
	return nil
}

// Wait waits for the job's process to exit and returns its status in shell
// convention: the exit code, or 128+N if signal N killed it. A command that
// could not be found is 127, one that could not be executed 126. The error
// is non-nil only if waiting itself failed (the status is then -1). Wait may
// be called any number of times.
func (j *Job) Wait() (int, error) {
	<-j.done
	return j.status, j.waitErr
}

// Cleanup kills with SIGKILL every process in the job's network namespace,
// including the job itself and anything it left running in the background,
// and reaps the namespace child. It is idempotent and safe to call at any
// point after Start, concurrently with Wait.
func (j *Job) Cleanup() {
	j.cleanup.Do(func() {
		j.mu.Lock()
		if j.ctl != nil {
			j.ctl.Close() // a child waiting for Run sees EOF and exits
			j.ctl = nil
		}
		j.mu.Unlock()

		killed := 0
		if j.netns.Ino != 0 {
			killed = killNetns(j.netns, j.log)
		}
		if err := j.cmd.Process.Kill(); err == nil {
			killed++
		}
		select {
		case <-j.done:
		case <-time.After(reapTimeout):
			j.log.Warn("namespace child not reaped after SIGKILL", "pid", j.cmd.Process.Pid, "timeout", reapTimeout)
		}
		j.log.Debug("job cleaned up", "pid", j.cmd.Process.Pid, "signalled", killed)
	})
}
