// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/proxy"
	"github.com/airlock-vpn/airlock/internal/seccompnotify"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/userstack"
)

// fallback is what Run hands over when the job cannot (or shall not) have
// its own network namespace: the lease, the keys and the job's environment.
type fallback struct {
	cfg   Config
	plan  *plan
	lease control.Lease
	// sess is the job's hold on its gateway: transport, lease watch,
	// renewal, reconnect and failover (session.go).
	sess *Session
	env  []string
	sig  *jobSignals
	t0   time.Time

	dialer *stackDialer // set by runFallback
	http   *proxy.HTTP  // set by proxyEnv
	// resumeGC ends the start-up's pause of the collector (pauseGC).
	resumeGC func()
}

// runFallback runs the job in the host's network namespace, in the first
// of the plan's modes that works (seccomp, preload, proxy), with a
// user-space TCP/IP stack on the job's WireGuard device as its way out.
func runFallback(ctx context.Context, f fallback) (int, error) {
	log := f.cfg.Logger
	if err := hideFromJob(); err != nil {
		return ExitFailure, err
	}
	ls := f.lease
	// An IPv4-only lease has no IPv6 address: IPv6 destinations then fail
	// with ENETUNREACH, so that dual-stack programs use IPv4.
	us, err := userstack.New(userstack.Config{Addrs: addrsOf(ls.Addresses), DNS: ls.DNS, MTU: ls.MTU})
	if err != nil {
		return ExitFailure, err
	}
	if err := f.sess.StartTunnel(ctx, us); err != nil {
		us.Close()
		return ExitFailure, err
	}
	wg := f.sess.wg
	defer wg.Close()
	d := &stackDialer{us: us}
	f.dialer = d

	if err := becomeSubreaper(); err != nil {
		log.Warn("processes the job leaves running will not be stopped at its end", "err", err)
	}
	svcCtx, svcStop := context.WithCancel(context.Background())
	var svc sync.WaitGroup
	defer func() { svcStop(); svc.Wait() }()
	exposeInStack(svcCtx, &svc, log, us, ls.Exposed)

	dns := leaseDNS(ls)
	bd := bypassDialer{stackDialer: d, eng: f.sess.bypass, dns: dns}
	var proxied []string // the job's environment with the proxy variables, once the proxies run
	for f.plan.current() != "" {
		m := f.plan.current()
		if err := ctx.Err(); err != nil {
			return ExitFailure, context.Cause(ctx)
		}
		var cmd *exec.Cmd
		var listener *os.File
		var startErr error
		printLine := func() { fmt.Fprintln(f.cfg.Stderr, f.plan.line()) }
		switch m {
		case ModeSeccomp:
			if err := seccompAvailable(); err != nil {
				if err := f.plan.skip(err); err != nil {
					return ExitFailure, err
				}
				continue
			}
			cmd = f.command(f.env)
			if err := f.sig.starting(ctx); err != nil {
				return ExitFailure, err
			}
			listener, startErr = seccompnotify.Start(cmd, printLine)
			if errors.Is(startErr, seccompnotify.ErrUnavailable) {
				f.sig.notStarted()
				if err := f.plan.skip(startErr); err != nil {
					return ExitFailure, err
				}
				continue
			}
			if startErr == nil {
				r := &redirector{d: bd, dns: dns, v6: loopback6()}
				svc.Add(1)
				go func() {
					defer svc.Done()
					if err := seccompnotify.Serve(svcCtx, log, listener, r); err != nil {
						log.Error("seccomp supervisor stopped; the job's new connections will fail", "err", err)
					}
				}()
			}
		case ModePreload, ModeProxy:
			if proxied == nil {
				if proxied, err = f.proxyEnv(svcCtx, &svc, bd, dns); err != nil {
					return ExitFailure, err
				}
			}
			env := proxied
			if m == ModePreload {
				lib, err := findPreload(f.cfg.Preload)
				if err != nil {
					if err := f.plan.skip(err); err != nil {
						return ExitFailure, err
					}
					continue
				}
				env = setEnv(env, "LD_PRELOAD", lib+preloadRest(env))
			}
			cmd = f.command(env)
			path, code, err := lookJob(f.cfg.Args[0])
			if err != nil {
				printLine()
				fmt.Fprintf(f.cfg.Stderr, "airlock: %v\n", err)
				return code, nil
			}
			cmd.Path = path
			printLine()
			if err := f.sig.starting(ctx); err != nil {
				return ExitFailure, err
			}
			startErr = cmd.Start()
		default:
			return ExitFailure, fmt.Errorf("mode %s cannot run without a namespace", m)
		}
		if startErr != nil {
			f.sig.notStarted()
			return ExitFailure, fmt.Errorf("start job: %w", startErr)
		}
		return f.wait(ctx, cmd, wg)
	}
	return ExitFailure, errors.New("no mode left to run the job in")
}

// command is the job's command with airlock's stdio. The job gets SIGKILL
// if airlock run dies (PR_SET_PDEATHSIG; no privileges change between
// airlock and the job, so exec keeps it).
func (f *fallback) command(env []string) *exec.Cmd {
	cmd := exec.Command(f.cfg.Args[0], f.cfg.Args[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// wait runs the job to its end: signals forwarded, lease renewed.
func (f *fallback) wait(ctx context.Context, cmd *exec.Cmd, wg *tunnel.Client) (int, error) {
	log := f.cfg.Logger
	f.sig.started(cmd.Process.Signal)
	log.Debug("job started", "pid", cmd.Process.Pid, "mode", f.plan.current(), "setup", time.Since(f.t0))
	var err error
	whileJobRuns(f.sess, f.resumeGC, func() { err = cmd.Wait() })
	log.Debug("job exited", "err", err, "since_start", time.Since(f.t0))
	killLeftovers(log, 2*time.Second)
	if f.http != nil {
		f.http.CloseIdleConnections()
	}
	f.dialer.drain(2 * time.Second)
	st := cmd.ProcessState
	if st == nil {
		return ExitFailure, fmt.Errorf("wait for job: %w", err)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return st.ExitCode(), nil
}

// proxyEnv starts the SOCKS5 and HTTP proxies (once) and returns the job's
// environment with the proxy variables.
func (f *fallback) proxyEnv(ctx context.Context, svc *sync.WaitGroup, d proxy.Dialer, dns netip.Addr) ([]string, error) {
	secret, err := proxy.NewSecret()
	if err != nil {
		return nil, err
	}
	log := f.cfg.Logger
	sl, hl, sl6, err := proxyListeners(log)
	if err != nil {
		return nil, err
	}
	socks := &proxy.SOCKS{Dialer: d, Secret: secret, Logger: log}
	httpp := &proxy.HTTP{Dialer: d, Secret: secret, Logger: log}
	f.http = httpp
	svc.Add(2)
	go func() { defer svc.Done(); _ = socks.Serve(ctx, sl) }()
	go func() { defer svc.Done(); _ = httpp.Serve(ctx, hl) }()
	if sl6 != nil {
		svc.Add(1)
		go func() { defer svc.Done(); _ = socks.Serve(ctx, sl6) }()
	}
	go func() {
		<-ctx.Done()
		sl.Close()
		hl.Close()
		if sl6 != nil {
			sl6.Close()
		}
	}()
	return f.withProxyEnv(secret, sl, hl, sl6, dns), nil
}

// proxyListeners opens the SOCKS5 (sl) and HTTP (hl) proxies' listeners
// on loopback, and, where the host has IPv6 loopback, the SOCKS proxy's
// on ::1 too (sl6, else nil).
func proxyListeners(log *slog.Logger) (sl, hl, sl6 net.Listener, err error) {
	sl, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, fmt.Errorf("socks proxy on loopback: %w", err)
	}
	hl, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		sl.Close()
		return nil, nil, nil, fmt.Errorf("http proxy on loopback: %w", err)
	}
	// The preload library's way in for IPv6 sockets that cannot use
	// IPv4-mapped addresses (IPV6_V6ONLY): the same SOCKS proxy on ::1.
	if loopback6() {
		if sl6, err = net.Listen("tcp6", "[::1]:0"); err != nil {
			log.Warn("no socks proxy on IPv6 loopback; IPv6-only sockets will not be intercepted in preload mode", "err", err)
			sl6 = nil
		}
	}
	return sl, hl, sl6, nil
}

// withProxyEnv returns the job's environment with the variables that
// point it (and the preload library) at the proxies of listeners sl, hl
// and sl6, with secret, and at the DNS server dns.
func (f *fallback) withProxyEnv(secret string, sl, hl, sl6 net.Listener, dns netip.Addr) []string {
	httpURL := fmt.Sprintf("http://airlock:%s@%s", secret, hl.Addr())
	socksURL := fmt.Sprintf("socks5h://airlock:%s@%s", secret, sl.Addr())
	env := f.env
	for _, kv := range [][2]string{
		{"http_proxy", httpURL}, {"HTTP_PROXY", httpURL},
		{"https_proxy", httpURL}, {"HTTPS_PROXY", httpURL},
		{"ALL_PROXY", socksURL}, {"all_proxy", socksURL},
		{"NO_PROXY", "localhost,127.0.0.1,::1"}, {"no_proxy", "localhost,127.0.0.1,::1"},
		// For the preload library: where to send what it intercepts.
		// Every address of the SOCKS proxy (IPv4 first, then [::1] if it
		// listens there), comma-separated.
		{"AIRLOCK_SOCKS", socksList(sl, sl6)},
		{"AIRLOCK_SOCKS_SECRET", secret},
		{"AIRLOCK_DNS", dns.String()},
	} {
		env = setEnv(env, kv[0], kv[1])
	}
	if f.dialer.us.Has(ipfamily.V6) {
		// The preload library's getaddrinfo returns AAAA records first.
		env = setEnv(env, "AIRLOCK_IPV6", "1")
	}
	if sl6 != nil {
		// Deprecated alias of AIRLOCK_SOCKS's IPv6 entry, for a release.
		env = setEnv(env, "AIRLOCK_SOCKS6", sl6.Addr().String())
	}
	return env
}

// socksList is AIRLOCK_SOCKS: the proxy's addresses, comma-separated.
func socksList(sl, sl6 net.Listener) string {
	s := sl.Addr().String()
	if sl6 != nil {
		s += "," + sl6.Addr().String()
	}
	return s
}

// setEnv sets NAME=VALUE in env, replacing an earlier value.
func setEnv(env []string, name, value string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return append(out, name+"="+value)
}

// preloadRest keeps a job's own LD_PRELOAD after airlock's library.
func preloadRest(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_PRELOAD="); ok && v != "" {
			return " " + v
		}
	}
	return ""
}

// lookJob finds the job's program like a shell: 127 if not found, 126 if
// not executable.
func lookJob(name string) (string, int, error) {
	path, err := exec.LookPath(name)
	if err == nil {
		return path, 0, nil
	}
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return "", ExitNotFound, fmt.Errorf("%s: command not found", name)
	}
	return "", ExitNotRunnable, fmt.Errorf("%s: %v", name, err)
}

// loopback6 reports whether IPv6 loopback works here, so IPv6 sockets of
// the job can be given IPv6 replacements.
func loopback6() bool {
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// redirector is the seccomp mode's answer to a job's connect().
type redirector struct {
	d   proxy.Dialer
	dns netip.Addr // DNS queries to any address go here
	v6  bool       // IPv6 loopback works
}

// Redirect implements seccompnotify.Redirector.
func (r *redirector) Redirect(ctx context.Context, c seccompnotify.Connect) (*os.File, error) {
	dst := c.Dst
	a := dst.Addr()
	switch {
	case a.IsUnspecified() || a.IsMulticast():
		return nil, nil
	case dst.Port() == 53:
		// The host's resolver is out of reach: every DNS query goes to
		// the tunnel's DNS server, whatever resolv.conf says.
		dst = netip.AddrPortFrom(r.dns, 53)
	case a.IsLoopback(), a.Is6() && a.IsLinkLocalUnicast():
		// Local; an IPv6 link-local peer is on the node's own link.
		return nil, nil
	}
	lo := proxy.LoopbackFor(c.Family, dst.Addr(), r.v6)
	switch c.Type {
	case syscall.SOCK_STREAM:
		dctx, cancel := context.WithTimeout(ctx, proxy.DialTimeout)
		defer cancel()
		rc, err := r.d.DialTCP(dctx, dst)
		if err != nil {
			return nil, err
		}
		return proxy.PipeTCP(rc, lo)
	case syscall.SOCK_DGRAM:
		return proxy.PipeUDP(ctx, r.d, dst, lo)
	}
	return nil, nil
}

// exposeInStack carries the job's exposed TCP ports: connections the
// gateway sends to the job's tunnel address (either, for a dual-stack
// lease) arrive in the user-space stack and are passed on to the same
// port on the host's IPv4 loopback, where the job listens — if the listener there is the job's (its uid's): another
// user's loopback service is never reached. Exposed UDP ports are not
// carried in the fallback modes.
func exposeInStack(ctx context.Context, svc *sync.WaitGroup, log *slog.Logger, us *userstack.Stack, exposed []control.Exposed) {
	refusals := rate.NewLimiter(rate.Every(time.Second), 3)
	for _, x := range exposed {
		if x.Proto != control.ProtoTCP {
			log.Warn("exposed UDP ports are not carried without a network namespace", "port", x.Port.Port)
			continue
		}
		var listeners []net.Listener
		for _, fam := range ipfamily.All {
			if !us.Has(fam) {
				continue
			}
			l, err := us.ListenTCP(fam, x.Port.Port)
			if err != nil {
				log.Warn("cannot carry exposed port", "port", x.Port.Port, "family", fam, "err", err)
				continue
			}
			listeners = append(listeners, l)
		}
		local := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), x.Port.Port)
		for _, l := range listeners {
			svc.Add(1)
			go func() {
				defer svc.Done()
				go func() { <-ctx.Done(); l.Close() }()
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					go func() {
						// Loopback is every local user's: only the job's own
						// listener may receive what comes in for the job.
						dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
						lc, err := proxy.DialOwned(dctx, nil, local)
						cancel()
						if err != nil {
							if errors.Is(err, proxy.ErrForeignPeer) && refusals.Allow() {
								log.Warn("exposed port: the listener on loopback is not the job's; connection refused", "port", x.Port.Port, "err", err)
							}
							c.Close()
							return
						}
						proxy.Splice(c, lc)
					}()
				}
			}()
		}
	}
}
