// SPDX-License-Identifier: MIT

package kernel

import (
	"encoding/binary"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// peerNS runs functions on one OS thread inside a network namespace of
// its own: an outside host for the forwarder under test.
type peerNS struct {
	do   chan func()
	done chan struct{}
}

func newPeerNS(t *testing.T) *peerNS {
	t.Helper()
	p := &peerNS{do: make(chan func()), done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		// The thread stays locked: it ends with the goroutine, and its
		// namespace with it.
		runtime.LockOSThread()
		defer close(p.done)
		errc <- unix.Unshare(unix.CLONE_NEWNET)
		for fn := range p.do {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		t.Fatalf("unshare: %v", err)
	}
	t.Cleanup(func() { close(p.do); <-p.done })
	return p
}

// run runs fn in the peer's namespace and waits for it.
func (p *peerNS) run(fn func()) {
	ch := make(chan struct{})
	p.do <- func() { fn(); close(ch) }
	<-ch
}

func addAddr(t *testing.T, l netlink.Link, p string) {
	t.Helper()
	a, err := netlink.ParseAddr(p)
	if err != nil {
		t.Fatal(err)
	}
	a.Flags = unix.IFA_F_NODAD
	if err := netlink.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s: %v", p, err)
	}
}

// checksum6 is the Internet checksum of an upper-layer packet b with the
// IPv6 pseudo-header.
func checksum6(src, dst netip.Addr, proto byte, b []byte) uint16 {
	var sum uint32
	add := func(x []byte) {
		for i := 0; i+1 < len(x); i += 2 {
			sum += uint32(x[i])<<8 | uint32(x[i+1])
		}
		if len(x)%2 == 1 {
			sum += uint32(x[len(x)-1]) << 8
		}
	}
	s, d := src.As16(), dst.As16()
	add(s[:])
	add(d[:])
	var l [8]byte
	binary.BigEndian.PutUint32(l[:4], uint32(len(b)))
	l[7] = proto
	add(l[:])
	add(b)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// packet6 builds an IPv6 packet around upper-layer bytes body (checksum
// field zero), filling in the checksum at csumOff.
func packet6(src, dst netip.Addr, proto byte, body []byte, csumOff int) []byte {
	b := make([]byte, 40+len(body))
	b[0] = 0x60
	binary.BigEndian.PutUint16(b[4:], uint16(len(body)))
	b[6], b[7] = proto, 64
	s, d := src.As16(), dst.As16()
	copy(b[8:], s[:])
	copy(b[24:], d[:])
	copy(b[40:], body)
	binary.BigEndian.PutUint16(b[40+csumOff:], checksum6(src, dst, proto, b[40:]))
	return b
}

func udp6(src, dst netip.AddrPort, payload []byte) []byte {
	u := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(u[0:], src.Port())
	binary.BigEndian.PutUint16(u[2:], dst.Port())
	binary.BigEndian.PutUint16(u[4:], uint16(len(u)))
	copy(u[8:], payload)
	return packet6(src.Addr(), dst.Addr(), unix.IPPROTO_UDP, u, 6)
}

// syn6 builds a TCP SYN with an MSS option.
func syn6(src, dst netip.AddrPort, mss uint16) []byte {
	h := make([]byte, 24)
	binary.BigEndian.PutUint16(h[0:], src.Port())
	binary.BigEndian.PutUint16(h[2:], dst.Port())
	binary.BigEndian.PutUint32(h[4:], 1)
	h[12] = 6 << 4 // data offset: 24 bytes
	h[13] = 0x02   // SYN
	binary.BigEndian.PutUint16(h[14:], 65535)
	h[20], h[21] = 2, 4 // MSS
	binary.BigEndian.PutUint16(h[22:], mss)
	return packet6(src.Addr(), dst.Addr(), unix.IPPROTO_TCP, h, 16)
}

// mssOf returns the MSS option of the TCP segment in IPv6 packet p.
func mssOf(p []byte) uint16 {
	tcp := p[40:]
	opts := tcp[20 : int(tcp[12]>>4)*4]
	for i := 0; i < len(opts); {
		switch opts[i] {
		case 0:
			return 0
		case 1:
			i++
			continue
		case 2:
			return binary.BigEndian.Uint16(opts[i+2:])
		}
		if i+1 >= len(opts) || opts[i+1] < 2 {
			return 0
		}
		i += int(opts[i+1])
	}
	return 0
}

func echo6(src, dst netip.Addr, id uint16) []byte {
	e := []byte{128, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 'p', 'i', 'n', 'g'}
	return packet6(src, dst, unix.IPPROTO_ICMPV6, e, 2)
}

// tunIO writes packets into the forwarder as jobs would and collects what
// it sends to jobs.
type tunIO struct {
	t   *testing.T
	f   *Forwarder
	got chan []byte
}

func newTunIO(t *testing.T, f *Forwarder) *tunIO {
	io := &tunIO{t: t, f: f, got: make(chan []byte, 256)}
	go func() {
		const off = 16
		bufs := make([][]byte, f.BatchSize())
		for i := range bufs {
			bufs[i] = make([]byte, off+65535)
		}
		sizes := make([]int, len(bufs))
		for {
			n, err := f.Read(bufs, sizes, off)
			if err != nil {
				return
			}
			for i := 0; i < n; i++ {
				select {
				case io.got <- append([]byte(nil), bufs[i][off:off+sizes[i]]...):
				default:
				}
			}
		}
	}()
	return io
}

func (io *tunIO) send(pkt []byte) {
	io.t.Helper()
	b := make([]byte, 16+len(pkt))
	copy(b[16:], pkt)
	if _, err := io.f.Write([][]byte{b}, 16); err != nil {
		io.t.Fatalf("write to tun: %v", err)
	}
}

// wait returns the first IPv6 packet to dst that match accepts, or nil
// after timeout.
func (io *tunIO) wait(dst netip.Addr, timeout time.Duration, match func(p []byte) bool) []byte {
	deadline := time.After(timeout)
	for {
		select {
		case p := <-io.got:
			if len(p) < 48 || p[0]>>4 != 6 {
				continue
			}
			if d, _ := netip.AddrFromSlice(p[24:40]); d != dst {
				continue
			}
			if match(p) {
				return p
			}
		case <-deadline:
			return nil
		}
	}
}

// TestIPv6Traffic forwards real IPv6 packets between jobs (written to and
// read from the TUN) and an outside host in a namespace of its own: UDP
// to the block on the egress address, a job's own address one to one with
// its ports kept, ICMPv6 echo, the floor's refusal, a policy denial,
// exposures at the egress address and at an own address, and a packet too
// big from the gateway when the outside link's MTU is smaller.
func TestIPv6Traffic(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	peer := newPeerNS(t)
	var nsFd int
	peer.run(func() {
		var err error
		if nsFd, err = unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			t.Error(err)
		}
	})
	defer unix.Close(nsFd)
	if err := netlink.LinkSetNsFd(mustLink(t, "outside1"), nsFd); err != nil {
		t.Fatal(err)
	}
	out0 := mustLink(t, "outside0")
	addAddr(t, out0, "2001:db8:ff::1/64")
	// Routes towards two far networks behind the peer: one whose MTU
	// this host knows (it answers packet too big itself), one behind a
	// narrow link of the peer's (the peer answers, and conntrack carries
	// the error back to the job through the NAT). NAT64 is routed too, so
	// that only the floor stops the embedded forms of the IPv4 floor.
	near, far := netip.MustParseAddr("2001:db8:98::1"), netip.MustParseAddr("2001:db8:99::1")
	for _, r := range []struct {
		dst string
		mtu int
	}{{"2001:db8:98::/64", 1280}, {"2001:db8:99::/64", 0}, {"64:ff9b::/96", 0}} {
		_, dst, _ := net.ParseCIDR(r.dst)
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: out0.Attrs().Index, Dst: dst, Gw: net.ParseIP("2001:db8:ff::2"), MTU: r.mtu}); err != nil {
			t.Fatalf("route %s: %v", r.dst, err)
		}
	}
	peerAddr := netip.MustParseAddr("2001:db8:ff::2")
	var conn *net.UDPConn
	var tcpLn *net.TCPListener
	peer.run(func() {
		for _, n := range []string{"lo", "outside1"} {
			if err := netlink.LinkSetUp(mustLink(t, n)); err != nil {
				t.Error(err)
			}
		}
		l := mustLink(t, "outside1")
		addAddr(t, l, "2001:db8:ff::2/64")
		// The far network: a 1280-byte link, forwarded to.
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "far0", MTU: 1280}, PeerName: "far1"}); err != nil {
			t.Error(err)
		}
		for _, n := range []string{"far0", "far1"} {
			if err := netlink.LinkSetUp(mustLink(t, n)); err != nil {
				t.Error(err)
			}
		}
		_, farNet, _ := net.ParseCIDR("2001:db8:99::/64")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: mustLink(t, "far0").Attrs().Index, Dst: farNet}); err != nil {
			t.Error(err)
		}
		if err := writeSysctl(v6Family.forwarding, "1"); err != nil {
			t.Error(err)
		}
		_, own, _ := net.ParseCIDR("2001:db8:77::/64")
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: own, Gw: net.ParseIP("2001:db8:ff::1")}); err != nil {
			t.Error(err)
		}
		var err error
		if conn, err = net.ListenUDP("udp6", &net.UDPAddr{IP: peerAddr.AsSlice(), Port: 9999}); err != nil {
			t.Error(err)
		}
		if tcpLn, err = net.ListenTCP("tcp6", &net.TCPAddr{IP: peerAddr.AsSlice(), Port: 9998}); err != nil {
			t.Error(err)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	defer conn.Close()
	defer tcpLn.Close()

	f := newTestForwarder(t, func(c *Config) {
		c.Addrs = append(c.Addrs, netip.MustParsePrefix("fd00:a1::1/64"))
		c.OwnPrefix = netip.MustParsePrefix("2001:db8:77::/64")
	})
	defer f.Close()
	if v, _ := readSysctl(v6Family.forwarding); v != "1" {
		t.Errorf("IPv6 forwarding after New: %s", v)
	}
	tio := newTunIO(t, f)

	shared, own := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("100.64.0.3")
	shared6, own6 := netip.MustParseAddr("fd00:a1::2"), netip.MustParseAddr("fd00:a1::3")
	ownPub := netip.MustParseAddr("2001:db8:77::3")
	block := portblock.Range{Lo: 20000, Hi: 20255}
	egress6 := netip.MustParseAddr("2001:db8:ff::1")
	for _, j := range []struct {
		v4, v6, eg netip.Addr
		b          portblock.Range
	}{{shared, shared6, egress6, block}, {own, own6, ownPub, portblock.Range{}}} {
		if err := f.AddJob(forward.Job{ID: idOf(j.v4), Addrs: []netip.Addr{j.v4, j.v6},
			Egress: []forward.Egress{{Addr: egressAddr, Block: portblock.Range{Lo: 30000, Hi: 30255}}, {Addr: j.eg, Block: j.b, Own: j.b == portblock.Range{}}}}); err != nil {
			t.Fatalf("AddJob %v, %v: %v", j.v4, j.v6, err)
		}
	}
	third := netip.MustParseAddr("100.64.0.4")
	if err := f.AddJob(forward.Job{ID: idOf(third), Addrs: []netip.Addr{third, netip.MustParseAddr("fd00:a1::4")},
		Egress: []forward.Egress{{Addr: netip.MustParseAddr("2001:db8:77::4"), Block: block, Own: true}}}); err == nil {
		t.Error("AddJob accepted an own address with a port block")
	}
	if f.Jobs() != 2 {
		t.Errorf("jobs after a failed AddJob: %d, want 2", f.Jobs())
	}

	// UDP out and back.
	buf := make([]byte, 2048)
	udpRoundTrip := func(from netip.AddrPort, timeout time.Duration) (seen netip.AddrPort, back bool) {
		t.Helper()
		tio.send(udp6(from, netip.AddrPortFrom(peerAddr, 9999), []byte("hello")))
		conn.SetReadDeadline(time.Now().Add(timeout))
		n, src, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != "hello" {
			return netip.AddrPort{}, false
		}
		if _, err := conn.WriteToUDPAddrPort([]byte("pong"), src); err != nil {
			t.Fatal(err)
		}
		p := tio.wait(from.Addr(), 2*time.Second, func(p []byte) bool {
			return p[6] == unix.IPPROTO_UDP && binary.BigEndian.Uint16(p[42:]) == from.Port() && string(p[48:]) == "pong"
		})
		return netip.AddrPortFrom(src.Addr().Unmap(), src.Port()), p != nil
	}
	seen, back := udpRoundTrip(netip.AddrPortFrom(shared6, 40000), 2*time.Second)
	if seen.Addr() != egress6 || seen.Port() < block.Lo || seen.Port() > block.Hi || !back {
		t.Errorf("shared job's UDP: peer saw %v (want %v in %v), reply back %v", seen, egress6, block, back)
	}
	seen, back = udpRoundTrip(netip.AddrPortFrom(own6, 40001), 2*time.Second)
	if seen != netip.AddrPortFrom(ownPub, 40001) || !back {
		t.Errorf("own-address job's UDP: peer saw %v, want %v; reply back %v", seen, netip.AddrPortFrom(ownPub, 40001), back)
	}

	// MSS clamping: the peer's SYN-ACK advertises 1440 (its link's
	// 1500); towards the job the gateway clamps it to the TUN's 1420
	// less the IPv6 and TCP headers.
	tio.send(syn6(netip.AddrPortFrom(shared6, 40020), netip.AddrPortFrom(peerAddr, 9998), 1360))
	if p := tio.wait(shared6, 2*time.Second, func(p []byte) bool { return p[6] == unix.IPPROTO_TCP && p[40+13]&0x12 == 0x12 }); p == nil {
		t.Error("no SYN-ACK from the peer")
	} else if mss := mssOf(p); mss != 1360 {
		t.Errorf("SYN-ACK towards the job: MSS %d, want 1360 (clamped)", mss)
	}

	// ICMPv6 echo.
	tio.send(echo6(shared6, peerAddr, 7))
	if tio.wait(shared6, 2*time.Second, func(p []byte) bool { return p[6] == unix.IPPROTO_ICMPV6 && p[40] == 129 }) == nil {
		t.Error("no echo reply from the outside host")
	}
	// The floor: loopback behind NAT64 is refused at once (::1 itself
	// never gets past the kernel's input checks).
	tio.send(udp6(netip.AddrPortFrom(shared6, 40002), netip.MustParseAddrPort("[64:ff9b::7f00:1]:9999"), []byte("x")))
	if tio.wait(shared6, 2*time.Second, func(p []byte) bool { return p[6] == unix.IPPROTO_ICMPV6 && p[40] == 1 }) == nil {
		t.Error("UDP to 64:ff9b::127.0.0.1: no ICMPv6 unreachable")
	}
	// Packet too big, from this host (a route with MTU 1280) and from a
	// router beyond it (the peer's 1280-byte link): both reach the job,
	// the second with the quoted packet translated back to the job's
	// address.
	for i, dst := range []netip.Addr{near, far} {
		from := netip.AddrPortFrom(shared6, uint16(40010+i))
		tio.send(udp6(from, netip.AddrPortFrom(dst, 9999), make([]byte, 1300)))
		p := tio.wait(shared6, 2*time.Second, func(p []byte) bool { return p[6] == unix.IPPROTO_ICMPV6 && p[40] == 2 })
		if p == nil {
			t.Errorf("1348-byte packet to %v: no packet too big reached the job", dst)
			continue
		}
		src, _ := netip.AddrFromSlice(p[8:24])
		inner, _ := netip.AddrFromSlice(p[48+8 : 48+24])
		if mtu := binary.BigEndian.Uint32(p[44:]); mtu != 1280 || inner != shared6 || dst == far && src != peerAddr {
			t.Errorf("packet too big for %v: from %v, MTU %d, quoting a packet from %v; want MTU 1280 quoting %v (from the peer for the far one)", dst, src, mtu, inner, shared6)
		}
	}

	// Exposures: UDP at the shared egress address's public port, and at
	// the own address's own port (the gateway gives it as the public
	// port).
	if err := f.expose(forward.Job{ID: idOf(shared), Addrs: []netip.Addr{shared, shared6},
		Exposures: []forward.Exposure{{Proto: ipproto.UDP, JobPort: 5353, PublicPort: 20300, PublicAddr: egress6}}}); err != nil {
		t.Fatal(err)
	}
	if err := f.expose(forward.Job{ID: idOf(own), Addrs: []netip.Addr{own, own6},
		Exposures: []forward.Exposure{{Proto: ipproto.UDP, JobPort: 5353, PublicPort: 5353, PublicAddr: ownPub}}}); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		to  netip.AddrPort
		job netip.Addr
	}{{netip.AddrPortFrom(egress6, 20300), shared6}, {netip.AddrPortFrom(ownPub, 5353), own6}} {
		if _, err := conn.WriteToUDPAddrPort([]byte("in"), x.to); err != nil {
			t.Fatal(err)
		}
		if tio.wait(x.job, 2*time.Second, func(p []byte) bool {
			return p[6] == unix.IPPROTO_UDP && binary.BigEndian.Uint16(p[42:]) == 5353 && string(p[48:]) == "in"
		}) == nil {
			t.Errorf("exposure at %v: nothing reached %v:5353", x.to, x.job)
		}
	}

	// Limits: the job's tc classes get an IPv6 filter beside the IPv4
	// one on both devices, and IPv6 packets land in them.
	if err := f.SetJobLimits(idOf(shared), limits.Job{EgressBitsPerSec: 10e6, IngressBitsPerSec: 10e6, MaxFlows: 3}); err != nil {
		t.Fatalf("SetJobLimits: %v", err)
	}
	for _, dev := range []string{ifbName(DefaultName), DefaultName} {
		if n := u32Count(t, dev); n != 2 {
			t.Errorf("classifying filters on %s: %d, want 2 (IPv4 and IPv6)", dev, n)
		}
	}
	if _, back := udpRoundTrip(netip.AddrPortFrom(shared6, 40030), 2*time.Second); !back {
		t.Error("UDP round trip of the limited job failed")
	}
	for _, dev := range []string{ifbName(DefaultName), DefaultName} {
		if c := htbClasses(t, dev)[firstJobMinor]; c == nil || c.Statistics == nil || c.Statistics.Basic == nil || c.Statistics.Basic.Bytes == 0 {
			t.Errorf("%s: the job's class counted none of its IPv6 packets: %+v", dev, c)
		}
	}
	// Policy: an IPv6 deny rule, counted.
	if err := f.SetPolicy(&policy.Policy{Rules: []policy.Rule{{Name: "no-peer", Action: policy.Deny, Proto: policy.ProtoUDP,
		To: []netip.Prefix{netip.MustParsePrefix("2001:db8:ff::2/128")}}}}); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
	if seen, _ := udpRoundTrip(netip.AddrPortFrom(shared6, 40004), 300*time.Millisecond); seen.IsValid() {
		t.Errorf("denied UDP reached the peer from %v", seen)
	}
	if d, err := f.policyDrops(); err != nil || d["no-peer"] != 1 || d[policy.RuleFloor] != 1 {
		t.Errorf("PolicyDrops: %v %v, want no-peer: 1 and %s: 1 (64:ff9b::127.0.0.1)", d, err, policy.RuleFloor)
	}
	if out := nftList(t); out != "" {
		for _, want := range []string{"ip6 saddr fd00:a1::2 jump limits_100.64.0.2", "snat ip6 to 2001:db8:77::3", "jump floor6"} {
			if !strings.Contains(out, want) {
				t.Errorf("nft list table lacks %q", want)
			}
		}
	}
	f.RemoveJob(idOf(own))
	f.RemoveJob(idOf(shared))
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if v, _ := readSysctl(v6Family.forwarding); v != "0" {
		t.Errorf("IPv6 forwarding after Close: %s, want 0", v)
	}
}

// TestCheckPrefix6 checks the host-side check of --egress-prefix: quiet
// when nothing else claims the prefix, a sentence with the fix when it is
// on-link on another interface.
func TestCheckPrefix6(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "0")
	prefix := netip.MustParsePrefix("2001:db8:77::/96")
	if got := CheckPrefix6(prefix, DefaultName); len(got) != 0 {
		t.Errorf("clean host: %q, want nothing", got)
	}
	addAddr(t, mustLink(t, "outside0"), "2001:db8:77::1/64")
	got := CheckPrefix6(prefix, DefaultName)
	if len(got) != 1 || !strings.Contains(got[0], "on-link on outside0") || !strings.Contains(got[0], "ip -6 route add 2001:db8:77::/96 via") || !strings.Contains(got[0], "proxy_ndp") {
		t.Errorf("prefix on-link on outside0: %q, want one sentence naming the link and both fixes", got)
	}
	other := netip.MustParsePrefix("2001:db8:78::/96")
	_, dst, _ := net.ParseCIDR(other.String())
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: mustLink(t, "lo").Attrs().Index, Dst: dst, Type: unix.RTN_LOCAL, Table: unix.RT_TABLE_LOCAL}); err != nil {
		t.Fatal(err)
	}
	if got := CheckPrefix6(other, DefaultName); len(got) != 1 || !strings.Contains(got[0], "ip -6 route del local 2001:db8:78::/96 dev lo") {
		t.Errorf("prefix with a local route: %q, want the fix that removes it", got)
	}
}

// TestStaleTable6: a gateway killed with SIGKILL left IPv6 forwarding on
// and its table with the value from before; the next gateway restores
// that value at Close, not the 1 it found.
func TestStaleTable6(t *testing.T) {
	if !inFreshNetns(t) {
		return
	}
	setupNetns(t, "1")
	if err := writeSysctl(v6Family.forwarding, "1"); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tb := c.AddTable(table())
	state := chainsOf(tb).state
	c.AddChain(state)
	for _, tag := range [][]byte{stateTag(v4Family.stateTag, "0"), stateTag(v6Family.stateTag, "0")} {
		c.AddRule(&nftables.Rule{Table: tb, Chain: state, Exprs: []expr.Any{&expr.Counter{}}, UserData: tag})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	f := newTestForwarder(t, func(c *Config) { c.Addrs = append(c.Addrs, netip.MustParsePrefix("fd00:a1::1/64")) })
	if v, _ := readSysctl(v6Family.forwarding); v != "1" {
		t.Errorf("IPv6 forwarding after New: %s, want 1", v)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if v, _ := readSysctl(v6Family.forwarding); v != "0" {
		t.Errorf("IPv6 forwarding after Close: %s, want 0 (the value before the killed run)", v)
	}
}
