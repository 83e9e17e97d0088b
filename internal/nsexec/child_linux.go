// SPDX-License-Identifier: MIT

package nsexec

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/fusemount"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/reexec"
)

// Init must be the first call in main. If this process is a namespace child
// started by [Start], Init sets up the namespace, waits for [Job.Run], and
// execs the job's command; it never returns. Otherwise it returns at once.
func Init() {
	var cfg childConfig
	reexec.Main("namespace child", envConfig, envFD, &cfg, stepConfig,
		func(c *reexec.Child) int { return childMain(c, cfg) })
}

// childMain runs in the namespace child and returns its exit code if it
// cannot exec the job. c is close-on-exec: the job does not inherit it.
func childMain(c *reexec.Child, cfg childConfig) int {
	// The job's environment came with the config (Prepare started the
	// child before it was known): PATH for the job's lookup, and what
	// execJob passes on.
	setEnv(cfg.Env)
	tunFD, err := setupNamespace(cfg)
	if err != nil {
		if c.Reply(err) != nil {
			fmt.Fprintf(os.Stderr, "airlock: namespace child: %v\n", err)
		}
		return 1
	}
	err = c.Reply(nil, tunFD)
	unix.Close(tunFD)
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: namespace child: send tun fd: %v\n", err)
		return 1
	}
	// Wait for Run. EOF means the parent gave up (Cleanup or exit).
	if !c.WaitGo() {
		return 1
	}
	// fusermount3 inside the job (internal/fusemount); without a usable
	// /dev/fuse there is nothing to do.
	if err := fusemount.Setup(); err != nil && !errors.Is(err, fusemount.ErrNoDevice) {
		fmt.Fprintf(os.Stderr, "airlock: warning: fusermount3 (FUSE mounts) will not work in the job: %v\n", err)
	}
	return execJob(c, os.Args[1:])
}

// setEnv makes env this process's environment.
func setEnv(env []string) {
	os.Clearenv()
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			os.Setenv(k, v)
		}
	}
}

// setupNamespace makes mounts private, creates and configures the TUN and
// binds resolv.conf. It returns the TUN fd (close-on-exec).
func setupNamespace(cfg childConfig) (int, error) {
	if err := unix.Mount("none", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return -1, &reexec.StepError{Step: stepMounts, Err: fmt.Errorf("mount --make-rprivate /: %w", err)}
	}
	tunFD, err := createTUN(cfg.TUNName)
	if err != nil {
		return -1, err
	}
	if err := configureNetwork(cfg); err != nil {
		unix.Close(tunFD)
		return -1, &reexec.StepError{Step: stepNetwork, Err: err}
	}
	if err := allowPingSockets(os.Getgid()); err != nil {
		// Not fatal: the job runs, only ping(8) fails.
		fmt.Fprintf(os.Stderr, "airlock: warning: ping will not work in the job: %v\n", err)
	}
	if err := bindResolvConf("/etc/resolv.conf", cfg.DNS); err != nil {
		unix.Close(tunFD)
		return -1, &reexec.StepError{Step: stepResolv, Err: err}
	}
	if err := bindGaiConf("/etc/gai.conf", prefixOf(ipfamily.V6, cfg.Addrs)); err != nil {
		unix.Close(tunFD)
		return -1, &reexec.StepError{Step: stepResolv, Err: err}
	}
	return tunFD, nil
}

// pingGroupRange is the sysctl of the current network namespace that lists
// the groups allowed to open ICMP "ping" sockets.
const pingGroupRange = "/proc/sys/net/ipv4/ping_group_range"

// allowPingSockets lets group gid (as seen in the job's user namespace)
// open ICMP ping sockets in the job's network namespace, so that ping(8)
// works unprivileged: a new network namespace starts with
// ping_group_range "1 0" (nobody), and file capabilities such as ping's
// cap_net_raw give nothing useful in a user namespace. The child may write
// it because its user namespace owns the network namespace; only gids
// mapped into that user namespace can be named.
func allowPingSockets(gid int) error {
	v := fmt.Sprintf("%d %d", gid, gid)
	if err := os.WriteFile(pingGroupRange, []byte(v), 0); err != nil {
		return fmt.Errorf("set net.ipv4.ping_group_range=%q in the job's network namespace: %w", v, err)
	}
	return nil
}

// createTUN opens /dev/net/tun and attaches a TUN named name with
// IFF_TUN|IFF_NO_PI|IFF_VNET_HDR.
func createTUN(name string) (int, error) {
	fd, err := unix.Open(tunPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &reexec.StepError{Step: stepTUN, Op: "open", Err: &fs.PathError{Op: "open", Path: tunPath, Err: err}}
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return -1, &reexec.StepError{Step: stepTUN, Err: fmt.Errorf("interface name %q: %w", name, err)}
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return -1, &reexec.StepError{Step: stepTUN, Err: fmt.Errorf("ioctl TUNSETIFF %q: %w", name, err)}
	}
	return fd, nil
}

// configureNetwork sets the TUN's MTU and addresses, brings it and lo up
// and routes the default route of each address's family through the TUN.
func configureNetwork(cfg childConfig) error {
	// One netlink socket for all requests: each package-level netlink call
	// would open its own.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(cfg.TUNName)
	if err != nil {
		return fmt.Errorf("find link %q: %w", cfg.TUNName, err)
	}
	if err := h.LinkSetMTU(link, cfg.MTU); err != nil {
		return fmt.Errorf("set mtu %d on %q: %w", cfg.MTU, cfg.TUNName, err)
	}
	for _, p := range cfg.Addrs {
		// No duplicate address detection (IPv6): the tunnel has no
		// other hosts.
		if err := h.AddrAdd(link, &netlink.Addr{IPNet: prefixIPNet(p), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("add address %s to %q: %w", p, cfg.TUNName, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %q up: %w", cfg.TUNName, err)
	}
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find link lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	for _, p := range cfg.Addrs {
		f := ipfamily.Of(p.Addr())
		route := &netlink.Route{
			LinkIndex: link.Attrs().Index,
			Dst:       &net.IPNet{IP: f.Unspecified.AsSlice(), Mask: net.CIDRMask(0, f.Bits)},
		}
		gw := addrOf(f, cfg.Gateways)
		if gw.IsValid() {
			route.Gw = gw.AsSlice()
			route.Flags = int(netlink.FLAG_ONLINK)
		} else {
			route.Scope = netlink.SCOPE_LINK
		}
		if err := h.RouteAdd(route); err != nil {
			return fmt.Errorf("add %s default route via %s dev %q: %w", f, gw, cfg.TUNName, err)
		}
	}
	return nil
}

// prefixOf returns the prefix of family f in ps, the zero Prefix for none.
func prefixOf(f *ipfamily.Family, ps []netip.Prefix) netip.Prefix {
	for _, p := range ps {
		if f.Contains(p.Addr()) {
			return p
		}
	}
	return netip.Prefix{}
}

// addrOf returns the address of family f in as, the zero Addr for none.
func addrOf(f *ipfamily.Family, as []netip.Addr) netip.Addr {
	for _, a := range as {
		if f.Contains(a) {
			return a
		}
	}
	return netip.Addr{}
}

func prefixIPNet(p netip.Prefix) *net.IPNet {
	a := p.Addr()
	return &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(p.Bits(), a.BitLen())}
}

// execJob execs the job's command with airlock's variables removed from the
// environment and without capabilities, dying with the parent (see
// reexec.Child.Exec). It returns only on failure, with the shell's exit
// code: 127 if the command is not found, 126 if it cannot be executed.
func execJob(c *reexec.Child, args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "airlock: exec: no command")
		return 127
	}
	env := jobEnv(os.Environ())
	path, err := exec.LookPath(args[0])
	if errors.Is(err, exec.ErrDot) {
		err = nil // like a shell: PATH with "." is the user's choice
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock: exec %q: %v\n", args[0], lookPathReason(err))
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			return 127
		}
		return 126
	}
	// Ambient capabilities would survive execve; the job runs without any,
	// like any process of this user (root keeps its namespace capabilities).
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "airlock: exec %q: drop capabilities: %v\n", args[0], err)
		return 126
	}
	err = c.Exec(path, args, env)
	fmt.Fprintf(os.Stderr, "airlock: exec %q: %v\n", args[0], err)
	if errors.Is(err, fs.ErrNotExist) {
		return 127
	}
	return 126
}

// lookPathReason strips the "exec: name:" and "stat path:" layers that the
// message already carries.
func lookPathReason(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		err = ee.Err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return err
}
