// SPDX-License-Identifier: MIT

package kernel

import (
	"bytes"
	"errors"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// envChild marks the re-executed test binary that runs one test inside a
// fresh network namespace.
const envChild = "AIRLOCK_KERNEL_TEST_NETNS"

// inFreshNetns re-executes the test binary to run the calling test alone in
// a new network namespace, and reports whether the caller is that child
// (and should run the test body). The parent waits and reports the child's
// output. Tests that need root are skipped without it, unless CI is set.
func inFreshNetns(t *testing.T) bool {
	t.Helper()
	if os.Getenv(envChild) == t.Name() {
		return true
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("kernel egress tests need root; CI is set, so they must run")
		}
		t.Skip("kernel egress tests need root (new network namespace, TUN, nftables)")
	}
	args := []string{"-test.run=^" + t.Name() + "$", "-test.count=1"}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), envChild+"="+t.Name())
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("PASS")) {
		t.Fatalf("test in a fresh network namespace: %v\n%s", err, out)
	}
	t.Logf("in a fresh network namespace:\n%s", out)
	return false
}

var (
	tunnelAddr = netip.MustParsePrefix("100.64.0.1/16")
	egressAddr = netip.MustParseAddr("203.0.113.1")
)

// setupNetns gives the fresh namespace an "outside" interface with the
// egress address and sets ip_forward to ipForward.
func setupNetns(t *testing.T, ipForward string) {
	t.Helper()
	if err := netlink.LinkSetUp(mustLink(t, "lo")); err != nil {
		t.Fatal(err)
	}
	// A veth pair (the dummy driver is not everywhere).
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "outside0"}, PeerName: "outside1"}); err != nil {
		t.Fatal(err)
	}
	l := mustLink(t, "outside0")
	a, _ := netlink.ParseAddr(egressAddr.String() + "/24")
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(mustLink(t, "outside1")); err != nil {
		t.Fatal(err)
	}
	if err := writeSysctl(v4Family.forwarding, ipForward); err != nil {
		t.Fatal(err)
	}
}

func mustLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l
}

// newTestForwarderFlows is newTestForwarder recording flows in tb.
func newTestForwarderFlows(t *testing.T, tb *flows.Table) *Forwarder {
	t.Helper()
	return newTestForwarder(t, func(c *Config) { c.Flows = tb })
}

// idOf is the ID of the test job at addr.
func idOf(addr netip.Addr) jobs.ID { return jobs.ID(addr.String()) }

// v4Job is a job at the IPv4 address addr (its ID idOf(addr)) with port
// block block on the forwarder's egress address.
func v4Job(addr netip.Addr, block portblock.Range) forward.Job {
	return forward.Job{ID: idOf(addr), Addrs: []netip.Addr{addr}, Egress: []forward.Egress{{Addr: netip.IPv4Unspecified(), Block: block}}}
}

// newTestForwarder makes a forwarder on tunnelAddr and egressAddr; mods
// change its config first.
func newTestForwarder(t *testing.T, mods ...func(*Config)) *Forwarder {
	t.Helper()
	cfg := Config{
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
		Addrs:        []netip.Prefix{tunnelAddr},
		Egress:       []netip.Addr{egressAddr},
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")},
		BlockSize:    256,
	}
	for _, m := range mods {
		m(&cfg)
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return f
}

// hasTable reports whether inet airlock exists.
func hasTable(t *testing.T) bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		if tb.Name == TableName {
			return true
		}
	}
	return false
}

// nftList returns `nft list table inet airlock`, or "" if nft is missing.
func nftList(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		return ""
	}
	out, err := exec.Command("nft", "list", "table", "inet", TableName).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	return string(out)
}

func sysctl(t *testing.T) string {
	t.Helper()
	v, err := readSysctl(v4Family.forwarding)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestLifecycle(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	f := newTestForwarder(t)

	if !hasTable(t) {
		t.Fatal("no table inet airlock after New")
	}
	if got := sysctl(t); got != "1" {
		t.Errorf("ip_forward after New: got %s, want 1", got)
	}
	l := mustLink(t, DefaultName)
	if l.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("%s is not up", DefaultName)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != tunnelAddr.String() {
		t.Errorf("%s addresses: got %v (%v), want %v", DefaultName, addrs, err, tunnelAddr)
	}
	// The DNS relay listens on the tunnel address.
	if c, err := net.Dial("tcp", netip.AddrPortFrom(tunnelAddr.Addr(), 53).String()); err != nil {
		t.Errorf("dns relay tcp: %v", err)
	} else {
		c.Close()
	}

	job := netip.MustParseAddr("100.64.0.2")
	block := portblock.Range{Lo: 20000, Hi: 20255}
	if err := f.AddJob(v4Job(job, block)); err != nil {
		t.Fatalf("AddJob: %v", err)
	}
	if got := jobRuleCount(t, idOf(job)); got != 3 {
		t.Errorf("rules for %v after AddJob: got %d, want 3", job, got)
	}
	if out := nftList(t); out != "" {
		for _, want := range []string{
			"ip saddr 100.64.0.2 oifname != \"airlock0\" meta l4proto tcp snat ip to 203.0.113.1:20000-20255",
			"ip saddr 100.64.0.2 oifname != \"airlock0\" meta l4proto udp snat ip to 203.0.113.1:20000-20255",
			"ip saddr 100.64.0.2 oifname != \"airlock0\" snat ip to 203.0.113.1",
			"tcp option maxseg size set rt mtu",
			"ct state established,related accept",
			"ip daddr 127.0.0.0/8 goto floor",
			"iifname \"airlock0\" oifname \"airlock0\" goto floor",
			"counter packets 0 bytes 0 goto refuse",
			"ip daddr 169.254.0.0/16 counter packets 0 bytes 0 goto policy_deny",
			"ip daddr 10.0.0.0/8 counter packets 0 bytes 0 goto policy_deny",
			"ct state ! established,related jump egress_policy",
			"jump host_policy",
			"ip daddr 100.64.0.1 return",
			"fib daddr type local goto refuse",
			"meta l4proto tcp reject with tcp reset",
			"iifname \"airlock0\" jump to_host",
			"ip daddr 100.64.0.1 udp dport 53 accept",
			"ct state new add @conns { ip saddr . ip daddr . tcp dport ct count over 256 } counter packets 0 bytes 0 goto refuse",
			"ct state new add @conns { ip saddr . ip daddr . udp dport ct count over 256 } counter packets 0 bytes 0 goto refuse",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("nft list table lacks %q:\n%s", want, out)
			}
		}
	}
	// Adding the address again fails and leaves the job as it was.
	if err := f.AddJob(v4Job(job, portblock.Range{Lo: 20256, Hi: 20511})); !errors.Is(err, forward.ErrJobExists) {
		t.Fatalf("AddJob again: got %v, want ErrJobExists", err)
	}
	if got := jobRuleCount(t, idOf(job)); got != 3 {
		t.Errorf("rules for %v after a second AddJob: got %d, want 3", job, got)
	}
	if out := nftList(t); out != "" && (!strings.Contains(out, ":20000-20255") || strings.Contains(out, ":20256-20511")) {
		t.Errorf("second AddJob changed the block:\n%s", out)
	}
	other := netip.MustParseAddr("100.64.0.3")
	if err := f.AddJob(v4Job(other, portblock.Range{Lo: 30000, Hi: 30255})); err != nil {
		t.Fatal(err)
	}
	if err := f.AddJob(v4Job(netip.MustParseAddr("10.0.0.1"), block)); err == nil {
		t.Error("AddJob accepted an address outside the tunnel subnet")
	}
	f.RemoveJob(idOf(job))
	if got := jobRuleCount(t, idOf(job)); got != 0 {
		t.Errorf("rules for %v after RemoveJob: got %d, want 0", job, got)
	}
	if got := jobRuleCount(t, idOf(other)); got != 3 {
		t.Errorf("rules for the other job after RemoveJob: got %d, want 3", got)
	}
	f.RemoveJob(idOf(job)) // twice is harmless

	if err := f.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if hasTable(t) {
		t.Error("table inet airlock still there after Close")
	}
	if _, err := netlink.LinkByName(DefaultName); err == nil {
		t.Errorf("%s still there after Close", DefaultName)
	}
	if got := sysctl(t); got != "0" {
		t.Errorf("ip_forward after Close: got %s, want 0 (restored)", got)
	}
	if err := f.AddJob(v4Job(other, block)); err == nil {
		t.Error("AddJob after Close succeeded")
	}
}

// TestStaleTable simulates a gateway killed with SIGKILL: its table (with a
// job rule) and ip_forward=1 are left behind. New must delete the table,
// and Close must restore the ip_forward value from before the killed run.
func TestStaleTable(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "1")
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tb := c.AddTable(table())
	post, state := chainsOf(tb).post, chainsOf(tb).state
	c.AddChain(post)
	c.AddChain(state)
	stale := netip.MustParseAddr("100.64.0.9")
	for _, e := range testRules.natRules(stale, jobEgress{addr: egressAddr, block: portblock.Range{Lo: 40000, Hi: 40255}}) {
		c.AddRule(&nftables.Rule{Table: tb, Chain: post, Exprs: e, UserData: jobTag(idOf(stale))})
	}
	c.AddRule(&nftables.Rule{Table: tb, Chain: state, Exprs: []expr.Any{&expr.Counter{}}, UserData: stateTag(v4Family.stateTag, "0")})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}

	f := newTestForwarder(t)
	if got := jobRuleCount(t, idOf(stale)); got != 0 {
		t.Errorf("stale job rules after New: got %d, want 0", got)
	}
	if !hasTable(t) {
		t.Error("no fresh table after New")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if hasTable(t) {
		t.Error("table still there after Close")
	}
	if got := sysctl(t); got != "0" {
		t.Errorf("ip_forward after Close: got %s, want 0 (the value before the killed run)", got)
	}
}

// TestTUNBusy checks that a second forwarder with the same TUN name fails
// clearly and leaves the first one's table alone.
func TestTUNBusy(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	f := newTestForwarder(t)
	defer f.Close()
	if err := f.AddJob(v4Job(netip.MustParseAddr("100.64.0.2"), portblock.Range{Lo: 20000, Hi: 20255})); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Addrs: []netip.Prefix{tunnelAddr}, Egress: []netip.Addr{egressAddr},
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:53")}})
	if err == nil || !strings.Contains(err.Error(), "another") {
		t.Errorf("second New: got %v, want an error naming another gateway", err)
	}
	if got := jobRuleCount(t, idOf(netip.MustParseAddr("100.64.0.2"))); got != 3 {
		t.Errorf("first forwarder's job rules after the failed second New: got %d, want 3", got)
	}
}
