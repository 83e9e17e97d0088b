// SPDX-License-Identifier: MIT

package forwardtest

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/test/topology"
)

// envIsolated marks the re-executed test binary that runs one test inside a
// fresh user and network namespace; its value is the test's name.
const envIsolated = "AIRLOCK_FORWARDTEST_NETNS"

// isolatedTimeout bounds one isolated test run, including the binary's
// start.
const isolatedTimeout = 3 * time.Minute

// Addresses of the topology that [Isolate] and [NewOutside] build.
var (
	// EgressAddr is the gateway's public address: the gateway's end of
	// the link to the outside.
	EgressAddr = netip.MustParseAddr("203.0.113.1")
	// PeerAddr is the outside peer's address (documentation range, so
	// the floor leaves it open).
	PeerAddr = netip.MustParseAddr("203.0.113.2")
	// PrivatePeerAddr is a second address of the outside peer in a range
	// the floor protects (RFC 1918), routed from the gateway, for rules
	// that open a protected range.
	PrivatePeerAddr = netip.MustParseAddr("10.99.0.2")

	// EgressAddr6, PeerAddr6 and PrivatePeerAddr6 are the same over
	// IPv6: documentation addresses on the link, and a unique-local one
	// (protected, builtin-private) behind the peer.
	EgressAddr6      = netip.MustParseAddr("2001:db8:e::1")
	PeerAddr6        = netip.MustParseAddr("2001:db8:e::2")
	PrivatePeerAddr6 = netip.MustParseAddr("fd99::2")

	// OwnPrefix is the routed prefix of jobs' own public IPv6 addresses
	// (--egress-prefix): the outside routes it to EgressAddr6, and a
	// backend's test makes the gateway's side of it (user mode: a local
	// route; kernel mode does it itself).
	OwnPrefix = netip.MustParsePrefix("2001:db8:77::/64")
)

// Isolate re-executes the running test binary to run the calling test
// alone inside a fresh user and network namespace, where the process is
// root of the user namespace (mapped to the caller's uid and gid, so no
// privilege on the host is needed or used), and reports whether the caller
// is that child: then it should run the test body; else the parent has
// already waited for the child and reported its result. It skips the test
// where unprivileged user namespaces are not available, unless CI is set.
func Isolate(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envIsolated) == t.Name() {
		return true
	}
	var run []string
	for _, part := range strings.Split(t.Name(), "/") {
		run = append(run, "^"+regexp.QuoteMeta(part)+"$")
	}
	// Levels of -test.run below the isolated test select its subtests
	// in the child (e.g. -run TestConformance/kernel/Floor).
	if f := flag.Lookup("test.run"); f != nil {
		if levels := strings.Split(f.Value.String(), "/"); len(levels) > len(run) {
			run = append(run, levels[len(run):]...)
		}
	}
	args := []string{"-test.run=" + strings.Join(run, "/"), "-test.count=1", "-test.timeout=" + isolatedTimeout.String()}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	if testing.Short() {
		args = append(args, "-test.short")
	}
	ctx, cancel := context.WithTimeout(context.Background(), isolatedTimeout+10*time.Second)
	defer cancel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), envIsolated+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	out, err := cmd.CombinedOutput()
	if err != nil && cmd.ProcessState == nil {
		if os.Getenv("CI") == "" {
			t.Skipf("cannot start the test in a new user and network namespace (unprivileged user namespaces disabled?): %v", err)
		}
		t.Fatalf("start the test in a new user and network namespace: %v", err)
	}
	if err != nil || !bytes.Contains(out, []byte("\nPASS")) && !bytes.HasPrefix(out, []byte("PASS")) {
		t.Fatalf("test in a fresh user and network namespace: %v\n%s", err, out)
	}
	t.Logf("in a fresh user and network namespace:\n%s", out)
	return false
}

// Outside is the world outside the gateway in an [Isolate]d test: a
// network namespace of its own, linked to the test's namespace (the
// gateway's) by a veth pair, with the gateway's end at EgressAddr/24 and
// EgressAddr6/64 and the peer's at PeerAddr/24, PrivatePeerAddr/24,
// PeerAddr6/64 and PrivatePeerAddr6/64; the peer routes OwnPrefix to the
// gateway. Sockets the test
// opens inside [Outside.Do] live there: real peers reached only through
// the backend's egress.
type Outside struct {
	ns   int // the outside namespace
	home int // the test's own network namespace
}

// Link names of the veth pair.
const (
	EgressLink = "egress0"
	peerLink   = "peer0"
)

// NewOutside builds the outside namespace; the test must be [Isolate]d.
// It brings lo up in the test's namespace too. Everything goes with the
// test process.
func NewOutside(t *testing.T) *Outside {
	t.Helper()
	if os.Getenv(envIsolated) == "" {
		t.Fatal("forwardtest: NewOutside outside an Isolate'd test")
	}
	o := &Outside{ns: -1, home: -1}
	errc := make(chan error, 1)
	go func() {
		// The thread that unshares is never unlocked if it cannot get
		// home: the runtime then ends it with the goroutine.
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			errc <- fmt.Errorf("open own network namespace: %w", err)
			return
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare network namespace: %w", err)
			return
		}
		ns, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			o.ns, o.home = ns, home
		}
		if serr := unix.Setns(home, unix.CLONE_NEWNET); serr != nil {
			errc <- fmt.Errorf("back to own network namespace: %w", serr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("forwardtest: outside namespace: %v", err)
	}
	t.Cleanup(func() {
		unix.Close(o.ns)
		unix.Close(o.home)
	})
	if err := o.link(); err != nil {
		t.Fatalf("forwardtest: outside link: %v", err)
	}
	return o
}

func (o *Outside) link() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: EgressLink, MTU: 1500}, PeerName: peerLink}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth: %w", err)
	}
	peer, err := netlink.LinkByName(peerLink)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetNsFd(peer, o.ns); err != nil {
		return fmt.Errorf("move %s: %w", peerLink, err)
	}
	gw, err := netlink.LinkByName(EgressLink)
	if err != nil {
		return err
	}
	if err := addrUp(gw, EgressAddr, 24); err != nil {
		return err
	}
	if err := addrUp(gw, EgressAddr6, 64); err != nil {
		return err
	}
	// The outside peer is the gateway's default router of both families,
	// as on a real host: every destination is routable, so what stops a
	// job's flow is the backend, not a missing route.
	for _, via := range []netip.Addr{PeerAddr, PeerAddr6} {
		route := &netlink.Route{LinkIndex: gw.Attrs().Index, Gw: via.AsSlice()}
		if err := netlink.RouteAdd(route); err != nil {
			return fmt.Errorf("default route via %s: %w", via, err)
		}
	}
	return o.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(lo); err != nil {
			return err
		}
		p, err := netlink.LinkByName(peerLink)
		if err != nil {
			return err
		}
		for _, a := range []netip.Prefix{netip.PrefixFrom(PeerAddr, 24), netip.PrefixFrom(PrivatePeerAddr, 24),
			netip.PrefixFrom(PeerAddr6, 64), netip.PrefixFrom(PrivatePeerAddr6, 64)} {
			if err := addrUp(p, a.Addr(), a.Bits()); err != nil {
				return err
			}
		}
		// Replies to the gateway's public addresses go back on the link,
		// and jobs' own addresses are routed to the gateway; nothing else
		// is (jobs' tunnel addresses never appear outside: the backends
		// re-originate or source-NAT).
		own := &netlink.Route{LinkIndex: p.Attrs().Index, Dst: prefixNet(OwnPrefix), Gw: EgressAddr6.AsSlice()}
		if err := netlink.RouteAdd(own); err != nil {
			return fmt.Errorf("route %s via %s: %w", OwnPrefix, EgressAddr6, err)
		}
		return nil
	})
}

func addrUp(l netlink.Link, a netip.Addr, bits int) error {
	// No duplicate address detection (IPv6): the link is ours alone.
	if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(a, bits)), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("address %s on %s: %w", a, l.Attrs().Name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("%s up: %w", l.Attrs().Name, err)
	}
	return nil
}

// Do runs fn on a thread inside the outside namespace; sockets fn opens
// stay there after it returns and may be used from any goroutine.
func (o *Outside) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Setns(o.ns, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter outside namespace: %w", err)
			return
		}
		err := fn()
		if serr := unix.Setns(o.home, unix.CLONE_NEWNET); serr != nil {
			// Leave the thread locked: it dies with this goroutine.
			errc <- fmt.Errorf("leave outside namespace: %w", serr)
			return
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// LocalRoute makes every address of p local to the test's (gateway's)
// network namespace, as `ip route add local P dev lo` does: sockets bind
// them with IP_FREEBIND and receive what is routed there.
func LocalRoute(p netip.Prefix) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	r := &netlink.Route{LinkIndex: lo.Attrs().Index, Dst: prefixNet(p), Type: unix.RTN_LOCAL, Table: unix.RT_TABLE_LOCAL}
	if err := netlink.RouteAdd(r); err != nil {
		return fmt.Errorf("local route %s: %w", p, err)
	}
	return nil
}

// WriteSysctl writes a sysctl of the test's (gateway's) network namespace,
// e.g. "net/ipv4/ping_group_range".
func WriteSysctl(name, value string) error {
	if err := os.WriteFile("/proc/sys/"+name, []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s: %w", name, err)
	}
	return nil
}

// RunAs runs the tests of the running test binary that match run as the
// user u (a copy of the binary in a directory that user can read, removed
// afterwards), with /dev/net/tun of mode topology.UserTUNMode whatever the
// host's mode, and fails t unless they pass. A test running as root uses
// it to check that its Isolate'd tests pass without root, too.
func RunAs(t *testing.T, u *topology.User, run string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "airlock-forwardtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	copyExe := dir + "/" + "test.bin"
	if err := os.WriteFile(copyExe, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), isolatedTimeout+20*time.Second)
	defer cancel()
	// Verbose, so that a skip shows (and fails the check); CI, so that
	// Isolate fails instead of skipping where it cannot start.
	argv := topology.NewTUNNode(t, topology.UserTUNMode).Command(u, copyExe,
		"-test.run="+run, "-test.count=1", "-test.timeout="+isolatedTimeout.String(), "-test.v")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "CI=1"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("\nPASS")) && !bytes.HasPrefix(out, []byte("PASS")) || bytes.Contains(out, []byte("--- SKIP")) {
		t.Fatalf("tests %s as uid %d: %v\n%s", run, u.UID, err, out)
	}
	if testing.Verbose() {
		t.Logf("as uid %d:\n%s", u.UID, out)
	}
}
