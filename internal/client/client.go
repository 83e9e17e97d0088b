// Package client implements `airlock run`: join the gateway, build the job's
// namespace with a TUN, carry its packets over WireGuard, run the job, and
// return its exit status, releasing everything on every path. Where the
// node allows no namespace or TUN, the job runs in a fallback mode
// (mode.go, fallback.go): seccomp, preload or proxy, through a user-space
// stack on the same WireGuard tunnel.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/bypass"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/nsexec"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// Exit statuses of `airlock run` for its own failures, following the
// convention of env(1), chroot(1) and container runtimes.
const (
	ExitFailure     = 125 // airlock itself failed: bad flags, join refused, namespace setup
	ExitNotRunnable = 126 // CMD found but not executable
	ExitNotFound    = 127 // CMD not found
)

// HandshakeWarnAfter is how long the client waits for the first WireGuard
// handshake before it warns that UDP to the gateway seems blocked.
const HandshakeWarnAfter = 5 * time.Second

// Config configures one `airlock run`.
type Config struct {
	Logger *slog.Logger
	// Gateway is HOST:PORT of the gateway's control API, or several
	// separated by commas: the job joins the least loaded and fails over
	// between them.
	Gateway string
	// Pin is the gateway's certificate fingerprint, or one per gateway
	// separated by commas (in the order of Gateway).
	Pin string
	// Token is the join token.
	Token string
	// TokenFile, if set, names a file holding the join token (instead of
	// Token), so that the token is on no command line.
	TokenFile string
	// Args is the job's command line.
	Args []string
	// Getenv reads the environment for job metadata; nil means os.Getenv.
	Getenv func(string) string
	// JoinTimeout bounds the join request; default 15s.
	JoinTimeout time.Duration
	// Expose lists the job's ports to make reachable from outside through
	// the gateway's public address (--expose).
	Expose []control.Port
	// Ports, if not zero, is how many egress ports the job asks for
	// (--ports); the gateway grants at least that many or refuses.
	Ports int
	// Stderr receives airlock's own messages to the user (the mode line,
	// the exposed addresses); nil means os.Stderr.
	Stderr io.Writer
	// Transport is TransportAuto ("" too), TransportUDP or TransportTCP.
	Transport string
	// TransportTimeout is how long auto waits for a handshake over UDP
	// before it switches to TCP; zero means DefaultTransportTimeout.
	TransportTimeout time.Duration
	// FailoverAfter is how long the gateway may be lost before the job
	// moves to another one (with several gateways); zero means
	// DefaultFailoverAfter.
	FailoverAfter time.Duration
	// Mode is how the job's traffic reaches the tunnel (--mode); "" means
	// ModeAuto. See mode.go.
	Mode Mode
	// Preload is the LD_PRELOAD library for ModePreload; "" means look
	// next to the airlock binary.
	Preload string
}

// Run joins the gateway, runs the job in its namespace and returns the job's
// exit status (128+N when killed by signal N). A non-nil error means airlock
// itself failed before or around the job; the status is then ExitFailure
// unless the job ran.
func Run(ctx context.Context, cfg Config) (int, error) {
	log := cfg.Logger
	if len(cfg.Args) == 0 {
		return ExitFailure, errors.New("no command given: usage: airlock run [flags] -- CMD [ARGS...]")
	}
	if cfg.Gateway == "" {
		return ExitFailure, errors.New("no gateway: set --gateway or AIRLOCK_GATEWAY (from the admin's join.env)")
	}
	if cfg.Pin == "" {
		return ExitFailure, errors.New("no gateway fingerprint: set --pin or AIRLOCK_PIN (from the admin's join.env)")
	}
	tok, err := resolveToken(cfg)
	if err != nil {
		return ExitFailure, err
	}
	cfg.Token = tok
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if cfg.JoinTimeout == 0 {
		cfg.JoinTimeout = 15 * time.Second
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if err := checkExpose(cfg.Expose); err != nil {
		return ExitFailure, err
	}
	if err := checkPorts(cfg.Ports); err != nil {
		return ExitFailure, err
	}
	switch cfg.Transport {
	case "":
		cfg.Transport = TransportAuto
	case TransportAuto, TransportUDP, TransportTCP:
	default:
		return ExitFailure, fmt.Errorf("bad --transport %q: want auto, udp or tcp", cfg.Transport)
	}
	if cfg.TransportTimeout <= 0 {
		cfg.TransportTimeout = DefaultTransportTimeout
	}
	if cfg.FailoverAfter <= 0 {
		cfg.FailoverAfter = DefaultFailoverAfter
	}
	gws, err := parseGateways(cfg.Gateway, cfg.Pin, cfg.JoinTimeout)
	if err != nil {
		return ExitFailure, err
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	modes := newPlan(cfg.Mode)
	if modes.current() == ModeNetns {
		if err := nsexec.Preflight(); err != nil {
			if err := modes.skip(err); err != nil {
				return ExitFailure, err
			}
		}
	}

	// Signals that arrive before the job runs end airlock itself; once the
	// job runs they are forwarded to it.
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigc)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	preJob := make(chan struct{})
	go func() {
		select {
		case s := <-sigc:
			cancel(fmt.Errorf("interrupted by %v before the job started", s))
		case <-preJob:
		}
	}()

	priv, err := tunnel.GenerateKey()
	if err != nil {
		return ExitFailure, err
	}
	sess := &session{
		log: log, stderr: cfg.Stderr, gws: gws, priv: priv, warnAfter: HandshakeWarnAfter,
		req: control.JoinRequest{
			Token:     cfg.Token,
			PublicKey: priv.PublicKey().String(),
			Job:       jobInfo(cfg.Getenv, cfg.Args),
			Expose:    cfg.Expose,
			Ports:     cfg.Ports,
		},
		transport: cfg.Transport, wait: cfg.TransportTimeout, failover: cfg.FailoverAfter,
		bypass: bypass.NewEngine(log.With("component", "bypass")),
	}
	defer sess.closeClients()
	t0 := time.Now()
	if err := sess.join(ctx, nil, cfg.JoinTimeout); err != nil {
		return ExitFailure, err // the control client names the gateway
	}
	ls := sess.lease
	log.Debug("joined", "lease", ls.ID, "addr", ls.Address, "gateway", sess.cur.addr, "took", time.Since(t0))
	defer func() {
		sess.release(log)
		log.Debug("released", "since_start", time.Since(t0))
	}()

	jobEnv, err := exposedEnv(withoutCredentials(os.Environ()), cfg.Expose, ls.Exposed)
	if err == nil {
		jobEnv, err = portsEnv(jobEnv, cfg.Ports, ls)
	}
	if err == nil {
		jobEnv, err = exposedEnv6(jobEnv, cfg.Expose, ls.Exposed6)
	}
	if err != nil {
		return ExitFailure, err
	}
	for _, x := range ls.Exposed {
		fmt.Fprintf(cfg.Stderr, "airlock: exposed %s/%d at %s\n", x.Proto, x.Port.Port, netip.AddrPortFrom(x.PublicAddr, x.PublicPort))
	}

	if err := ctx.Err(); err != nil {
		return ExitFailure, context.Cause(ctx)
	}

	fb := fallback{cfg: cfg, plan: modes, lease: ls, sess: sess,
		env: jobEnv, sigc: sigc, preJob: preJob, t0: t0}
	if modes.current() != ModeNetns {
		return runFallback(ctx, fb)
	}
	job, err := nsexec.Start(ctx, nsexec.Config{
		Args:    cfg.Args,
		Env:     jobEnv,
		Address: ls.Address,
		Gateway: ls.Gateway,
		// Address6 and Gateway6 are zero for an IPv4-only lease.
		Address6: ls.Address6,
		Gateway6: ls.Gateway6,
		MTU:      ls.MTU,
		DNS:      ls.DNS,
		Logger:   log,
	})
	if err != nil {
		if namespaceUnavailable(err) {
			if err := modes.skip(err); err != nil {
				return ExitFailure, err
			}
			return runFallback(ctx, fb)
		}
		return ExitFailure, err
	}
	fmt.Fprintln(cfg.Stderr, modes.line())
	defer func() {
		job.Cleanup()
		log.Debug("namespace cleaned up", "since_start", time.Since(t0))
	}()

	// Hold the job's network namespace open until the tunnel is closed:
	// closing a TUN whose namespace is already being torn down waits for
	// that teardown; closing it first is quick, and the namespace (with
	// the TUN, which is persistent) then goes away in the background.
	if nsf, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", job.Pid())); err == nil {
		defer nsf.Close()
	} else {
		log.Debug("cannot hold job namespace open", "err", err)
	}
	tdev, err := wrapTUN(job.TUN(), ls.MTU)
	if err != nil {
		return ExitFailure, err
	}
	dev, err := sess.bypass.Wrap(tdev, ls.Address.Addr(), leaseDNS(ls), ls.MTU)
	if err != nil {
		tdev.Close()
		return ExitFailure, err
	}
	if err := sess.startTunnel(ctx, dev); err != nil {
		dev.Close()
		return ExitFailure, err
	}
	defer func() {
		sess.wg.Close()
		log.Debug("tunnel closed", "since_start", time.Since(t0))
	}()

	if err := ctx.Err(); err != nil {
		return ExitFailure, context.Cause(ctx)
	}
	if err := hideFromJob(); err != nil {
		return ExitFailure, err
	}
	close(preJob)
	if err := job.Run(); err != nil {
		return ExitFailure, fmt.Errorf("start job: %w", err)
	}
	log.Debug("job started", "pid", job.Pid(), "addr", ls.Address, "gateway", sess.endpoint, "setup", time.Since(t0))

	var bg sync.WaitGroup
	bgCtx, bgStop := context.WithCancel(context.Background())
	bg.Add(2)
	go func() { defer bg.Done(); forwardSignals(bgCtx, log, sigc, job) }()
	go func() { defer bg.Done(); sess.supervise(bgCtx) }()

	status, err := job.Wait()
	log.Debug("job exited", "status", status, "since_start", time.Since(t0))
	bgStop()
	bg.Wait()
	if err != nil {
		return status, err
	}
	return status, nil
}

// wrapTUN takes over the TUN fd handed out of the job's namespace. The fd
// is duplicated so wireguard-go owns its own copy; the MTU comes from the
// lease because the device cannot be looked up by name from this namespace.
func wrapTUN(f *os.File, mtu int) (tun.Device, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("tun fd: %w", err)
	}
	var fd int
	var dupErr error
	if err := sc.Control(func(raw uintptr) {
		fd, dupErr = unix.FcntlInt(raw, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, fmt.Errorf("tun fd: %w", err)
	}
	if dupErr != nil {
		return nil, fmt.Errorf("dup tun fd: %w", dupErr)
	}
	f.Close()
	// A persistent TUN is not unregistered when its fd closes; it goes
	// with the job's network namespace, which the kernel tears down in the
	// background. Unregistering it at close instead costs RCU grace
	// periods (15-50 ms) on the job's exit path. The namespace dies when
	// its last process does, so nothing is left behind either way.
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set tun persistent: %w", err)
	}
	dev, _, err := tun.CreateUnmonitoredTUNFromFD(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open tun from job namespace: %w", err)
	}
	return tunnel.WithMTU(dev, mtu), nil
}

// resolveEndpoint turns the lease's UDP endpoint into an address. An
// endpoint with an unspecified or empty host means "the host you dialed".
func resolveEndpoint(ctx context.Context, endpoint, controlAddr string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("gateway sent a bad endpoint %q: %w", endpoint, err)
	}
	if a, err := netip.ParseAddr(host); host == "" || (err == nil && a.IsUnspecified()) {
		host, _, _ = net.SplitHostPort(controlAddr)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("gateway sent a bad endpoint port %q: %w", port, err)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return netip.AddrPortFrom(a.Unmap(), uint16(p)), nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return netip.AddrPort{}, fmt.Errorf("resolve gateway endpoint %q: %w", host, err)
	}
	return pickEndpoint(addrs, uint16(p), routable), nil
}

func forwardSignals(ctx context.Context, log *slog.Logger, sigc <-chan os.Signal, job *nsexec.Job) {
	for {
		select {
		case <-ctx.Done():
			return
		case s := <-sigc:
			log.Debug("forwarding signal to job", "signal", s)
			if err := job.Signal(s); err != nil {
				log.Debug("forward signal", "signal", s, "err", err)
			}
		}
	}
}

// apiMessage returns the gateway's own sentence from an API error.
func apiMessage(err error) string {
	var ae *control.APIError
	if errors.As(err, &ae) && ae.Message != "" {
		return ae.Message
	}
	return err.Error()
}

// leaseDNS is the job's resolver address: the lease's first DNS server,
// else the gateway's tunnel address.
func leaseDNS(ls control.Lease) netip.Addr {
	if len(ls.DNS) > 0 {
		return ls.DNS[0]
	}
	return ls.Gateway
}
