// SPDX-License-Identifier: MIT

package kernel

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Defaults for zero Config fields.
const (
	DefaultMTU        = 1420
	DefaultResolvConf = "/etc/resolv.conf"
	// ipForwardPath is the sysctl that makes the host route between the
	// TUN and its other interfaces (per network namespace).
	ipForwardPath = "/proc/sys/net/ipv4/ip_forward"
)

// ErrNotPrivileged is wrapped by errors caused by missing privileges.
var ErrNotPrivileged = errors.New("kernel egress needs root or CAP_NET_ADMIN")

// job6 is the IPv6 side of a job (Job.Addr6, addJob6).
type job6 struct {
	addr, egress netip.Addr
	// isOwn: egress is the job's own address in --egress-prefix6.
	isOwn bool
	// rules are its postrouting rules, with handles.
	rules []*nftables.Rule
}

// own reports whether the job has its own public IPv6 address.
func (j job6) own() bool { return j.isOwn }

// Forwarder is the kernel-mode egress: a kernel TUN whose packets the host
// forwards, with per-job SNAT into the job's port block. It implements
// forward.Backend (Read, Write, ... are the TUN's; backend.go). It is
// safe for concurrent use.
type Forwarder struct {
	tun.Device
	log   *slog.Logger
	rules ruleset
	dns   *dnsfwd.Server
	dns6  *dnsfwd.Server // nil without IPv6

	// oldIPForward is the ip_forward value to restore at Close ("" means
	// leave it).
	oldIPForward string
	// oldIPv6Forward likewise for net.ipv6.conf.all.forwarding.
	oldIPv6Forward string

	closeOnce sync.Once
	closeErr  error

	// jobMu serialises AddJob and RemoveJob (backend_linux.go), so that
	// each is all or nothing towards the other.
	jobMu sync.Mutex
	// flows is Config.Flows: AddJob registers jobs in it.
	flows *flows.Table
	// blockSize is Config.BlockSize, for the refusal log; stopRefusals
	// stops refusalLoop and waits for it.
	blockSize    int
	stopRefusals func()

	mu     sync.Mutex
	nft    *nftables.Conn
	closed bool
	jobs   map[netip.Addr][]*nftables.Rule // rules with their handles
	// jobs6 holds the IPv6 side of the jobs that have one, by IPv4
	// address.
	jobs6 map[netip.Addr]job6
	// exposed holds each job's prerouting DNAT rules, with handles.
	exposed map[netip.Addr][]*nftables.Rule
	// limitRules holds each job's flow limit rules, with handles.
	limitRules map[netip.Addr][]*nftables.Rule
	// tc shapes bandwidth; nil until a bandwidth limit is first set.
	tc *tcShaper
	// tokens holds each job's token name (AddJob, setJobToken), for the scope
	// sets of token-scoped policy rules.
	tokens map[netip.Addr]string
	// policy is the policy in force; policyGen numbers its scope sets;
	// policyCarried holds the drop counts of replaced policy rules.
	policy        *compiledPolicy
	policyGen     int
	policyCarried map[string]uint64

	// tunName is the TUN's interface name.
	tunName string

	// acct feeds Config.Flows from conntrack; nil without a flow table.
	acct      *accountant
	stopAcct  context.CancelFunc
	acctDone  chan struct{}
	oldCTAcct string // nf_conntrack_acct to restore at Close, "" for none
}

var _ forward.Backend = (*Forwarder)(nil)

// privError turns a permission error into a sentence that names the fix.
func privError(op string, err error) error {
	if errors.Is(err, os.ErrPermission) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		op = strings.TrimPrefix(op, "kernel egress: ")
		return fmt.Errorf("%w: %s: %w; run the gateway as root or grant it CAP_NET_ADMIN (e.g. setcap cap_net_admin+ep), or use --egress user", ErrNotPrivileged, op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// New creates the TUN, configures it, enables forwarding and programs the
// nftables table. On error everything it made is undone.
func New(cfg Config) (_ *Forwarder, err error) {
	if cfg.Logger == nil {
		return nil, errors.New("kernel egress: no logger")
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	f := &Forwarder{
		log: cfg.Logger,
		rules: ruleset{tun: cfg.Name, addr: cfg.Addr, egress: cfg.EgressAddr, blockSize: uint32(cfg.BlockSize),
			addr6: cfg.Addr6, egress6: cfg.EgressAddr6, prefix6: cfg.EgressPrefix6},
		jobs:    make(map[netip.Addr][]*nftables.Rule),
		jobs6:   make(map[netip.Addr]job6),
		exposed: make(map[netip.Addr][]*nftables.Rule),

		limitRules:    make(map[netip.Addr][]*nftables.Rule),
		tokens:        make(map[netip.Addr]string),
		policyCarried: make(map[string]uint64),
		tunName:       cfg.Name,
		flows:         cfg.Flows,
		blockSize:     cfg.BlockSize,
	}
	if err := f.rules.validate(); err != nil {
		return nil, err
	}
	upstreams := cfg.DNSUpstreams
	if len(upstreams) == 0 {
		if upstreams, err = dnsfwd.ReadResolvConf(DefaultResolvConf); err != nil {
			return nil, fmt.Errorf("kernel egress: %w", err)
		}
	}
	if f.nft, err = nftables.New(nftables.WithSockOptions(bigAcks)); err != nil {
		return nil, privError("kernel egress: open nftables netlink socket", err)
	}
	// The TUN first: if another gateway holds it (EBUSY), its table is
	// not stale.
	dev, err := tun.CreateTUN(cfg.Name, cfg.MTU)
	if err != nil {
		f.nft.CloseLasting()
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("kernel egress: create tun %q: %w (is another kernel-mode gateway running in this network namespace?)", cfg.Name, err)
		}
		return nil, privError(fmt.Sprintf("kernel egress: create tun %q", cfg.Name), err)
	}
	f.Device = dev
	staleForward, staleForward6, err := f.removeStale()
	if err == nil {
		err = removeStaleIFB(cfg.Name, f.log)
	}
	if err != nil {
		dev.Close()
		return nil, err
	}
	defer func() {
		if err != nil {
			f.teardown()
		}
	}()
	if err := f.configureLink(cfg.Name); err != nil {
		return nil, err
	}

	old, err := readSysctl(ipForwardPath)
	if err != nil {
		return nil, fmt.Errorf("kernel egress: %w", err)
	}
	if staleForward != "" {
		old = staleForward // what the host had before the killed run
	}
	old6 := ""
	if f.rules.v6() {
		if old6, err = readSysctl(ipv6FwdPath); err != nil {
			return nil, fmt.Errorf("kernel egress: %w (IPv6 disabled on this host?)", err)
		}
		if staleForward6 != "" {
			old6 = staleForward6
		}
	}
	if err := f.program(old, old6); err != nil {
		return nil, err
	}
	if err := writeSysctl(ipForwardPath, "1"); err != nil {
		return nil, privError("kernel egress: enable net.ipv4.ip_forward", err)
	}
	if old != "1" {
		f.oldIPForward = old
	}
	if f.rules.v6() {
		if old6 != "1" {
			warnAcceptRA(f.log)
		}
		if err := writeSysctl(ipv6FwdPath, "1"); err != nil {
			return nil, privError("kernel egress: enable net.ipv6.conf.all.forwarding", err)
		}
		if old6 != "1" {
			f.oldIPv6Forward = old6
		}
	}

	gw := cfg.Addr.Addr()
	pc, err := net.ListenPacket("udp4", netip.AddrPortFrom(gw, 53).String())
	if err != nil {
		return nil, privError("kernel egress: dns relay on the tunnel address", err)
	}
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(gw, 53).String())
	if err != nil {
		pc.Close()
		return nil, privError("kernel egress: dns relay on the tunnel address", err)
	}
	if f.dns, err = dnsfwd.Start(dnsfwd.Config{Logger: cfg.Logger.With("component", "dns"), Upstreams: upstreams, Flows: cfg.Flows}, pc, ln); err != nil {
		return nil, fmt.Errorf("kernel egress: %w", err)
	}
	if f.rules.v6() {
		if f.dns6, err = startDNS6(cfg, f.rules.addr6.Addr(), upstreams); err != nil {
			return nil, err
		}
	}
	if cfg.Flows != nil {
		old, err := enableConntrackAcct()
		if err != nil {
			return nil, privError("kernel egress: enable conntrack accounting (net.netfilter.nf_conntrack_acct) for the flow table", err)
		}
		f.oldCTAcct = old
		f.acct = newAccountant(cfg.Flows, f.rules, f)
		ctx, cancel := context.WithCancel(context.Background())
		f.stopAcct, f.acctDone = cancel, make(chan struct{})
		go func() {
			defer close(f.acctDone)
			f.acct.run(ctx)
		}()
	}
	f.startRefusalLog()
	f.log.Info("kernel egress ready", "tun", cfg.Name, "addr", cfg.Addr, "mtu", cfg.MTU,
		"egress_addr", cfg.EgressAddr, "table", "inet "+TableName, "dns_upstreams", upstreams)
	if f.rules.prefix6.IsValid() {
		for _, m := range CheckPrefix6(f.rules.prefix6, cfg.Name) {
			f.log.Error("kernel egress: "+m, "egress_prefix6", f.rules.prefix6)
		}
	}
	if f.rules.v6() {
		f.log.Info("kernel egress: IPv6 ready", "addr6", f.rules.addr6, "egress_addr6", f.rules.egress6, "egress_prefix6", f.rules.prefix6)
	}
	return f, nil
}

// nftRcvBuf is the receive buffer of the nftables netlink socket: every
// message of a batch is acknowledged, and a batch of a few hundred rules
// (the IPv6 policy, a thousand jobs' NAT rules) overflows the default
// (ENOBUFS).
const nftRcvBuf = 8 << 20

// bigAcks lets the socket hold the acknowledgements of a large batch: acks
// carry only the header of each message, and the receive buffer is
// raised past net.core.rmem_max (SO_RCVBUFFORCE, which CAP_NET_ADMIN
// allows).
func bigAcks(c *mdnetlink.Conn) error {
	if err := c.SetOption(mdnetlink.CapAcknowledge, true); err != nil {
		return err
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, nftRcvBuf)
	}); err != nil {
		return err
	}
	if serr != nil {
		return c.SetReadBuffer(nftRcvBuf) // up to rmem_max
	}
	return nil
}

// configureLink gives the TUN its address and brings it up.
func (f *Forwarder) configureLink(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("kernel egress: find link %q: %w", name, err)
	}
	p := f.rules.addr
	ipnet := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
	if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: ipnet}); err != nil {
		return privError(fmt.Sprintf("kernel egress: set address %s on %s", p, name), err)
	}
	if p6 := f.rules.addr6; p6.IsValid() {
		// No duplicate address detection: the DNS relay binds the
		// address at once, and nothing else is on a TUN.
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p6.Addr().AsSlice(), Mask: net.CIDRMask(p6.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrReplace(link, a); err != nil {
			return privError(fmt.Sprintf("kernel egress: set address %s on %s (IPv6 disabled on it? net.ipv6.conf.%s.disable_ipv6)", p6, name, name), err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return privError(fmt.Sprintf("kernel egress: bring %s up", name), err)
	}
	if p := f.rules.prefix6; p.IsValid() {
		// Jobs' own addresses live behind the TUN.
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 128)}}
		if err := netlink.RouteReplace(r); err != nil {
			return privError(fmt.Sprintf("kernel egress: route %s to %s", p, name), err)
		}
	}
	return nil
}

// removeStale deletes a table a previous run left and returns the
// ip_forward and IPv6 forwarding values that run remembered ("" if none).
func (f *Forwarder) removeStale() (old, old6 string, err error) {
	t, err := f.nft.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) {
			return "", "", nil
		}
		return "", "", privError("kernel egress: list nftables tables", err)
	}
	_, _, _, _, _, state, _ := chains(t)
	if rules, err := f.nft.GetRules(t, state); err == nil {
		for _, r := range rules {
			if v, ok := parseStateTag(r.UserData, stateTagPrefix); ok {
				old = v
			}
			if v, ok := parseStateTag(r.UserData, stateTagPref6); ok {
				old6 = v
			}
		}
	}
	f.nft.DelTable(t)
	if err := f.nft.Flush(); err != nil {
		return "", "", privError("kernel egress: delete stale nftables table inet "+TableName, err)
	}
	f.log.Warn("deleted the nftables table a previous gateway left behind (killed with SIGKILL?)",
		"table", "inet "+TableName, "ip_forward_before_it", old, "ipv6_forwarding_before_it", old6)
	return old, old6, nil
}

// program creates the table with its chains and static rules in one
// batch.
func (f *Forwarder) program(oldIPForward, oldIPv6Forward string) error {
	t := f.nft.AddTable(table())
	post, fwd, fromJobs, input, toHost, state, refuse := chains(t)
	floor6 := floor6Chain(t)
	for _, c := range []*nftables.Chain{post, preChain(t), refuse, floor6, fromJobs, toHost, state, fwd, input} {
		f.nft.AddChain(c)
	}
	add := func(c *nftables.Chain, rules [][]expr.Any) {
		for _, e := range rules {
			f.nft.AddRule(&nftables.Rule{Table: t, Chain: c, Exprs: e})
		}
	}
	add(refuse, refuseRules())
	// The floor chain before the chains that go to it (floor6).
	f.nft.AddChain(floorChain(t))
	f.nft.AddRule(floorRule(t))
	if f.rules.blockSize > 0 {
		if err := f.nft.AddSet(connsSet(t), nil); err != nil {
			return fmt.Errorf("kernel egress: add set %s: %w", setConns, err)
		}
	}
	if f.rules.v6() {
		if err := f.nft.AddSet(own6Set(t), nil); err != nil {
			return fmt.Errorf("kernel egress: add set %s: %w", setOwn6, err)
		}
		if f.rules.blockSize > 0 {
			if err := f.nft.AddSet(connsSet6(t), nil); err != nil {
				return fmt.Errorf("kernel egress: add set %s: %w", setConns6, err)
			}
		}
		add(floor6, f.rules.floor6Rules())
	}
	limits, overFlows, overRate := limitChains(t)
	for _, c := range []*nftables.Chain{limits, overFlows, overRate} {
		f.nft.AddChain(c)
	}
	add(overFlows, overRules())
	add(overRate, overRules())
	pol, polHost, polDeny := policyChains(t)
	for _, c := range []*nftables.Chain{polDeny, pol, polHost} {
		f.nft.AddChain(c)
	}
	add(polDeny, policyDenyRules())
	f.policy = f.rules.compilePolicy(t, &policy.Policy{}, 0)
	if err := f.queuePolicyLocked(t, f.policy); err != nil {
		return err
	}
	for _, e := range f.rules.fromJobsRules() {
		r := &nftables.Rule{Table: t, Chain: fromJobs, Exprs: e}
		if isBlockLimit(e) {
			r.UserData = []byte(blockLimitTag)
		}
		f.nft.AddRule(r)
	}
	add(toHost, f.rules.toHostRules())
	add(fwd, f.rules.forwardRules())
	add(input, f.rules.inputRules())
	f.nft.AddRule(&nftables.Rule{Table: t, Chain: state, Exprs: []expr.Any{&expr.Counter{}}, UserData: stateTag(stateTagPrefix, oldIPForward)})
	if f.rules.v6() {
		f.nft.AddRule(&nftables.Rule{Table: t, Chain: state, Exprs: []expr.Any{&expr.Counter{}}, UserData: stateTag(stateTagPref6, oldIPv6Forward)})
	}
	if err := f.nft.Flush(); err != nil {
		return privError("kernel egress: create nftables table inet "+TableName, err)
	}
	return nil
}

// addJob source-NATs the traffic of the job at addr to the egress address
// and, for TCP and UDP, to the ports of block. Adding an address again
// replaces its rules.
func (f *Forwarder) addJob(addr, egress netip.Addr, block portblock.Range) error {
	if !addr.Is4() || !f.rules.addr.Contains(addr) {
		return fmt.Errorf("kernel egress: job address %v outside the tunnel subnet %v", addr, f.rules.addr.Masked())
	}
	if egress.IsValid() && (!egress.Is4() || egress.IsUnspecified()) {
		return fmt.Errorf("kernel egress: job %v: egress address %v: want a unicast IPv4 address", addr, egress)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	t := table()
	post, _, _, _, _, _, _ := chains(t)
	old := f.jobs[addr]
	tag := jobTag(addr)
	for _, e := range f.rules.jobRules(addr, egress, block) {
		f.nft.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: e, UserData: tag})
	}
	for _, r := range old {
		if err := f.nft.DelRule(r); err != nil {
			return err
		}
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: add snat rules for %v: %w", addr, err)
	}
	mine, err := f.taggedLocked(post, tag)
	if err != nil {
		return err
	}
	f.jobs[addr] = mine
	return nil
}

// addJob6 adds the IPv6 address addr6 to the job at job (after addJob;
// AddJob's Job.Addr6, Egress6 and Block6), whose IPv6 flows leave from
// egress6 with a port of block (v6_linux.go): egress6 zero means the
// configured IPv6 egress address (none: the outgoing interface's address,
// masquerade); an egress6 in the routed --egress-prefix6 is the job's own
// public address, mapped one to one without port translation (block must
// be zero). Adding again replaces the job's IPv6 side; removeJob removes
// it with the rest of the job.
func (f *Forwarder) addJob6(job, addr6, egress6 netip.Addr, block portblock.Range) error {
	if err := f.rules.checkJob6(job, addr6, egress6, block); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	if _, ok := f.jobs[job]; !ok {
		return fmt.Errorf("kernel egress: add IPv6 address of %v: %w", job, forward.ErrUnknownJob)
	}
	t := table()
	post, _, _, _, _, _, _ := chains(t)
	tag := jobTag6(job)
	for _, e := range f.rules.jobRules6(addr6, egress6, block) {
		f.nft.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: e, UserData: tag})
	}
	old, had := f.jobs6[job]
	for _, r := range old.rules {
		if err := f.nft.DelRule(r); err != nil {
			return err
		}
	}
	if had && old.own() {
		if err := f.nft.SetDeleteElements(own6Set(t), []nftables.SetElement{{Key: old.addr.AsSlice()}}); err != nil {
			return err
		}
	}
	new6 := job6{addr: addr6, egress: egress6, isOwn: f.rules.own6(egress6)}
	if new6.own() {
		if err := f.nft.SetAddElements(own6Set(t), []nftables.SetElement{{Key: addr6.AsSlice()}}); err != nil {
			return err
		}
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: add IPv6 nat rules for %v: %w", addr6, err)
	}
	var err error
	if new6.rules, err = f.taggedLocked(post, tag); err != nil {
		return err
	}
	f.jobs6[job] = new6
	return nil
}

// taggedLocked returns the rules of chain c with user data tag: the kernel
// does not echo handles back to this library, so a job's rules are looked
// up by their tag after they are added.
func (f *Forwarder) taggedLocked(c *nftables.Chain, tag []byte) ([]*nftables.Rule, error) {
	rules, err := f.nft.GetRules(table(), c)
	if err != nil {
		return nil, fmt.Errorf("kernel egress: list %s rules: %w", c.Name, err)
	}
	var mine []*nftables.Rule
	for _, r := range rules {
		if bytes.Equal(r.UserData, tag) {
			mine = append(mine, r)
		}
	}
	return mine, nil
}

// removeJob deletes the job's NAT rules, its limits and its conntrack
// entries.
func (f *Forwarder) removeJob(addr netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rules, ok := f.jobs[addr]
	if !ok || f.closed {
		return
	}
	delete(f.jobs, addr)
	j6, has6 := f.jobs6[addr]
	if f.dns != nil {
		f.dns.RemoveJob(addr)
	}
	if f.dns6 != nil && has6 {
		f.dns6.RemoveJob(j6.addr)
	}
	for _, r := range append(rules, j6.rules...) {
		if err := f.nft.DelRule(r); err != nil {
			f.log.Error("kernel egress: delete snat rule", "job", addr, "err", err)
		}
	}
	if has6 && j6.own() {
		if err := f.nft.SetDeleteElements(own6Set(table()), []nftables.SetElement{{Key: j6.addr.AsSlice()}}); err != nil {
			f.log.Error("kernel egress: delete the job from set "+setOwn6, "job", addr, "err", err)
		}
	}
	if err := f.nft.Flush(); err != nil {
		f.log.Error("kernel egress: delete snat rules", "job", addr, "err", err)
	}
	f.removeLimitsLocked(addr)
	if f.acct != nil {
		f.acct.poll() // the job's flows' last counters, before the flush
	}
	f.forgetTokenLocked(addr)
	delete(f.jobs6, addr)
	f.flushConntrack(addr)
	if has6 {
		f.flushConntrack(j6.addr)
	}
	if f.acct != nil {
		f.acct.endJob(addr)
		if has6 {
			f.acct.endJob(j6.addr)
		}
	}
}

// flushConntrack drops the connection-tracking entries the job at addr
// originated, so that their NAT mappings die with the job.
func (f *Forwarder) flushConntrack(addr netip.Addr) {
	filter := &netlink.ConntrackFilter{}
	if err := filter.AddIP(netlink.ConntrackOrigSrcIP, addr.AsSlice()); err != nil {
		return
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family(addr), filter); err != nil {
		f.log.Warn("kernel egress: cannot flush the job's conntrack entries; its flows keep their mappings until they time out", "job", addr, "err", err)
	}
}

// Jobs returns the number of jobs with NAT rules.
func (f *Forwarder) Jobs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.jobs)
}

// Close stops the DNS relay, deletes the nftables table and the ifb
// device, restores ip_forward and closes (and so removes) the TUN with its
// qdiscs. Pending Read and Write
// calls return an error. Close is idempotent.
func (f *Forwarder) Close() error {
	f.closeOnce.Do(func() { f.closeErr = f.teardown() })
	return f.closeErr
}

func (f *Forwarder) teardown() error {
	var errs []error
	if f.stopRefusals != nil {
		f.stopRefusals()
	}
	if f.dns != nil {
		f.dns.Close()
	}
	if f.dns6 != nil {
		f.dns6.Close()
	}
	if f.stopAcct != nil {
		f.stopAcct()
		<-f.acctDone
		f.acct.poll()
	}
	if f.oldCTAcct != "" {
		if err := writeSysctl(conntrackAcctPath, f.oldCTAcct); err != nil {
			errs = append(errs, fmt.Errorf("restore net.netfilter.nf_conntrack_acct=%s: %w", f.oldCTAcct, err))
		}
	}
	f.mu.Lock()
	f.closed = true
	f.jobs = nil
	f.jobs6 = nil
	f.exposed = nil
	f.limitRules = nil
	if f.tc != nil {
		if err := f.tc.close(); err != nil {
			errs = append(errs, err)
		}
		f.tc = nil
	}
	if f.nft != nil {
		f.nft.DelTable(table())
		if err := f.nft.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete nftables table inet %s: %w", TableName, err))
		}
	}
	f.mu.Unlock()
	if f.oldIPForward != "" {
		if err := writeSysctl(ipForwardPath, f.oldIPForward); err != nil {
			errs = append(errs, fmt.Errorf("restore net.ipv4.ip_forward=%s: %w", f.oldIPForward, err))
		}
	}
	if f.oldIPv6Forward != "" {
		if err := writeSysctl(ipv6FwdPath, f.oldIPv6Forward); err != nil {
			errs = append(errs, fmt.Errorf("restore net.ipv6.conf.all.forwarding=%s: %w", f.oldIPv6Forward, err))
		}
	}
	if f.Device != nil {
		if err := f.Device.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		err := errors.Join(errs...)
		f.log.Error("kernel egress: clean-up incomplete", "err", err)
		return err
	}
	f.log.Info("kernel egress stopped: table deleted, tun closed", "table", "inet "+TableName)
	return nil
}

func readSysctl(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

func writeSysctl(path, v string) error {
	if err := os.WriteFile(path, []byte(v+"\n"), 0o644); err != nil {
		if errors.Is(err, syscall.EROFS) {
			return fmt.Errorf("write %s: %w (read-only /proc/sys: set it outside the container)", path, err)
		}
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// isBlockLimit reports whether rule expressions e are a block limit rule.
func isBlockLimit(e []expr.Any) bool {
	for _, x := range e {
		if _, ok := x.(*expr.Dynset); ok {
			return true
		}
	}
	return false
}

// blockRefusals returns how many new flows the per-destination block limit
// has refused since the table was made (the counters of its rules).
func (f *Forwarder) blockRefusals() (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, errClosed
	}
	t := table()
	_, _, fromJobs, _, _, _, _ := chains(t)
	rules, err := f.nft.GetRules(t, fromJobs)
	if err != nil {
		return 0, fmt.Errorf("kernel egress: list rules: %w", err)
	}
	var n uint64
	for _, r := range rules {
		if string(r.UserData) != blockLimitTag {
			continue
		}
		for _, x := range r.Exprs {
			if c, ok := x.(*expr.Counter); ok {
				n += c.Packets
			}
		}
	}
	return n, nil
}
