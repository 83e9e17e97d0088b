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
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/mqtun"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// Defaults for zero Config fields.
const (
	DefaultMTU        = 1420
	DefaultResolvConf = "/etc/resolv.conf"
)

// ErrNotPrivileged is wrapped by errors caused by missing privileges.
var ErrNotPrivileged = errors.New("kernel egress needs root or CAP_NET_ADMIN")

// kjob is the Forwarder's state of one job: its addresses, its token (for
// the policy's scope sets), whether its IPv6 tunnel address is in the set
// of jobs with an own address, and its rules with their handles.
type kjob struct {
	addrs []netip.Addr
	token string
	// own is the job's tunnel address in the own6 set, zero for none.
	own netip.Addr
	// nat are its postrouting rules, exposed its prerouting DNAT rules,
	// limits its jumps in job_limits.
	nat, exposed, limits []*nftables.Rule
}

// Forwarder is the kernel-mode egress: a kernel TUN whose packets the host
// forwards, with per-job SNAT into the job's port block. It implements
// forward.Backend (Read, Write, ... are the TUN's; backend_linux.go). It is
// safe for concurrent use.
type Forwarder struct {
	tun.Device
	cfg   Config
	log   *slog.Logger
	rules ruleset
	// reg is the job bookkeeping every backend shares (AddJob,
	// RemoveJob, the job index).
	reg *forward.Jobs
	// dns are the DNS relays on the tunnel addresses, by family.
	dns [ipfamily.N]*dnsfwd.Server
	// dnsLimits are the jobs' DNS limits, shared by the relays of both
	// families: one budget per job.
	dnsLimits dnsfwd.Limiter
	// upstreams are the DNS relays' resolvers.
	upstreams []netip.AddrPort

	// oldForward are the forwarding sysctls' values to restore at Close
	// by family ("" means leave it); stale those a killed run left in its
	// table's state chain.
	oldForward, staleForward [ipfamily.N]string

	closeOnce sync.Once
	closeErr  error

	// blockSize is Config.BlockSize, for the refusal log; stopRefusals
	// stops refusalLoop and waits for it.
	blockSize    int
	stopRefusals func()

	mu     sync.Mutex
	nft    *nftables.Conn
	closed bool
	// jobs holds each job's state and rules, by ID.
	jobs map[jobs.ID]*kjob
	// tc shapes bandwidth; nil until a bandwidth limit is first set.
	tc *tcShaper
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
// nftables table, in phases like the gateway's open: newForwarder (the
// config, nothing on the host), then openTUN, openTable,
// enableForwarding, startDNS and startAccounting, each of which leaves
// what it made for teardown, the one undo path, if a later one fails.
func New(cfg Config) (*Forwarder, error) {
	f, err := newForwarder(cfg)
	if err != nil {
		return nil, err
	}
	for _, phase := range []func() error{f.openTUN, f.openTable, f.enableForwarding, f.startDNS, f.startAccounting} {
		if err := phase(); err != nil {
			f.teardown()
			return nil, err
		}
	}
	f.startRefusalLog()
	f.logReady()
	return f, nil
}

// newForwarder checks cfg and returns the Forwarder it describes, with
// nothing made on the host yet.
func newForwarder(cfg Config) (*Forwarder, error) {
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
		cfg:           cfg,
		log:           cfg.Logger,
		rules:         ruleset{tun: cfg.Name, own: cfg.OwnPrefix, blockSize: uint32(cfg.BlockSize)},
		jobs:          make(map[jobs.ID]*kjob),
		policyCarried: make(map[string]uint64),
		tunName:       cfg.Name,
		blockSize:     cfg.BlockSize,
	}
	for _, p := range cfg.Addrs {
		if fam := ipfamily.Of(p.Addr()); fam != nil {
			if f.rules.tunnels[fam.Index].IsValid() {
				return nil, fmt.Errorf("kernel egress: tunnel addresses %v: two of %s", cfg.Addrs, fam)
			}
			f.rules.tunnels[fam.Index] = netip.PrefixFrom(p.Addr().Unmap(), p.Bits())
		}
	}
	for _, a := range cfg.Egress {
		if fam := ipfamily.Of(a); fam != nil {
			if f.rules.egress[fam.Index].IsValid() {
				return nil, fmt.Errorf("kernel egress: egress addresses %v: two of %s", cfg.Egress, fam)
			}
			f.rules.egress[fam.Index] = a.Unmap()
		}
	}
	if err := f.rules.validate(); err != nil {
		return nil, err
	}
	var tunnels []netip.Prefix
	for _, p := range f.rules.tunnels {
		if p.IsValid() {
			tunnels = append(tunnels, p)
		}
	}
	reg, err := forward.NewJobs("kernel egress", tunnels, cfg.Jobs, cfg.Flows, f.jobSteps())
	if err != nil {
		return nil, err
	}
	f.reg = reg
	f.upstreams = cfg.DNSUpstreams
	if len(f.upstreams) == 0 {
		if f.upstreams, err = dnsfwd.ReadResolvConf(DefaultResolvConf); err != nil {
			return nil, fmt.Errorf("kernel egress: %w", err)
		}
	}
	return f, nil
}

// openTUN opens the nftables connection, creates the TUN, deletes what a
// killed gateway left (its table, remembering the forwarding values it
// kept; its ifb) and gives the TUN its addresses and routes. The TUN comes
// first: if another gateway holds it (EBUSY), its table is not stale.
func (f *Forwarder) openTUN() error {
	var err error
	if f.nft, err = nftables.New(nftables.WithSockOptions(bigAcks)); err != nil {
		return privError("kernel egress: open nftables netlink socket", err)
	}
	dev, err := createTUN(f.cfg.Name, f.cfg.MTU, f.cfg.Queues)
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("kernel egress: create tun %q: %w (is another kernel-mode gateway running in this network namespace?)", f.cfg.Name, err)
		}
		return privError(fmt.Sprintf("kernel egress: create tun %q", f.cfg.Name), err)
	}
	f.Device = dev
	if err := f.removeStale(); err != nil {
		return err
	}
	if err := removeStaleIFB(f.cfg.Name, f.log); err != nil {
		return err
	}
	return f.configureLink(f.cfg.Name)
}

// createTUN creates the TUN name with mtu: with queues above 1 a multi-queue
// TUN (internal/mqtun), else wireguard-go's, as before queues existed.
func createTUN(name string, mtu, queues int) (tun.Device, error) {
	if queues <= 1 {
		return tun.CreateTUN(name, mtu)
	}
	fds, err := mqtun.OpenQueues(name, queues)
	if err != nil {
		return nil, err
	}
	dev, err := mqtun.FromFDs(fds)
	if err != nil {
		return nil, err
	}
	link, err := netlink.LinkByName(name)
	if err == nil {
		err = netlink.LinkSetMTU(link, mtu)
	}
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("set mtu %d on %s: %w", mtu, name, err)
	}
	return dev, nil
}

// Queues implements forward.Backend: one reader per TUN queue.
func (f *Forwarder) Queues() int { return max(f.cfg.Queues, 1) }

// openTable programs the nftables table with the forwarding values to
// restore at Close (those a killed run kept, else the current ones).
func (f *Forwarder) openTable() error {
	for _, fam := range f.rules.families() {
		old, err := readSysctl(fam.forwarding)
		if err != nil {
			return fmt.Errorf("kernel egress: %w (%s disabled on this host?)", err, fam)
		}
		if f.staleForward[fam.Index] != "" {
			old = f.staleForward[fam.Index] // what the host had before the killed run
		}
		if old != "1" {
			f.oldForward[fam.Index] = old
		}
	}
	return f.program()
}

// enableForwarding switches forwarding on for every family the table
// carries.
func (f *Forwarder) enableForwarding() error {
	for _, fam := range f.rules.families() {
		if fam.Family == ipfamily.V6 && f.oldForward[fam.Index] != "" {
			warnAcceptRA(f.log)
		}
		if err := writeSysctl(fam.forwarding, "1"); err != nil {
			return privError("kernel egress: enable "+strings.TrimPrefix(fam.forwarding, "/proc/sys/"), err)
		}
	}
	return nil
}

// startDNS starts a DNS relay on every tunnel address.
func (f *Forwarder) startDNS() error {
	for _, fam := range f.rules.families() {
		d, err := startDNS(f.cfg, f.rules.tunnels[fam.Index].Addr(), f.upstreams, &f.dnsLimits)
		if err != nil {
			return err
		}
		f.dns[fam.Index] = d
	}
	return nil
}

// startAccounting feeds the flow table from conntrack, if there is one.
func (f *Forwarder) startAccounting() error {
	if f.cfg.Flows == nil {
		return nil
	}
	old, err := enableConntrackAcct()
	if err != nil {
		return privError("kernel egress: enable conntrack accounting (net.netfilter.nf_conntrack_acct) for the flow table", err)
	}
	f.oldCTAcct = old
	f.acct = newAccountant(f.cfg.Flows, f.rules, f)
	ctx, cancel := context.WithCancel(context.Background())
	f.stopAcct, f.acctDone = cancel, make(chan struct{})
	go func() {
		defer close(f.acctDone)
		f.acct.run(ctx)
	}()
	return nil
}

// logReady logs the Forwarder's set-up, and what is missing on the host
// for --egress-prefix.
func (f *Forwarder) logReady() {
	f.log.Info("kernel egress ready", "tun", f.cfg.Name, "addrs", f.cfg.Addrs, "mtu", f.cfg.MTU,
		"egress_addrs", f.cfg.Egress, "egress_prefix6", f.rules.own, "table", "inet "+TableName, "dns_upstreams", f.upstreams)
	if f.rules.own.IsValid() {
		for _, m := range CheckPrefix6(f.rules.own, f.cfg.Name) {
			f.log.Error("kernel egress: "+m, "egress_prefix6", f.rules.own)
		}
	}
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

// configureLink gives the TUN its addresses and brings it up, and routes
// the prefix of jobs' own addresses to it.
func (f *Forwarder) configureLink(name string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("kernel egress: find link %q: %w", name, err)
	}
	for _, fam := range f.rules.families() {
		p := f.rules.tunnels[fam.Index]
		// No duplicate address detection (IPv6): the DNS relay binds the
		// address at once, and nothing else is on a TUN.
		a := &netlink.Addr{IPNet: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), fam.Bits)}, Flags: unix.IFA_F_NODAD}
		if err := netlink.AddrReplace(link, a); err != nil {
			return privError(fmt.Sprintf("kernel egress: set address %s on %s (%s disabled on it? net.ipv6.conf.%s.disable_ipv6)", p, name, fam, name), err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return privError(fmt.Sprintf("kernel egress: bring %s up", name), err)
	}
	if p := f.rules.own; p.IsValid() {
		// Jobs' own addresses live behind the TUN.
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 128)}}
		if err := netlink.RouteReplace(r); err != nil {
			return privError(fmt.Sprintf("kernel egress: route %s to %s", p, name), err)
		}
	}
	return nil
}

// removeStale deletes a table a previous run left and keeps the
// forwarding values that run remembered in staleForward.
func (f *Forwarder) removeStale() error {
	t, err := f.nft.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return privError("kernel egress: list nftables tables", err)
	}
	if rules, err := f.nft.GetRules(t, chainsOf(t).state); err == nil {
		for _, r := range rules {
			for _, fam := range nftFamilies {
				if v, ok := parseStateTag(r.UserData, fam.stateTag); ok {
					f.staleForward[fam.Index] = v
				}
			}
		}
	}
	f.nft.DelTable(t)
	if err := f.nft.Flush(); err != nil {
		return privError("kernel egress: delete stale nftables table inet "+TableName, err)
	}
	f.log.Warn("deleted the nftables table a previous gateway left behind (killed with SIGKILL?)",
		"table", "inet "+TableName, "ip_forward_before_it", f.staleForward[0], "ipv6_forwarding_before_it", f.staleForward[1])
	return nil
}

// program creates the table with its chains and static rules in one
// batch.
func (f *Forwarder) program() error {
	t := f.nft.AddTable(table())
	c := chainsOf(t)
	for _, ch := range []*nftables.Chain{c.post, c.pre, c.refuse, c.floor6, c.fromJobs, c.toHost, c.state, c.fwd, c.input} {
		f.nft.AddChain(ch)
	}
	add := func(ch *nftables.Chain, rules [][]expr.Any) {
		for _, e := range rules {
			f.nft.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: e})
		}
	}
	add(c.refuse, refuseRules())
	// The floor chain before the chains that go to it (floor6).
	f.nft.AddChain(floorChain(t))
	f.nft.AddRule(floorRule(t))
	for _, fam := range f.rules.families() {
		if f.rules.blockSize > 0 {
			if err := f.nft.AddSet(connsSet(t, fam), nil); err != nil {
				return fmt.Errorf("kernel egress: add set %s: %w", fam.conns, err)
			}
		}
	}
	if f.rules.has(ipfamily.V6) {
		if err := f.nft.AddSet(ownSet(t), nil); err != nil {
			return fmt.Errorf("kernel egress: add set %s: %w", setOwn, err)
		}
		add(c.floor6, f.rules.floor6Rules())
	}
	for _, ch := range []*nftables.Chain{c.limits, c.overFlows, c.overRate} {
		f.nft.AddChain(ch)
	}
	add(c.overFlows, overRules())
	add(c.overRate, overRules())
	pol, polHost, polDeny := policyChains(t)
	for _, ch := range []*nftables.Chain{polDeny, pol, polHost} {
		f.nft.AddChain(ch)
	}
	add(polDeny, policyDenyRules())
	f.policy = f.rules.compilePolicy(t, &policy.Policy{}, 0)
	if err := f.queuePolicyLocked(t, f.policy); err != nil {
		return err
	}
	for _, e := range f.rules.fromJobsRules() {
		r := &nftables.Rule{Table: t, Chain: c.fromJobs, Exprs: e}
		if isBlockLimit(e) {
			r.UserData = []byte(blockLimitTag)
		}
		f.nft.AddRule(r)
	}
	add(c.toHost, f.rules.toHostRules())
	add(c.fwd, f.rules.forwardRules())
	add(c.input, f.rules.inputRules())
	for _, fam := range f.rules.families() {
		f.nft.AddRule(&nftables.Rule{Table: t, Chain: c.state, Exprs: []expr.Any{&expr.Counter{}}, UserData: stateTag(fam.stateTag, f.oldForward[fam.Index])})
	}
	if err := f.nft.Flush(); err != nil {
		return privError("kernel egress: create nftables table inet "+TableName, err)
	}
	return nil
}

// addNAT source-NATs the traffic of job j, each of its addresses to its
// egress of the address's family (natRules), and puts its IPv6 address in
// the own6 set if that family's egress is its own address. It records the
// job's state (with its token) in f.jobs.
func (f *Forwarder) addNAT(j forward.Job) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errClosed
	}
	t := table()
	post := chainsOf(t).post
	tag := jobTag(j.ID)
	kj := &kjob{addrs: j.Addrs, token: j.Ref.Token}
	for _, a := range j.Addrs {
		e := f.rules.egressOf(j, famOf(a))
		for _, ex := range f.rules.natRules(a, e) {
			f.nft.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: ex, UserData: tag})
		}
		if e.own {
			kj.own = a
			if err := f.nft.SetAddElements(ownSet(t), []nftables.SetElement{{Key: a.AsSlice()}}); err != nil {
				return err
			}
		}
	}
	if err := f.nft.Flush(); err != nil {
		return fmt.Errorf("kernel egress: add nat rules of %s %v: %w", j.ID, j.Addrs, err)
	}
	f.jobs[j.ID] = kj
	var err error
	if kj.nat, err = f.taggedLocked(post, tag); err != nil {
		return err
	}
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

// removeNAT deletes the job's NAT rules, its own6 element, its limits, its
// policy scope and its conntrack entries, and ends its flows.
func (f *Forwarder) removeNAT(j forward.Job) {
	f.mu.Lock()
	defer f.mu.Unlock()
	kj, ok := f.jobs[j.ID]
	if !ok || f.closed {
		return
	}
	for _, r := range kj.nat {
		if err := f.nft.DelRule(r); err != nil {
			f.log.Error("kernel egress: delete snat rule", "job", j.ID, "err", err)
		}
	}
	if kj.own.IsValid() {
		if err := f.nft.SetDeleteElements(ownSet(table()), []nftables.SetElement{{Key: kj.own.AsSlice()}}); err != nil {
			f.log.Error("kernel egress: delete the job from set "+setOwn, "job", j.ID, "err", err)
		}
	}
	if err := f.nft.Flush(); err != nil {
		f.log.Error("kernel egress: delete snat rules", "job", j.ID, "err", err)
	}
	f.removeLimitsLocked(j.ID, kj)
	if f.acct != nil {
		f.acct.poll() // the job's flows' last counters, before the flush
	}
	f.forgetTokenLocked(j.ID, kj)
	delete(f.jobs, j.ID)
	for _, a := range kj.addrs {
		f.flushConntrack(a)
		if f.acct != nil {
			f.acct.endJob(a)
		}
	}
	f.dnsLimits.RemoveJob(kj.addrs)
}

// flushConntrack drops the connection-tracking entries the job at addr
// originated, so that their NAT mappings die with the job.
func (f *Forwarder) flushConntrack(addr netip.Addr) {
	filter := &netlink.ConntrackFilter{}
	if err := filter.AddIP(netlink.ConntrackOrigSrcIP, addr.AsSlice()); err != nil {
		return
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, famOf(addr).netlink, filter); err != nil {
		f.log.Warn("kernel egress: cannot flush the job's conntrack entries; its flows keep their mappings until they time out", "job", addr, "err", err)
	}
}

// Jobs returns the number of jobs with NAT rules.
func (f *Forwarder) Jobs() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.jobs)
}

// Close stops the DNS relays, deletes the nftables table and the ifb
// device, restores the forwarding sysctls and closes (and so removes) the
// TUN with its qdiscs. Pending Read and Write calls return an error. Close
// is idempotent.
func (f *Forwarder) Close() error {
	f.closeOnce.Do(func() { f.closeErr = f.teardown() })
	return f.closeErr
}

// teardown undoes what New's phases made, also after a phase failed.
func (f *Forwarder) teardown() error {
	var errs []error
	if f.stopRefusals != nil {
		f.stopRefusals()
	}
	for _, d := range f.dns {
		if d != nil {
			d.Close()
		}
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
	if f.tc != nil {
		if err := f.tc.close(); err != nil {
			errs = append(errs, err)
		}
		f.tc = nil
	}
	if f.nft != nil {
		if f.Device != nil {
			f.nft.DelTable(table())
			if err := f.nft.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete nftables table inet %s: %w", TableName, err))
			}
		}
		f.nft.CloseLasting()
	}
	f.mu.Unlock()
	for _, fam := range nftFamilies {
		if v := f.oldForward[fam.Index]; v != "" {
			if err := writeSysctl(fam.forwarding, v); err != nil {
				errs = append(errs, fmt.Errorf("restore %s=%s: %w", fam.forwarding, v, err))
			}
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
	rules, err := f.nft.GetRules(t, chainsOf(t).fromJobs)
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
