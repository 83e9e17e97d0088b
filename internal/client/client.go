// SPDX-License-Identifier: MIT

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
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/nsexec"
	"github.com/airlock-vpn/airlock/internal/siteproxy"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/version"
	"github.com/airlock-vpn/airlock/internal/wgkey"
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
	// JoinTimeout bounds how long the job waits for a gateway that
	// cannot take it yet (busy, draining, over a rate or quota,
	// unreachable); zero means DefaultJoinTimeout.
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
	// Attest is AttestAuto ("" too), AttestMunge or AttestOff (attest.go);
	// MungeSocket is this node's munged's socket ("" means MUNGE's
	// default).
	Attest      string
	MungeSocket string
	// Bearer is BearerAuto ("" too) or BearerOff (bearer.go).
	Bearer string
	// JobProxyEnv is what happens to the site's web proxy variables in
	// the job's environment: JobProxyEnvAuto ("" too), JobProxyEnvKeep
	// or JobProxyEnvDrop (jobproxyenv.go).
	JobProxyEnv string

	// dialer reaches the gateways, directly or through the site's web
	// proxy (HTTPS_PROXY); set by prepare.
	dialer *siteproxy.Dialer
}

// MaxProcs is how many threads of Go code airlock run uses at most
// (GOMAXPROCS; the environment variable overrides it): the tunnel's data
// path runs to completion, one goroutine per direction (TUN → encrypt →
// UDP, UDP → decrypt → TUN), so two cores carry a job's traffic, and the
// job keeps the rest of the node.
const MaxProcs = 2

// Run joins the gateway, runs the job in its namespace and returns the job's
// exit status (128+N when killed by signal N). A non-nil error means airlock
// itself failed before or around the job; the status is then ExitFailure
// unless the job ran.
//
// Its life: check the config; open (signals, join, the job's environment,
// the namespace and the tunnel on its TUN, or a fallback mode); serve (the
// job runs while signals are forwarded and the session is supervised);
// close, in reverse order of opening, on every path.
func Run(ctx context.Context, cfg Config) (int, error) {
	cfg, gws, modes, err := prepare(cfg)
	if err != nil {
		return ExitFailure, err
	}
	ctx, sig, stop := catchSignals(ctx, cfg.Logger)
	defer stop()
	t0 := time.Now()
	resumeGC := pauseGC() // until the job runs
	defer resumeGC()
	early := prepareNetns(cfg, modes)
	defer early.cleanup() // if the job never ran: a no-op after netnsJob.close
	sess, err := openSession(ctx, cfg, gws, t0)
	if err != nil {
		return ExitFailure, err
	}
	defer closeSession(sess, t0)
	jobEnv, err := jobEnvironment(cfg, sess.lease)
	if err != nil {
		return ExitFailure, err
	}
	if f := sess.egressFile(); f != "" {
		jobEnv = append(jobEnv, EgressFileEnv+"="+f)
	}
	jobEnv, modes.note = jobProxyEnv(jobEnv, cfg.JobProxyEnv, sess.viaProxy(), sess.proxyLocal)
	if err := ctx.Err(); err != nil {
		return ExitFailure, context.Cause(ctx)
	}
	fb := fallback{cfg: cfg, plan: modes, lease: sess.lease, sess: sess,
		env: jobEnv, sig: sig, t0: t0, resumeGC: resumeGC}
	if modes.current() != ModeNetns {
		return runFallback(ctx, fb)
	}
	nj, err := openNetns(ctx, cfg, sess, modes, jobEnv, t0, early)
	if errors.Is(err, errFallBack) {
		return runFallback(ctx, fb)
	}
	if err != nil {
		return ExitFailure, err
	}
	defer nj.close()
	nj.resumeGC = resumeGC
	return nj.serve(ctx, sig)
}

// prepare checks cfg, fills in its defaults and finds the gateways and
// the plan of modes to try.
func prepare(cfg Config) (Config, []Gateway, *plan, error) {
	if len(cfg.Args) == 0 {
		return cfg, nil, nil, errors.New("no command given: usage: airlock run [flags] -- CMD [ARGS...]")
	}
	if cfg.Gateway == "" {
		return cfg, nil, nil, errors.New("no gateway: set --gateway or AIRLOCK_GATEWAY (from the admin's join.env)")
	}
	if cfg.Pin == "" {
		return cfg, nil, nil, errors.New("no gateway fingerprint: set --pin or AIRLOCK_PIN (from the admin's join.env)")
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	tok, err := joinToken(cfg)
	if err != nil {
		return cfg, nil, nil, err
	}
	cfg.Token = tok
	if cfg.JoinTimeout <= 0 {
		cfg.JoinTimeout = DefaultJoinTimeout
	}
	if cfg.Stderr == nil {
		cfg.Stderr = os.Stderr
	}
	if err := checkExpose(cfg.Expose); err != nil {
		return cfg, nil, nil, err
	}
	if err := checkPorts(cfg.Ports); err != nil {
		return cfg, nil, nil, err
	}
	if cfg.JobProxyEnv, err = checkJobProxyEnv(cfg.JobProxyEnv); err != nil {
		return cfg, nil, nil, err
	}
	switch cfg.Transport {
	case "":
		cfg.Transport = TransportAuto
	case TransportAuto, TransportUDP, TransportTCP:
	default:
		return cfg, nil, nil, fmt.Errorf("bad --transport %q: want auto, udp or tcp", cfg.Transport)
	}
	if cfg.TransportTimeout <= 0 {
		cfg.TransportTimeout = DefaultTransportTimeout
	}
	if cfg.FailoverAfter <= 0 {
		cfg.FailoverAfter = DefaultFailoverAfter
	}
	cfg.dialer = NewDialer(cfg.Getenv, cfg.Logger)
	gws, err := ParseGateways(cfg.Gateway, cfg.Pin, RequestTimeout, control.WithDial(cfg.dialer.DialContext))
	if err != nil {
		return cfg, nil, nil, err
	}
	if cfg.Mode == "" {
		cfg.Mode = ModeAuto
	}
	modes, err := planModes(cfg.Mode)
	if err != nil {
		return cfg, nil, nil, err
	}
	return cfg, gws, modes, nil
}

// joinToken checks the job's identity settings of cfg and returns the
// token it joins with (resolveToken), or "" where there is none and the
// join's MUNGE credential or bearer token stands in for it.
func joinToken(cfg Config) (string, error) {
	if _, err := newNodeAttest(cfg.Attest, cfg.MungeSocket, ""); err != nil {
		return "", err
	}
	tok, err := resolveToken(cfg)
	if err != nil && !errors.Is(err, errNoToken) {
		return "", err
	}
	bt, berr := newJobBearer(cfg.Bearer, cfg.Getenv)
	if berr != nil {
		return "", berr
	}
	if err != nil {
		att, _ := newNodeAttest(cfg.Attest, cfg.MungeSocket, "")
		if b, _, _ := bt.find(); !att.possible() && b == "" {
			return "", err
		}
		return "", nil // the join's MUNGE credential or bearer token stands in for it
	}
	return tok, nil
}

// planModes is the plan of modes to try for --mode mode; where the first
// is a namespace the host cannot make (nsexec.Preflight), it is skipped.
func planModes(mode Mode) (*plan, error) {
	modes := newPlan(mode)
	if modes.current() == ModeNetns {
		if err := nsexec.Preflight(); err != nil {
			if err := modes.skip(err); err != nil {
				return nil, err
			}
		}
	}
	return modes, nil
}

// openSession makes the job's WireGuard key and joins the least loaded
// gateway. The caller closes the session (release, then its clients).
func openSession(ctx context.Context, cfg Config, gws []Gateway, t0 time.Time) (*Session, error) {
	log := cfg.Logger
	priv, err := wgkey.Generate()
	if err != nil {
		return nil, err
	}
	att, err := newNodeAttest(cfg.Attest, cfg.MungeSocket, cfg.Getenv(EnvMungeJob))
	if err != nil {
		return nil, err
	}
	bt, err := newJobBearer(cfg.Bearer, cfg.Getenv)
	if err != nil {
		return nil, err
	}
	sess := NewSession(SessionConfig{
		Logger: log, Stderr: cfg.Stderr, Gateways: gws, Key: priv, attest: att, bearer: bt,
		Join: control.JoinRequest{
			Token:   cfg.Token,
			Job:     jobInfo(cfg.Getenv, cfg.Args),
			Expose:  cfg.Expose,
			Ports:   cfg.Ports,
			Version: version.Get().Version,
		},
		Transport: cfg.Transport, TransportTimeout: cfg.TransportTimeout, FailoverAfter: cfg.FailoverAfter,
		JoinTimeout: cfg.JoinTimeout, EgressFile: true, Dialer: cfg.dialer,
	})
	if err := sess.Join(ctx); err != nil {
		sess.closeClients()
		return nil, err // the control client names the gateway
	}
	sess.takePathMTU(ctx)
	log.Debug("joined", "lease", sess.lease.ID, "addrs", sess.lease.Addresses, "gateway", sess.cur.addr, "mtu", sess.lease.MTU, "took", time.Since(t0))
	return sess, nil
}

// closeSession releases the lease and closes the control clients.
func closeSession(s *Session, t0 time.Time) {
	s.Release()
	s.log.Debug("released", "since_start", time.Since(t0))
	s.closeClients()
	s.removeEgressFile()
}

// jobEnvironment returns the job's environment (without airlock's
// credentials, with its exposed addresses and port block) and tells the
// user where its ports are exposed.
func jobEnvironment(cfg Config, ls control.Lease) ([]string, error) {
	env, err := exposedEnv(withoutCredentials(os.Environ()), cfg.Expose, ls.Exposed)
	if err == nil {
		env, err = portsEnv(env, cfg.Ports, ls)
	}
	if err != nil {
		return nil, err
	}
	for _, x := range ls.Exposed {
		fmt.Fprintf(cfg.Stderr, "airlock: exposed %s/%d at %s\n", x.Proto, x.Port.Port, netip.AddrPortFrom(x.PublicAddr, x.PublicPort))
	}
	return env, nil
}

// errFallBack is openNetns's answer when the node cannot give the job a
// namespace and the plan has a fallback mode left.
var errFallBack = errors.New("no namespace: fall back")

// netnsJob is a job in its own network namespace with the tunnel on its
// TUN, between openNetns and close.
type netnsJob struct {
	log  *slog.Logger
	t0   time.Time // when airlock run started
	sess *Session
	job  *nsexec.Job
	nsf  *os.File // the job's network namespace, held open until the tunnel is closed
	wg   bool     // the tunnel runs
	// resumeGC ends the start-up's pause of the collector (pauseGC).
	resumeGC func()
}

// earlyNetns is the job's namespace child being started ahead of the
// join by prepareNetns.
type earlyNetns struct {
	done chan struct{} // closed when job and err are set
	job  *nsexec.Job
	err  error
}

// prepareNetns starts the job's namespace child (nsexec.Prepare) if the
// plan's mode is a namespace, so that the child's start overlaps the
// join: the child waits for the lease's settings (openNetns). Prepare
// itself (clone, the uid and gid maps, exec) runs in the background, so
// the join does not wait for it either. The child's environment is the
// job's without airlock's credentials. nil: no namespace to start.
func prepareNetns(cfg Config, modes *plan) *earlyNetns {
	if modes.current() != ModeNetns {
		return nil
	}
	e := &earlyNetns{done: make(chan struct{})}
	go func() {
		defer close(e.done)
		e.job, e.err = nsexec.Prepare(nsexec.Config{Args: cfg.Args, Env: withoutCredentials(os.Environ()), Logger: cfg.Logger})
	}()
	return e
}

// wait returns the started child, or Prepare's error for openNetns to
// act on after the join, as if the namespace were started there.
func (e *earlyNetns) wait() (*nsexec.Job, error) {
	if e == nil {
		return nil, errors.New("start job namespace: not started")
	}
	<-e.done
	return e.job, e.err
}

// cleanup ends the child if one was started (nsexec.Job.Cleanup; a no-op
// once the job's namespace was cleaned up).
func (e *earlyNetns) cleanup() {
	if job, err := e.wait(); err == nil {
		job.Cleanup()
	}
}

// openNetns sets up the job's namespace, started by prepareNetns as
// early, with the lease's settings (the job waits for serve) and starts
// the tunnel on its TUN. It returns errFallBack if the node cannot make
// the namespace and another mode is left to try.
func openNetns(ctx context.Context, cfg Config, sess *Session, modes *plan, env []string, t0 time.Time, early *earlyNetns) (*netnsJob, error) {
	log, ls := cfg.Logger, sess.lease
	job, err := early.wait()
	if err == nil {
		err = job.Setup(ctx, nsexec.Config{
			Args:     cfg.Args,
			Env:      env,
			Addrs:    ls.Addresses,
			Gateways: ls.Gateways,
			MTU:      ls.MTU,
			DNS:      ls.DNS,
			Logger:   log,
		})
	}
	if err != nil {
		if namespaceUnavailable(err) {
			if err := modes.skip(err); err != nil {
				return nil, err
			}
			return nil, errFallBack
		}
		return nil, err
	}
	fmt.Fprintln(cfg.Stderr, modes.line())
	nj := &netnsJob{log: log, t0: t0, sess: sess, job: job}
	// Hold the job's network namespace open until the tunnel is closed:
	// closing a TUN whose namespace is already being torn down waits for
	// that teardown; closing it first is quick, and the namespace (with
	// the TUN, which is persistent) then goes away in the background.
	if nj.nsf, err = os.Open(fmt.Sprintf("/proc/%d/ns/net", job.Pid())); err != nil {
		log.Debug("cannot hold job namespace open", "err", err)
	}
	if err := nj.startTunnel(ctx); err != nil {
		nj.close()
		return nil, err
	}
	return nj, nil
}

// startTunnel runs WireGuard, through the bypass decorator, on the TUN.
func (nj *netnsJob) startTunnel(ctx context.Context) error {
	ls := nj.sess.lease
	tdev, err := wrapTUN(nj.job.TUN(), ls.MTU)
	if err != nil {
		return err
	}
	var jobAddrs []netip.Addr
	for _, p := range ls.Addresses {
		jobAddrs = append(jobAddrs, p.Addr())
	}
	// The job's resolvers, the gateway's tunnel addresses for a family
	// the lease names none of (the Device takes the first of each).
	resolvers := append(slices.Clone(ls.DNS), ls.Gateways...)
	dev, err := nj.sess.bypass.Wrap(tdev, jobAddrs, resolvers, ls.MTU)
	if err != nil {
		tdev.Close()
		return err
	}
	if err := nj.sess.StartTunnel(ctx, dev); err != nil {
		dev.Close()
		return err
	}
	nj.wg = true
	return nil
}

// close closes the tunnel, then gives the lease back while it lets the
// namespace go and kills whatever is left in it: the one waits for the
// gateway, the other for the kernel (a scan of /proc), so they overlap.
// Nothing the job left behind can reach the gateway once the tunnel is
// closed.
func (nj *netnsJob) close() {
	t0 := nj.t0
	if nj.wg {
		nj.sess.wg.Close()
		nj.log.Debug("tunnel closed", "since_start", time.Since(t0))
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		nj.sess.Release()
	}()
	if nj.nsf != nil {
		nj.nsf.Close()
	}
	nj.job.Cleanup()
	nj.log.Debug("namespace cleaned up", "since_start", time.Since(t0))
	<-released
}

// serve runs the job to its end, forwarding signals to it and supervising
// the session (renewal, reconnect, failover) meanwhile.
func (nj *netnsJob) serve(ctx context.Context, sig *jobSignals) (int, error) {
	if err := hideFromJob(); err != nil {
		return ExitFailure, err
	}
	if err := sig.starting(ctx); err != nil {
		return ExitFailure, err
	}
	if err := nj.job.Run(); err != nil {
		sig.notStarted()
		return ExitFailure, fmt.Errorf("start job: %w", err)
	}
	sig.started(nj.job.Signal)
	nj.log.Debug("job started", "pid", nj.job.Pid(), "addrs", nj.sess.lease.Addresses, "gateway", nj.sess.endpoint, "setup", time.Since(nj.t0))
	var status int
	var err error
	whileJobRuns(nj.sess, nj.resumeGC, func() { status, err = nj.job.Wait() })
	nj.log.Debug("job exited", "status", status, "since_start", time.Since(nj.t0))
	return status, err
}

// whileJobRuns calls wait (which returns when the job has exited) while
// sess is supervised (renewal, reconnect, failover); supervision stops
// before it returns. Signals reach the job through jobSignals. The job
// has started: resumeGC ends the start-up's pause of the collector.
func whileJobRuns(sess *Session, resumeGC func(), wait func()) {
	resumeGC()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); sess.Supervise(ctx) }()
	wait()
	stop()
	<-done
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

// errBadEndpoint: the lease's WireGuard endpoint is not HOST:PORT.
var errBadEndpoint = errors.New("gateway sent a bad endpoint")

// resolveEndpoint turns the lease's UDP endpoint into an address. An
// endpoint with an unspecified or empty host means "the host you dialed".
func resolveEndpoint(ctx context.Context, endpoint, controlAddr string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(endpoint)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w %q: %w", errBadEndpoint, endpoint, err)
	}
	if a, err := netip.ParseAddr(host); host == "" || (err == nil && a.IsUnspecified()) {
		host, _, _ = net.SplitHostPort(controlAddr)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("%w port %q: %w", errBadEndpoint, port, err)
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

// apiMessage returns the gateway's own sentence from an API error.
func apiMessage(err error) string {
	var ae *control.APIError
	if errors.As(err, &ae) && ae.Message != "" {
		return ae.Message
	}
	return err.Error()
}

// leaseDNS is the job's resolver address: the lease's first DNS server,
// else the gateway's first tunnel address.
func leaseDNS(ls control.Lease) netip.Addr {
	if len(ls.DNS) > 0 {
		return ls.DNS[0]
	}
	if len(ls.Gateways) > 0 {
		return ls.Gateways[0]
	}
	return netip.Addr{}
}
