// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/fdlimit"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/metrics"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// Run starts the gateway and serves until ctx is cancelled or a component
// fails. It returns nil after a clean shutdown.
//
// The gateway's life: open (the config, the state directory, the egress
// backend, WireGuard, the leases of the previous run, the control and admin
// servers) → serve (one errgroup of servers and loops, until ctx ends or
// one of them fails) → close (what open made, in reverse order; live
// leases stay open in the history for the next start, resume.go).
func Run(ctx context.Context, cfg Config) error {
	if err := cfg.setDefaults(); err != nil {
		return err
	}
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(GCPercent)
	}
	g, err := open(cfg)
	if err != nil {
		return err
	}
	defer g.close()
	return g.serve(ctx)
}

// GCPercent is the Go garbage collector's target (GOGC) of a gateway
// process, unless the GOGC environment variable names another. Idle jobs
// hold most of a gateway's memory and allocate little, so the heap grows
// slowly to its target: at the default 100 it holds twice what is live.
// At 50, 1,764 idle jobs took 60 KiB of resident memory each instead of
// 84 (docs/benchmarks.md, "Scale"), for a little more GC work during a
// join storm.
const GCPercent = 50

// resources are what open made for serve and close.
type resources struct {
	ln    net.Listener // the control API's TCP listener
	srv   *control.Server
	adm   *admin.Server
	admLn net.Listener
	mx    gatewayMetrics
	cert  tls.Certificate
	// ids are the TLS identities the control API presents (key rotation).
	ids *control.Identities
	// port is --listen's port: the TCP and UDP port, 0 until the TCP
	// listener has one.
	port uint16
	info Info
	// undo holds what close does, in the order open did it.
	undo []func()
}

// onClose makes close call f (after everything opened later).
func (g *gateway) onClose(f func()) { g.res.undo = append(g.res.undo, f) }

// close undoes open in reverse order.
func (g *gateway) close() {
	for i := len(g.res.undo) - 1; i >= 0; i-- {
		g.res.undo[i]()
	}
	g.res.undo = nil
}

// newGateway returns a gateway of cfg with nothing open yet: its parts
// wired to it, and Run's start time.
func newGateway(cfg Config) *gateway {
	g := &gateway{log: cfg.Logger, cfg: cfg, started: time.Now()}
	g.admit.g = g
	g.fleet.g = g
	g.admin.g = g
	return g
}

// open makes everything the gateway serves with, phase by phase. On error
// everything it made is closed.
func open(cfg Config) (_ *gateway, err error) {
	g := newGateway(cfg)
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	for _, phase := range []func() error{g.openState, g.openEgress, g.openTunnel, g.openServers} {
		if err := phase(); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// openState loads the config (validated before anything is opened) and
// opens the state directory: the WireGuard key, the TLS identity and the
// lease history.
func (g *gateway) openState() error {
	cfg := g.cfg
	conf, err := loadConfig(cfg)
	if err != nil {
		return err
	}
	g.conf.Store(conf)
	if err := ensureStateDir(cfg.StateDir, g.log); err != nil {
		return err
	}
	host, port, err := splitListen(cfg.Listen)
	if err != nil {
		return err
	}
	g.gwAddr = cfg.subnet().Addr().Next()
	if !cfg.subnet().Contains(g.gwAddr) {
		return fmt.Errorf("subnet %s has no host addresses", cfg.subnet())
	}
	if g.cfg.Subnets, err = planSubnets(cfg, g.log); err != nil {
		return err
	}
	wgKey, err := loadOrCreateKey(filepath.Join(cfg.StateDir, WireGuardKeyFile))
	if err != nil {
		return err
	}
	g.wgPriv, g.wgPub = wgKey, wgKey.PublicKey()
	cert, fp, created, err := control.LoadOrCreateIdentity(cfg.StateDir, certHosts(host, cfg.Advertise))
	if err != nil {
		return fmt.Errorf("tls identity: %w", err)
	}
	if created {
		g.log.Info("created gateway identity", "dir", cfg.StateDir, "pin", fp)
	}
	next, err := control.LoadNextIdentity(cfg.StateDir)
	if err != nil {
		return fmt.Errorf("tls identity: %w", err)
	}
	g.res.cert, g.res.port = cert, port
	g.res.ids = control.NewIdentities(cert, next)
	g.res.info = Info{Fingerprint: fp, Gateway: g.gwAddr}
	if next != nil {
		g.res.info.NextFingerprint = control.Fingerprint(next.Leaf)
		g.log.Warn("TLS key rotation under way: clients that name the next pin get the next key; finish with airlock gateway rotate-key --finish",
			"pin", fp, "next_pin", g.res.info.NextFingerprint)
	}
	if g.local, err = store.Open(filepath.Join(cfg.StateDir, DBFile), time.Second); err != nil {
		return err
	}
	g.st = g.local
	g.onClose(func() { g.local.Close() })
	if err := g.admit.applyAttest(conf.Attest); err != nil {
		return err
	}
	return g.fleet.openRemote()
}

// splitListen parses --listen: HOST:PORT, PORT 0 for one the kernel picks.
func splitListen(listen string) (host string, port uint16, err error) {
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("parse --listen %q: %w", listen, err)
	}
	p, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("parse --listen port %q: %w", portStr, err)
	}
	return host, uint16(p), nil
}

// openEgress plans the egress (mode, public addresses, port blocks),
// opens the flow table and log, the lease manager and the egress backend
// with the config's policy and global limits.
func (g *gateway) openEgress() error {
	cfg := g.cfg
	eg, err := planEgress(cfg, hostEgressEnv)
	if err != nil {
		return err
	}
	eg.logPublic(g.log)
	eg.exposeAddr = exposeAddr(eg)
	g.egress = eg
	// One job index for the flow table, the egress backend (which adds
	// and removes jobs' addresses) and the capture taps.
	g.index = new(jobs.Index)
	tb, closeFlowLog, err := openFlows(cfg, g.index)
	if err != nil {
		return err
	}
	g.flows = tb
	g.onClose(func() { closeFlowLog() })
	if g.admit.maxBlocks, err = planMaxBlock(cfg, eg); err != nil {
		return err
	}
	// A job's blocks are consecutive port blocks of one address: pool
	// blocks len(Addrs) apart (portblock.Pool.Run).
	if g.leases, err = lease.NewStride(cfg.subnet(), g.gwAddr, cfg.LeaseTTL, eg.pool.Blocks(), max(1, len(eg.pool.Addrs))); err != nil {
		return err
	}
	if err := g.egress.applyPrefix6(g.log, g.leases); err != nil {
		return err
	}
	g.tunnels = tunnelAddrs(g.leases)
	conf := g.conf.Load()
	g.admit.warnBlockSizes(conf.Quotas)
	g.egress.capacity = planCapacity(eg.pool.Blocks(), cfg.subnet(), openFilesLimit())
	g.egress.capacity.log(g.log)
	return nil
}

// openTunnel opens the control API's TCP listener, the egress backend and
// the WireGuard device on the UDP port of the same number, with the capture
// tap between them.
func (g *gateway) openTunnel() error {
	cfg, log := g.cfg, g.log
	// TCP first: if the port is 0 the kernel picks one and UDP follows it.
	ln, err := listenTCP(cfg.Listen, g.res.port == 0)
	if err != nil {
		return fmt.Errorf("listen tcp %s: %w", cfg.Listen, err)
	}
	ln = &filesListener{Listener: ln, warn: fdlimit.NewWarner(log)}
	g.res.ln = ln
	g.onClose(func() { ln.Close() })
	port := g.res.port
	if port == 0 {
		port = uint16(ln.Addr().(*net.TCPAddr).Port)
	}
	if g.mtu, err = newPathMTU(cfg, g.egress.mode); err != nil {
		return err
	}
	dev, err := newForwarder(cfg, g.egress, g.tunnels, g.flows, g.mtu)
	if err != nil {
		return err
	}
	g.backend = dev
	g.onClose(func() { dev.Close() })
	if err := setBackend(dev, g.conf.Load()); err != nil {
		return err
	}
	udp, err := tunnel.NewReusePortBind(cfg.UDPSockets)
	if err != nil {
		return err
	}
	bind := tunnel.NewBind(udp, log.With("component", "transport"))
	if g.mtu.key != nil {
		bind.AnswerProbes(g.mtu.key)
		log.Info("offering clients a tunnel mtu up to the path's, proven by a probe", "mtu", cfg.MTU, "max_mtu", g.mtu.ceiling)
	}
	if g.tr, err = newTransportState(bind); err != nil {
		return err
	}
	// Both egress modes' packets pass here: the capture feeds' tap.
	g.capture = capture.NewDevice(dev, g.index)
	g.wg, err = tunnel.NewGateway(log, g.capture, dev.Queues(), bind, g.wgPriv, port)
	if err != nil {
		return fmt.Errorf("%w (is another process using udp port %d?)", err, port)
	}
	g.onClose(g.wg.Close)
	log.Info("data path in parallel", "udp_sockets", cfg.UDPSockets, "tun_queues", dev.Queues(), "gomaxprocs", runtime.GOMAXPROCS(0))
	g.udp = tunnel.NewSocketWatch(g.wg.Port())
	checkUDPBuffers(log, g.udp)
	g.advertise = cfg.Advertise
	if g.advertise == "" {
		host, _, _ := net.SplitHostPort(cfg.Listen)
		g.advertise = deriveAdvertise(host, int(port))
		log.Info("advertising derived address; set --advertise if clients must dial another", "advertise", g.advertise)
	}
	g.res.info.Advertise, g.res.info.Control, g.res.info.UDPPort = g.advertise, ln.Addr(), g.wg.Port()
	return nil
}

// listenTCP opens the control API's listener on addr. With pick (port 0)
// the kernel picks the TCP port and the WireGuard device takes the UDP
// port of the same number: a picked port whose UDP twin someone holds is
// given back and another one picked (up to pickTries times), so that a
// busy machine does not fail the gateway's start.
func listenTCP(addr string, pick bool) (net.Listener, error) {
	for i := 1; ; i++ {
		ln, err := net.Listen("tcp", addr)
		if err != nil || !pick || i == pickTries {
			return ln, err
		}
		if udpFree(ln.Addr().(*net.TCPAddr).Port) {
			return ln, nil
		}
		ln.Close()
	}
}

// pickTries bounds listenTCP's picks.
const pickTries = 20

// udpFree reports whether the UDP port is free on both families, as
// WireGuard's bind opens it (a host without IPv6 counts as free there).
func udpFree(port int) bool {
	for _, nw := range []string{"udp4", "udp6"} {
		c, err := net.ListenPacket(nw, ":"+strconv.Itoa(port))
		if err != nil {
			if nw == "udp6" && !errors.Is(err, syscall.EADDRINUSE) {
				continue
			}
			return false
		}
		c.Close()
	}
	return true
}

// openServers registers the metrics, takes back the leases of the previous
// run and makes the control server, the capture feeds and the admin
// socket (openAdmin).
func (g *gateway) openServers() error {
	log := g.log
	mx, err := g.newMetrics()
	if err != nil {
		return err
	}
	g.res.mx, g.metrics = mx, mx.metrics
	if mx.listener != nil {
		g.onClose(func() { mx.listener.Close() })
	}
	if err := g.registerTransportMetrics(mx.registry); err != nil {
		return err
	}
	if err := g.fleet.openFleet(); err != nil {
		return err
	}
	if err := g.fleet.registerFleetMetrics(mx.registry); err != nil {
		return err
	}
	if err := g.fleet.loadBans(time.Now()); err != nil {
		return err
	}
	g.onClose(g.admit.bearer.close)
	if err := g.admit.applyBearer(g.conf.Load().Bearer); err != nil {
		return err
	}
	if n, closed, err := g.restoreLeases(time.Now()); err != nil {
		return err
	} else if n > 0 || closed > 0 {
		log.Info("leases of the previous run", "restored", n, "closed", closed)
	}
	g.res.srv = control.NewServer(control.ServerConfig{
		Logger:            log.With("component", "control"),
		Store:             g.st,
		Backend:           g,
		Certificate:       g.res.cert,
		Identities:        g.res.ids,
		OnJoin:            mx.metrics.ObserveJoin,
		Version:           g.cfg.Version,
		OnClientVersion:   mx.metrics.ObserveClientVersion,
		CaptureRelay:      g.fleet.captureRelay(),
		Attest:            &g.admit.attest,
		Bearer:            &g.admit.bearer,
		MaxConnsPerSource: g.cfg.MaxConnsPerSource,
	})
	g.wakeWatches = g.res.srv.WakeWatches
	if err := g.openCapture(mx.registry); err != nil {
		return err
	}
	return g.openAdmin()
}

// openAdmin makes the admin server, answered by the admin part and the
// fleet's, with the metrics, and opens its socket in the state directory.
func (g *gateway) openAdmin() error {
	adm := admin.NewServer(g.log.With("component", "admin"), g.st)
	g.res.adm = adm
	adm.SetGateway(&g.admin)
	adm.SetKeyRotator(&g.admin)
	adm.SetBackuper(&g.admin)
	g.fleet.registerFleetAdmin(adm)
	// The metrics also on the admin socket, for airlock gateway diag
	// whether or not --metrics serves them on the network.
	adm.Handle("GET "+admin.MetricsPath, metrics.Handler(g.res.mx.registry))
	ln, err := admin.Listen(filepath.Join(g.cfg.StateDir, admin.SocketName))
	if err != nil {
		return err
	}
	g.res.admLn = ln
	g.onClose(func() { ln.Close() })
	return nil
}

// serve runs the servers and loops until ctx ends or one of them fails,
// then stops them all. The jobs of live leases leave the WireGuard device
// and the egress backend; their leases stay open in the history.
func (g *gateway) serve(ctx context.Context) error {
	grp, gctx := errgroup.WithContext(ctx)
	r := &g.res
	grp.Go(func() error { return wrapErr("control api", r.srv.Serve(r.ln)) })
	grp.Go(func() error { return r.adm.ServeListener(r.admLn) })
	if r.mx.listener != nil {
		grp.Go(func() error { return metrics.Serve(gctx, r.mx.listener, r.mx.registry) })
	}
	loops := []func(context.Context){g.expireLoop, g.prune, g.loadLoop, g.flows.Run, g.handshakeLoop, g.runFeeds,
		g.endpointLoop, g.rehandshakeLoop}
	if g.cfg.Reload != nil {
		loops = append(loops, func(ctx context.Context) { g.admin.reloadLoop(ctx, g.cfg.Reload) })
	}
	if g.fleet.node != nil {
		loops = append(loops, g.fleet.node.Run)
	}
	for _, loop := range loops {
		grp.Go(func() error {
			loop(gctx)
			return nil
		})
	}
	grp.Go(func() error {
		<-gctx.Done()
		if ctx.Err() != nil {
			g.log.Info("gateway stopping", "reason", context.Cause(ctx))
		}
		shutCtx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = r.srv.Shutdown(shutCtx)
		_ = r.adm.Close()
		return nil
	})
	g.ready()
	err := grp.Wait()
	if err != nil {
		g.log.Error("gateway failed", "err", err)
	}
	for _, l := range g.leases.Leases() {
		g.wg.RemovePeer(l.PublicKey)
		g.removeJob(l)
	}
	return err
}

// prune is pruneLoop with the configured retention.
func (g *gateway) prune(ctx context.Context) { g.pruneLoop(ctx, g.cfg.History) }

// wrapErr prefixes a non-nil err with what failed.
func wrapErr(what string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// ready writes join.env, logs how to reach the gateway and calls
// Config.Ready.
func (g *gateway) ready() {
	cfg, eg, conf, info := g.cfg, g.egress, g.conf.Load(), g.res.info
	if err := writeJoinEnv(filepath.Join(cfg.StateDir, JoinEnvFile), info); err != nil {
		g.log.Error("cannot write join.env", "err", err)
	}
	if cfg.ConfigFile != "" {
		g.warnConfig(conf)
	}
	g.log.Info("gateway ready",
		"version", cfg.Version, "AIRLOCK_GATEWAY", info.Advertise, "AIRLOCK_PIN", info.Pins(),
		"join_env", filepath.Join(cfg.StateDir, JoinEnvFile),
		"subnets", cfg.Subnets, "tunnel_addrs", g.tunnels, "egress", eg.mode, "egress_addr", eg.public,
		"egress_ports", eg.plan.Range, "block_size", eg.plan.Size, "max_block_size", g.admit.maxBlocks*eg.plan.Size, "egress_addrs", len(eg.pool.Addrs), "blocks", eg.pool.Blocks(),
		"config", cfg.ConfigFile, "policy_rules", len(conf.Policy.Rules), "policy_default", conf.Policy.Default,
		"job_egress_rate", limits.FormatRate(conf.Limits.Job.EgressBitsPerSec), "job_ingress_rate", limits.FormatRate(conf.Limits.Job.IngressBitsPerSec),
		"job_max_flows", conf.Limits.Job.MaxFlows, "job_new_flows_per_sec", conf.Limits.Job.NewFlowsPerSec, "token_limits", len(conf.Limits.Tokens),
		"egress_rate", limits.FormatRate(conf.Limits.EgressBitsPerSec), "ingress_rate", limits.FormatRate(conf.Limits.IngressBitsPerSec),
		"hint", "make a join token with: airlock token create --state "+cfg.StateDir)
	if cfg.Ready != nil {
		cfg.Ready(info)
	}
}

// filesListener is the control API's listener: when an accept fails for
// lack of file descriptors (net/http retries it and logs only at Debug),
// it warns, as the egress does for its dials.
type filesListener struct {
	net.Listener
	warn *fdlimit.Warner
}

func (l *filesListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		l.warn.Note(err, "clients' joins and sessions are not accepted", "listen", l.Addr())
	}
	return c, err
}
