// SPDX-License-Identifier: MIT

package kernel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/jobs"
)

// HTB layout, the same on both shaped devices (see limits_linux.go).
const (
	htbMajor     = 1
	rootMinor    = 1
	defaultMinor = 0xffff
	// firstJobMinor..lastJobMinor are the class minors (and IPv4 u32
	// filter priorities) given to limited jobs; a job's IPv6 filter has
	// priority minor+prio6 (filters of one priority share a protocol).
	firstJobMinor = 2
	lastJobMinor  = 0x7ffe
	prio6         = 0x8000
	// unlimitedBps is the root class's rate without a global limit.
	unlimitedBps = 100e9
	// guaranteedBps is the rate of job and default classes: they borrow
	// the rest, up to their ceiling, from the root class, so that the
	// root's rate caps them all.
	guaranteedBps = 1e6
	// htbQuantum is every class's round-robin quantum: one GSO packet.
	htbQuantum = 64 << 10
	// ifbQueueLen is the ifb's (and so its leaf queues') length in
	// packets; the default (32) starves TCP.
	ifbQueueLen = 1000
	// ingressHandle is the TUN's ingress qdisc handle (ffff:).
	ingressHandle = 0xffff
)

// ifbName returns the name of the ifb device that shapes traffic from
// the jobs of TUN tun.
func ifbName(tun string) string {
	n := tun
	if len(n) > unix.IFNAMSIZ-1-4 {
		n = n[:unix.IFNAMSIZ-1-4]
	}
	return n + "-ifb"
}

// direction is one shaped direction: its device and which address of a
// packet names the job.
type direction struct {
	link netlink.Link
	// src: the job's address is the packet's source (traffic from jobs),
	// else its destination (traffic to them).
	src bool
}

// off returns the offset of the job's address in a header of family f.
func (d direction) off(f *nftFamily) int32 {
	if d.src {
		return int32(f.SrcOff)
	}
	return int32(f.DstOff)
}

// tcJob is one limited job: its class minor, its rates (0: no class) and
// its addresses, each classified by a filter of its family.
type tcJob struct {
	minor uint16
	bps   [2]uint64 // egress, ingress
	addrs []netip.Addr
}

// tcShaper owns the qdiscs of the TUN and the ifb. It is not safe for
// concurrent use: the Forwarder's mu guards it.
type tcShaper struct {
	log    *slog.Logger
	dirs   [2]direction // egress (ifb), ingress (TUN)
	ifb    string
	global [2]uint64
	jobs   map[jobs.ID]*tcJob
	free   []uint16
	next   uint16
}

// removeStaleIFB deletes the ifb a killed gateway left behind.
func removeStaleIFB(tun string, log *slog.Logger) error {
	l, err := netlink.LinkByName(ifbName(tun))
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("kernel egress: look up %s: %w", ifbName(tun), err)
	}
	if err := netlink.LinkDel(l); err != nil {
		return privError("kernel egress: delete stale "+ifbName(tun), err)
	}
	log.Warn("deleted the ifb device a previous gateway left behind (killed with SIGKILL?)", "dev", ifbName(tun))
	return nil
}

// newTCShaper creates the ifb and both HTB trees, unlimited.
func newTCShaper(tun string, log *slog.Logger) (_ *tcShaper, err error) {
	t, err := netlink.LinkByName(tun)
	if err != nil {
		return nil, fmt.Errorf("kernel egress: find link %q: %w", tun, err)
	}
	name := ifbName(tun)
	if err := removeStaleIFB(tun, log); err != nil {
		return nil, err
	}
	if err := netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: name, TxQLen: ifbQueueLen}}); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("kernel egress: create %s: %w (bandwidth limits need the ifb kernel module)", name, err)
		}
		return nil, privError("kernel egress: create "+name, err)
	}
	s := &tcShaper{log: log, ifb: name, jobs: make(map[jobs.ID]*tcJob), next: firstJobMinor}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	ifb, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("kernel egress: find link %q: %w", name, err)
	}
	if err := netlink.LinkSetUp(ifb); err != nil {
		return nil, privError("kernel egress: bring "+name+" up", err)
	}
	s.dirs = [2]direction{{link: ifb, src: true}, {link: t}}
	for _, d := range s.dirs {
		q := netlink.NewHtb(netlink.QdiscAttrs{LinkIndex: d.link.Attrs().Index, Handle: netlink.MakeHandle(htbMajor, 0), Parent: netlink.HANDLE_ROOT})
		q.Defcls = defaultMinor
		if err := netlink.QdiscReplace(q); err != nil {
			return nil, privError(fmt.Sprintf("kernel egress: add htb qdisc on %s", d.link.Attrs().Name), err)
		}
		for _, c := range []*netlink.HtbClass{
			htbClass(d.link, rootMinor, netlink.MakeHandle(htbMajor, 0), unlimitedBps, unlimitedBps),
			htbClass(d.link, defaultMinor, netlink.MakeHandle(htbMajor, rootMinor), guaranteedBps, unlimitedBps),
		} {
			if err := netlink.ClassReplace(c); err != nil {
				return nil, privError(fmt.Sprintf("kernel egress: add htb class on %s", d.link.Attrs().Name), err)
			}
		}
	}
	// Traffic from jobs: TUN ingress → ifb.
	ing := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: t.Attrs().Index, Handle: netlink.MakeHandle(ingressHandle, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := netlink.QdiscReplace(ing); err != nil {
		return nil, privError("kernel egress: add ingress qdisc on "+tun, err)
	}
	redirect := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: t.Attrs().Index, Parent: netlink.MakeHandle(ingressHandle, 0), Priority: 1, Protocol: unix.ETH_P_ALL},
		Sel:         &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: []netlink.TcU32Key{{}}},
		Actions:     []netlink.Action{netlink.NewMirredAction(ifb.Attrs().Index)},
	}
	if err := netlink.FilterAdd(redirect); err != nil {
		return nil, privError("kernel egress: redirect "+tun+" ingress to "+name, err)
	}
	log.Info("kernel egress: bandwidth shaping set up", "tun", tun, "ifb", name)
	return s, nil
}

// htbClass returns class major:minor under parent with rate and ceiling
// in bits per second.
func htbClass(link netlink.Link, minor uint16, parent uint32, rate, ceil uint64) *netlink.HtbClass {
	burst := uint32(max(ceil/8/100, 2*htbQuantum)) // 10 ms at the ceiling, at least two GSO packets
	return netlink.NewHtbClass(
		netlink.ClassAttrs{LinkIndex: link.Attrs().Index, Handle: netlink.MakeHandle(htbMajor, minor), Parent: parent},
		netlink.HtbClassAttrs{Rate: min(rate, ceil), Ceil: ceil, Buffer: burst, Cbuffer: burst, Quantum: htbQuantum})
}

// setGlobal sets the root classes' rates (0: unlimited).
func (s *tcShaper) setGlobal(egress, ingress uint64) error {
	for i, bps := range []uint64{egress, ingress} {
		if bps == 0 {
			bps = unlimitedBps
		}
		d := s.dirs[i]
		if err := netlink.ClassReplace(htbClass(d.link, rootMinor, netlink.MakeHandle(htbMajor, 0), bps, bps)); err != nil {
			return fmt.Errorf("kernel egress: set the global rate on %s: %w", d.link.Attrs().Name, err)
		}
		if err := netlink.ClassReplace(htbClass(d.link, defaultMinor, netlink.MakeHandle(htbMajor, rootMinor), guaranteedBps, bps)); err != nil {
			return fmt.Errorf("kernel egress: set the default class on %s: %w", d.link.Attrs().Name, err)
		}
		s.global[i] = bps
		// Job classes may not exceed the root's ceiling.
		for job, j := range s.jobs {
			if j.bps[i] != 0 {
				if err := s.setClass(i, job, j); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// rootBps returns the root rate of direction i.
func (s *tcShaper) rootBps(i int) uint64 {
	if s.global[i] == 0 {
		return unlimitedBps
	}
	return s.global[i]
}

// setJob gives job id (at addrs) classes with the ceilings egress and
// ingress, and removes a direction's class when its rate is 0.
func (s *tcShaper) setJob(id jobs.ID, addrs []netip.Addr, egress, ingress uint64) error {
	j, ok := s.jobs[id]
	if !ok {
		if egress == 0 && ingress == 0 {
			return nil
		}
		minor, err := s.alloc()
		if err != nil {
			return err
		}
		j = &tcJob{minor: minor, addrs: addrs}
		s.jobs[id] = j
	}
	for i, bps := range []uint64{egress, ingress} {
		switch {
		case bps == 0 && j.bps[i] != 0:
			if err := s.delClass(i, j); err != nil {
				return err
			}
			j.bps[i] = 0
		case bps != 0:
			had := j.bps[i] != 0
			j.bps[i] = bps
			if err := s.setClass(i, id, j); err != nil {
				return err
			}
			if !had {
				if err := s.addFilters(i, j); err != nil {
					return err
				}
			}
		}
	}
	if j.bps == [2]uint64{} {
		delete(s.jobs, id)
		s.free = append(s.free, j.minor)
	}
	return nil
}

func (s *tcShaper) setClass(i int, id jobs.ID, j *tcJob) error {
	d := s.dirs[i]
	ceil := min(j.bps[i], s.rootBps(i))
	c := htbClass(d.link, j.minor, netlink.MakeHandle(htbMajor, rootMinor), guaranteedBps, ceil)
	if err := netlink.ClassReplace(c); err != nil {
		return fmt.Errorf("kernel egress: set the htb class of %s on %s: %w", id, d.link.Attrs().Name, err)
	}
	return nil
}

// filter is the u32 filter that classifies the packets of family f of a
// job with class minor into its class in direction d, at priority minor
// plus the family's offset: `u32 match ip|ip6 src|dst JOB flowid
// 1:MINOR`; a is the job's address, zero for a filter to delete.
func filter(d direction, f *nftFamily, minor uint16, a netip.Addr) *netlink.U32 {
	u := &netlink.U32{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: d.link.Attrs().Index, Parent: netlink.MakeHandle(htbMajor, 0), Priority: minor + f.tcPrio, Protocol: f.ethProto},
		ClassId:     netlink.MakeHandle(htbMajor, minor),
	}
	if !a.IsValid() {
		return u
	}
	var keys []netlink.TcU32Key
	b := a.AsSlice()
	for i := 0; i < len(b); i += 4 {
		keys = append(keys, netlink.TcU32Key{Mask: 0xffffffff, Val: binary.BigEndian.Uint32(b[i:]), Off: d.off(f) + int32(i)})
	}
	u.Sel = &netlink.TcU32Sel{Flags: netlink.TC_U32_TERMINAL, Keys: keys}
	return u
}

// addFilters classifies the job's packets of each of its addresses into
// its class.
func (s *tcShaper) addFilters(i int, j *tcJob) error {
	d := s.dirs[i]
	for _, a := range j.addrs {
		if err := netlink.FilterAdd(filter(d, famOf(a), j.minor, a)); err != nil {
			return fmt.Errorf("kernel egress: add the tc filter of %v on %s: %w", a, d.link.Attrs().Name, err)
		}
	}
	return nil
}

// delClass removes the job's filters and class in direction i.
func (s *tcShaper) delClass(i int, j *tcJob) error {
	d := s.dirs[i]
	for _, a := range j.addrs {
		if err := netlink.FilterDel(filter(d, famOf(a), j.minor, netip.Addr{})); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("kernel egress: delete a tc filter on %s: %w", d.link.Attrs().Name, err)
		}
	}
	c := &netlink.HtbClass{ClassAttrs: netlink.ClassAttrs{LinkIndex: d.link.Attrs().Index, Handle: netlink.MakeHandle(htbMajor, j.minor), Parent: netlink.MakeHandle(htbMajor, rootMinor)}}
	if err := netlink.ClassDel(c); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("kernel egress: delete a tc class on %s: %w", d.link.Attrs().Name, err)
	}
	return nil
}

// removeJob deletes the job's classes and filters.
func (s *tcShaper) removeJob(id jobs.ID) error {
	if _, ok := s.jobs[id]; !ok {
		return nil
	}
	return s.setJob(id, nil, 0, 0)
}

// alloc returns a free class minor.
func (s *tcShaper) alloc() (uint16, error) {
	if n := len(s.free); n > 0 {
		m := s.free[n-1]
		s.free = s.free[:n-1]
		return m, nil
	}
	if s.next > lastJobMinor {
		return 0, errors.New("kernel egress: no tc class left for another limited job")
	}
	s.next++
	return s.next - 1, nil
}

// drops returns the packets the two HTB qdiscs dropped.
func (s *tcShaper) drops() (uint64, error) {
	var n uint64
	for _, d := range s.dirs {
		qs, err := netlink.QdiscList(d.link)
		if err != nil {
			return 0, fmt.Errorf("kernel egress: list qdiscs of %s: %w", d.link.Attrs().Name, err)
		}
		for _, q := range qs {
			if h, ok := q.(*netlink.Htb); ok && h.Attrs().Statistics != nil && h.Attrs().Statistics.Queue != nil {
				n += uint64(h.Attrs().Statistics.Queue.Drops)
			}
		}
	}
	return n, nil
}

// close deletes the ifb; the TUN's qdiscs go with the TUN.
func (s *tcShaper) close() error {
	l, err := netlink.LinkByName(s.ifb)
	if err != nil {
		return nil
	}
	if err := netlink.LinkDel(l); err != nil {
		return fmt.Errorf("delete %s: %w", s.ifb, err)
	}
	return nil
}
