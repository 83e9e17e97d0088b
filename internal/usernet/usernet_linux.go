// SPDX-License-Identifier: MIT

// Package usernet gives the unprivileged user-mode gateway the host kernel's
// own TCP stack: a private user and network namespace, owned by the gateway
// user, holding a TUN device and one transparent listening socket that
// every TCP connection arriving on the TUN is steered to.
//
// # Theory of operation
//
// The gateway's netstack terminates jobs' flows in gVisor, whose TCP has
// only loss-based congestion control and costs user-space CPU per packet.
// The kernel's TCP (with the host's congestion control, e.g. bbr, GRO and
// GSO) is available to an unprivileged process too, inside a network
// namespace of its own: a user namespace grants CAP_NET_ADMIN over the
// network namespace it owns, without any privilege on the host.
//
// [Open] re-executes the current binary (/proc/self/exe) with
// CLONE_NEWUSER|CLONE_NEWNET, the gateway's uid and gid mapped to
// themselves and CAP_NET_ADMIN as an ambient capability of the new user
// namespace only. The child starts in [Init], called first thing in main,
// and inside the new namespace
//
//  1. creates a TUN (IFF_TUN|IFF_NO_PI|IFF_VNET_HDR, so the parent enables
//     TSO/GRO offloads on it; with several queues IFF_MULTI_QUEUE and a
//     descriptor per queue, internal/mqtun) with the tunnel MTU, brings it
//     and lo up and routes the jobs' subnets (one per address family)
//     through it;
//  2. makes every address of each of those families local ("ip route add
//     local 0.0.0.0/0 dev lo", "ip -6 route add local ::/0 dev lo", the
//     AnyIP idiom), so the kernel accepts a job's connection to any
//     destination as its own;
//  3. opens one dual-stack TCP listener bound to [::]:PORT (IPV6_V6ONLY
//     off) with IP_TRANSPARENT and installs one nftables rule in an inet
//     table, "iif tun tcp tproxy to :PORT", that hands every TCP SYN of
//     either family arriving on the TUN to that listener; the accepted
//     socket's local address is the job's original destination (an
//     IPv4 one IPv4-mapped);
//  4. sends the TUN and listener descriptors to the parent (SCM_RIGHTS) on a
//     socketpair and exits; or, if a step failed, the step and its errno
//     (internal/reexec, as for every helper child).
//
// The descriptors keep the namespaces alive: a socket holds a reference to
// its network namespace, which holds its owning user namespace. When the
// gateway closes both (or dies), the kernel frees everything; nothing is
// left on the host. Nothing in the namespace reaches the host's network:
// its only links are lo and the TUN, and the gateway re-originates each
// accepted connection as an ordinary socket of its own.
package usernet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/mqtun"
	"github.com/airlock-vpn/airlock/internal/reexec"
)

const (
	envConfig = "AIRLOCK_USERNET_CONFIG" // JSON childConfig; selects the child in Init
	envFD     = "AIRLOCK_USERNET_FD"     // names the socketpair in the child (reexec)
	childArg0 = "airlock-usernet"

	// TUNName is the TUN's name inside the private namespace.
	TUNName = "airlock0"

	openTimeout = 10 * time.Second
)

// Setup steps named in the child's errors.
const (
	stepConfig   = "decode private namespace config"
	stepTUN      = "create tun in private namespace"
	stepLinks    = "configure links in private namespace"
	stepListener = "open transparent listener"
	stepTProxy   = "install tproxy rule"
)

// Namespace is an open private namespace: the TUN that carries the jobs'
// TCP packets into it and the listener its TCP connections arrive on. The
// caller owns both files and closes them when done; closing both frees the
// namespace.
type Namespace struct {
	// TUN are the TUN device's queues, a file each (one without
	// IFF_MULTI_QUEUE), with IFF_VNET_HDR set and in blocking mode.
	TUN []*os.File
	// Listener accepts the jobs' TCP connections of both families; an
	// accepted connection's LocalAddr is the job's destination and its
	// RemoteAddr the job's tunnel address and port (IPv4 ones
	// IPv4-mapped).
	Listener *net.TCPListener
	// Subnets are the jobs' subnets the namespace routes, one per
	// address family it carries.
	Subnets []netip.Prefix
	// Qdisc says what queues the kernel's packets to jobs in front of the
	// TUN: "fq_codel", or why the TUN keeps the kernel's default (a kernel
	// built without fq_codel); for the caller's debug log.
	Qdisc string
}

// Close closes the TUN and the listener.
func (n *Namespace) Close() error {
	var errs []error
	for _, f := range n.TUN {
		errs = append(errs, f.Close())
	}
	return errors.Join(append(errs, n.Listener.Close())...)
}

// initCalled records that Init ran in main, so Open may re-execute this
// binary. It is set once, before any Open.
var initCalled atomic.Bool

// childConfig is what the child needs.
type childConfig struct {
	Subnets []netip.Prefix `json:"subnets"`
	MTU     int            `json:"mtu"`
	Queues  int            `json:"queues"`
}

// Open creates the private namespace for jobs in subnets (at most one per
// address family) with TUN MTU mtu and queues TUN queues (1 to
// mqtun.MaxQueues; more than one: a multi-queue TUN). It fails where the host forbids
// unprivileged user namespaces or /dev/net/tun, or the kernel lacks
// nftables tproxy or IPv6 (with an IPv6 subnet); the error says which.
func Open(ctx context.Context, subnets []netip.Prefix, mtu, queues int) (*Namespace, error) {
	if !initCalled.Load() {
		// The child is this binary re-executed; without Init in its main
		// it would run as something else (a test binary: its tests).
		return nil, errors.New("open private namespace: usernet.Init is not called in this binary's main")
	}
	if queues < 1 || queues > mqtun.MaxQueues {
		return nil, fmt.Errorf("open private namespace: %d tun queues, want 1-%d", queues, mqtun.MaxQueues)
	}
	var seen [ipfamily.N]bool
	cfg := childConfig{MTU: mtu, Queues: queues}
	for _, p := range subnets {
		f := ipfamily.Of(p.Addr())
		if f == nil || !p.IsValid() || p.Addr().Is4In6() || seen[f.Index] {
			return nil, fmt.Errorf("open private namespace: subnets %v: want at most one IPv4 and one IPv6 prefix", subnets)
		}
		seen[f.Index] = true
		cfg.Subnets = append(cfg.Subnets, p.Masked())
	}
	if len(cfg.Subnets) == 0 {
		return nil, errors.New("open private namespace: no subnet")
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("open private namespace: %w", err)
	}
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        []string{childArg0},
		Env:         []string{envConfig + "=" + string(raw)},
		Stderr:      os.Stderr,
		SysProcAttr: reexec.IdentityMapped(unix.CLONE_NEWUSER|unix.CLONE_NEWNET, unix.CAP_NET_ADMIN),
	}
	ctl, err := reexec.Start(cmd, envFD)
	if err != nil {
		return nil, fmt.Errorf("open private namespace: start child: %w (unprivileged user namespaces disabled?)", err)
	}
	defer cmd.Wait()
	defer ctl.Close()
	ctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	names := make([]string, 0, queues+1)
	for i := 0; i < queues; i++ {
		names = append(names, "/dev/net/tun")
	}
	files, err := ctl.Receive(ctx, append(names, "usernet-listener")...)
	if err != nil {
		cmd.Process.Kill()
		if errors.Is(err, reexec.ErrNoReply) {
			err = errors.New("child exited during setup")
		}
		return nil, fmt.Errorf("open private namespace: %w", err)
	}
	tunFiles, lf := files[:queues], files[queues]
	ln, err := net.FileListener(lf)
	lf.Close()
	if err != nil {
		for _, f := range tunFiles {
			f.Close()
		}
		return nil, fmt.Errorf("open private namespace: listener: %w", err)
	}
	return &Namespace{TUN: tunFiles, Listener: ln.(*net.TCPListener), Subnets: cfg.Subnets, Qdisc: ctl.Note()}, nil
}

// Init must be called first thing in main. If this process is the child
// started by [Open], Init sets up the namespace, sends the descriptors and
// exits; otherwise it returns at once.
func Init() {
	initCalled.Store(true)
	var cfg childConfig
	reexec.Main("private namespace child", envConfig, envFD, &cfg, stepConfig,
		func(c *reexec.Child) int { return childMain(c, cfg) })
}

func childMain(c *reexec.Child, cfg childConfig) int {
	tunFDs, lnFD, qdisc, err := setup(cfg)
	if err != nil {
		if rerr := c.Reply(err); rerr != nil {
			fmt.Fprintf(os.Stderr, "airlock: private namespace child: %v\n", err)
		}
		return 1
	}
	if err := c.ReplyNote(nil, qdisc, append(tunFDs, lnFD)...); err != nil {
		fmt.Fprintf(os.Stderr, "airlock: private namespace child: %v\n", err)
		return 1
	}
	return 0
}

// setup runs in the child, inside the new namespaces. qdisc is what
// [Namespace.Qdisc] reports.
func setup(cfg childConfig) (tunFDs []int, lnFD int, qdisc string, err error) {
	tunFDs, err = mqtun.OpenQueues(TUNName, max(cfg.Queues, 1))
	if err != nil {
		return nil, -1, "", &reexec.StepError{Step: stepTUN, Err: err}
	}
	defer func() {
		if err != nil {
			for _, fd := range tunFDs {
				unix.Close(fd)
			}
		}
	}()
	qdisc, err = configureLinks(cfg)
	if err != nil {
		return nil, -1, "", &reexec.StepError{Step: stepLinks, Err: err}
	}
	lnFD, port, err := transparentListener()
	if err != nil {
		return nil, -1, "", &reexec.StepError{Step: stepListener, Err: err}
	}
	if err := installTProxy(port); err != nil {
		unix.Close(lnFD)
		return nil, -1, "", &reexec.StepError{Step: stepTProxy, Err: err}
	}
	return tunFDs, lnFD, qdisc, nil
}

// configureLinks brings lo and the TUN up, routes the jobs' subnets through
// the TUN and makes every address of their families local. It puts
// fq_codel on the TUN where the kernel has it and returns what the TUN's
// qdisc is ([Namespace.Qdisc]).
func configureLinks(cfg childConfig) (qdisc string, err error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return "", fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(TUNName)
	if err != nil {
		return "", fmt.Errorf("find %s: %w", TUNName, err)
	}
	qdisc = setFQCoDel(h, link)
	if err := configureLinkAddrs(h, link, cfg); err != nil {
		return "", err
	}
	return qdisc, nil
}

// setFQCoDel replaces the TUN's root qdisc with fq_codel (the kernel's
// defaults: target 5 ms, interval 100 ms, flows hashed by 5-tuple), so the
// kernel's packets to different jobs, and to one job's different flows,
// queue apart and by delay before the gateway reads them. A kernel built
// without fq_codel (CONFIG_NET_SCH_FQ_CODEL unset, no module) keeps its
// default; the gateway's own per-job queue bounds delay there
// (third_party/wireguard-go fairqueue.go).
func setFQCoDel(h *netlink.Handle, link netlink.Link) string {
	q := netlink.NewFqCodel(netlink.QdiscAttrs{LinkIndex: link.Attrs().Index, Parent: netlink.HANDLE_ROOT})
	if err := h.QdiscReplace(q); err != nil {
		if errors.Is(err, unix.ENOENT) { // netlink's answer to an unknown qdisc kind
			return "the kernel's default (fq_codel: not in this kernel)"
		}
		return fmt.Sprintf("the kernel's default (fq_codel: %v)", err)
	}
	return "fq_codel"
}

// configureLinkAddrs does the rest of configureLinks.
func configureLinkAddrs(h *netlink.Handle, link netlink.Link, cfg childConfig) error {
	for _, sub := range cfg.Subnets {
		if sub.Addr().Is6() {
			if err := enableIPv6(); err != nil {
				return err
			}
		}
	}
	if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
		return fmt.Errorf("set mtu %d on %s: %w", cfg.MTU, TUNName, err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", TUNName, err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	for _, sub := range cfg.Subnets {
		f := ipfamily.Of(sub.Addr())
		if err := h.RouteAdd(&netlink.Route{
			LinkIndex: link.Attrs().Index,
			Dst:       ipNet(sub),
			Scope:     netlink.SCOPE_LINK,
		}); err != nil {
			return fmt.Errorf("route %s via %s: %w", sub, TUNName, err)
		}
		if err := h.RouteAdd(&netlink.Route{
			LinkIndex: lo.Attrs().Index,
			Dst:       ipNet(f.All),
			Type:      unix.RTN_LOCAL,
			Scope:     netlink.SCOPE_HOST,
			Table:     unix.RT_TABLE_MAIN,
		}); err != nil {
			return fmt.Errorf("make every %s address local: %w", f, err)
		}
	}
	return nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// enableIPv6 turns IPv6 on in the namespace (a new namespace may start
// with it off, the host's default for new ones; the TUN would drop every
// IPv6 packet) and keeps the TUN without a link-local address, so that
// it sends no router solicitations or duplicate address probes of its
// own to the jobs.
func enableIPv6() error {
	for _, dev := range []string{"all", "default", "lo", TUNName} {
		if err := writeSysctl("net/ipv6/conf/"+dev+"/disable_ipv6", "0"); err != nil {
			return fmt.Errorf("enable IPv6 (%s): %w", dev, err)
		}
	}
	if err := writeSysctl("net/ipv6/conf/"+TUNName+"/addr_gen_mode", "1"); err != nil {
		return fmt.Errorf("no link-local address on %s: %w", TUNName, err)
	}
	return nil
}

// writeSysctl writes a sysctl of the namespace, e.g.
// "net/ipv6/conf/all/disable_ipv6".
func writeSysctl(name, value string) error {
	return os.WriteFile("/proc/sys/"+name, []byte(value), 0)
}

// transparentListener opens the TCP listener on [::] with a kernel-chosen
// port, IPV6_V6ONLY off (IPv4 connections arrive IPv4-mapped) and
// IP_TRANSPARENT, which tproxy requires of the sockets it steers
// connections to (one flag for both families: IPV6_TRANSPARENT sets the
// same). Without IPv6 in the namespace it falls back to 0.0.0.0.
func transparentListener() (fd, port int, err error) {
	family := unix.AF_INET6
	fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if errors.Is(err, unix.EAFNOSUPPORT) {
		family = unix.AF_INET
		fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return -1, 0, fmt.Errorf("listener socket: %w", err)
	}
	fail := func(op string, err error) (int, int, error) {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("listener %s: %w", op, err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_IP, unix.IP_TRANSPARENT, 1); err != nil {
		return fail("IP_TRANSPARENT", err)
	}
	var sa unix.Sockaddr = &unix.SockaddrInet4{}
	if family == unix.AF_INET6 {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0); err != nil {
			return fail("IPV6_V6ONLY", err)
		}
		sa = &unix.SockaddrInet6{}
	}
	if err := unix.Bind(fd, sa); err != nil {
		return fail("bind", err)
	}
	if err := unix.Listen(fd, 4096); err != nil {
		return fail("listen", err)
	}
	got, err := unix.Getsockname(fd)
	if err != nil {
		return fail("getsockname", err)
	}
	switch a := got.(type) {
	case *unix.SockaddrInet6:
		return fd, a.Port, nil
	case *unix.SockaddrInet4:
		return fd, a.Port, nil
	}
	return fail("getsockname", fmt.Errorf("address %T", got))
}

// installTProxy adds the one rule that steers TCP of both families
// arriving on the TUN to the listener on port: table inet airlock, chain
// prerouting (filter, priority mangle): iifname airlock0 meta l4proto tcp
// tproxy to :port.
func installTProxy(port int) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "airlock"})
	pol := nftables.ChainPolicyAccept
	ch := c.AddChain(&nftables.Chain{
		Name: "prerouting", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &pol,
	})
	ifname := make([]byte, unix.IFNAMSIZ)
	copy(ifname, TUNName)
	c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Immediate{Register: 1, Data: binaryPort(port)},
		// No address, so one rule serves both families.
		&expr.TProxy{Family: byte(unix.NFPROTO_UNSPEC), TableFamily: byte(nftables.TableFamilyINet), RegPort: 1},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install tproxy rule (kernel needs nft_tproxy): %w", err)
	}
	return nil
}

func binaryPort(p int) []byte { return []byte{byte(p >> 8), byte(p)} }
