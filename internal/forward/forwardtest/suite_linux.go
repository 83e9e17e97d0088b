// SPDX-License-Identifier: MIT

package forwardtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Tunnels are the gateway's tunnel addresses with their subnets' lengths
// in the suite, one per family.
var Tunnels = []netip.Prefix{netip.MustParsePrefix("100.64.0.1/16"), netip.MustParsePrefix("fd00:a10c::1/64")}

// BlockSize is the size of every job's port block in the suite.
const BlockSize = 8

// UDPIdle is the UDP idle timeout the suite asks backends for.
const UDPIdle = 2 * time.Second

// Env is what the suite gives a backend's constructor.
type Env struct {
	Logger *slog.Logger
	// Tunnels are the gateway's tunnel addresses with the subnets'
	// lengths, one per family.
	Tunnels []netip.Prefix
	// Egress are the gateway's public addresses (on EgressLink), one per
	// family.
	Egress []netip.Addr
	// OwnPrefix is the routed prefix of jobs' own public IPv6 addresses
	// (a kernel-mode backend's Config.OwnPrefix; a user-mode test gives
	// it a local route).
	OwnPrefix netip.Prefix
	// DNS is the upstream resolver jobs' queries go to.
	DNS netip.AddrPort
	// Flows is the flow table the backend reports to.
	Flows *flows.Table
	// UDPIdle is the idle timeout of UDP flows.
	UDPIdle time.Duration
	// BlockSize is the size of every job's port block.
	BlockSize int
	// MTU is the tunnel MTU.
	MTU int
}

// Options describe the backend under test.
type Options struct {
	// New makes the backend in env, inside the Isolate'd test's network
	// namespace (the gateway's); the suite closes it.
	New func(t *testing.T, env Env) forward.Backend
	// IPBytes says the backend's flow records count IP bytes, headers
	// included (kernel mode: conntrack), not the flows' payload bytes.
	IPBytes bool
}

// side is the outside's addresses of one family: the gateway's public
// address, the peer's, and the peer's in a protected range.
type side struct{ egress, peer, private netip.Addr }

var sides = [ipfamily.N]side{{EgressAddr, PeerAddr, PrivatePeerAddr}, {EgressAddr6, PeerAddr6, PrivatePeerAddr6}}

// suite is one Run: the backend, the job side and the outside.
type suite struct {
	o       Options
	b       forward.Backend
	env     Env
	subnets []netip.Prefix // env.Tunnels, masked
	jobs    *jobNet
	out     *Outside
	peers   *peers
	mu      sync.Mutex
	nextJob int
}

// Run runs the conformance suite against the backend that o.New makes. The
// calling test must be Isolate'd. Subtests share one backend; each adds
// the jobs it needs. Every data-plane subtest runs once per address family
// (subtests IPv4 and IPv6), with jobs that have an address of each.
func Run(t *testing.T, o Options) {
	checkGoroutines(t)
	out := NewOutside(t)
	s := &suite{o: o, out: out}
	s.peers = startPeers(t, out)
	s.env = Env{
		Logger:    slog.New(slog.DiscardHandler),
		Tunnels:   Tunnels,
		Egress:    []netip.Addr{EgressAddr, EgressAddr6},
		OwnPrefix: OwnPrefix,
		DNS:       netip.AddrPortFrom(PeerAddr, dnsPort),
		Flows:     flows.New(flows.Config{}),
		UDPIdle:   UDPIdle,
		BlockSize: BlockSize,
		MTU:       1420,
	}
	for _, p := range Tunnels {
		s.subnets = append(s.subnets, p.Masked())
	}
	s.b = o.New(t, s.env)
	s.jobs = newJobNet(s.b, s.env.MTU, s.b.Queues())
	t.Cleanup(func() {
		s.b.Close()
		s.jobs.close()
	})
	perFamily := func(fn func(*testing.T, *ipfamily.Family)) func(*testing.T) {
		return func(t *testing.T) {
			for _, f := range ipfamily.All {
				t.Run(f.Name, func(t *testing.T) { fn(t, f) })
			}
		}
	}
	tests := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"TCP", perFamily(s.testTCP)},
		{"TCPRefused", perFamily(s.testTCPRefused)},
		{"UDP", perFamily(s.testUDP)},
		{"UDPIdle", perFamily(s.testUDPIdle)},
		{"Ping", perFamily(s.testPing)},
		{"DNS", perFamily(s.testDNS)},
		{"BlockExhausted", perFamily(s.testBlockExhausted)},
		{"Floor", s.testFloor},
		{"Rules", perFamily(s.testRules)},
		{"Limits", perFamily(s.testLimits)},
		{"LimitsAcrossFamilies", s.testLimitsAcrossFamilies},
		{"DNSLimitsAcrossFamilies", s.testDNSLimitsAcrossFamilies},
		{"Bandwidth", perFamily(s.testBandwidth)},
		{"Exposures", s.testExposures},
		{"OwnAddress", s.testOwnAddress},
		{"Accounting", perFamily(s.testAccounting)},
		{"AddJobRollback", s.testAddJobRollback},
		{"Isolation", perFamily(s.testIsolation)},
		{"JobIdentity", s.testJobIdentity},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

// job adds a new job (the next free tunnel addresses and port block, with
// spec's other fields) and its stack; RemoveJob in t.Cleanup.
func (s *suite) job(t *testing.T, spec forward.Job) (*JobStack, forward.Job) {
	t.Helper()
	spec = s.nextSpec(spec)
	if err := s.b.AddJob(spec); err != nil {
		t.Fatalf("AddJob %s %v: %v", spec.ID, spec.Addrs, err)
	}
	st := s.jobs.addJob(t, s.env.Tunnels, spec.Addrs)
	t.Cleanup(func() { s.b.RemoveJob(spec.ID) })
	return st, spec
}

// nextSpec fills in a fresh ID, an address of each family and the egress
// entries: IPv4 from the backend's configured address (the unspecified
// address), IPv6 from EgressAddr6 named; both with the same port block.
func (s *suite) nextSpec(spec forward.Job) forward.Job {
	s.mu.Lock()
	i := s.nextJob
	s.nextJob++
	s.mu.Unlock()
	spec.ID = jobs.ID(fmt.Sprintf("lease-%d", i))
	spec.Addrs = []netip.Addr{
		netip.AddrFrom4([4]byte{100, 64, 1, byte(10 + i)}),
		netip.AddrFrom16([16]byte{0xfd, 0x00, 0xa1, 0x0c, 13: 1, 15: byte(10 + i)}),
	}
	lo := uint16(40000 + BlockSize*i)
	block := portblock.Range{Lo: lo, Hi: lo + BlockSize - 1}
	spec.Egress = []forward.Egress{{Addr: netip.IPv4Unspecified(), Block: block}, {Addr: EgressAddr6, Block: block}}
	spec.Ref = jobs.Ref{JobID: fmt.Sprintf("job-%d", i), Token: spec.Ref.Token}
	return spec
}

// addrOf returns j's tunnel address of family f (zero: none).
func addrOf(j forward.Job, f *ipfamily.Family) netip.Addr {
	a, _ := j.AddrOf(f)
	return a
}

// blockOf returns j's port block of family f.
func blockOf(j forward.Job, f *ipfamily.Family) portblock.Range {
	e, _ := j.EgressOf(f)
	return e.Block
}

// peer is the outside peer's address of family f, port port.
func peer(f *ipfamily.Family, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(sides[f.Index].peer, port)
}

// tunnel is the gateway's tunnel address of family f.
func (s *suite) tunnel(f *ipfamily.Family) netip.Addr {
	for _, p := range s.env.Tunnels {
		if f.Contains(p.Addr()) {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// inBlock fails t unless every source in srcs is egress:port in block.
func inBlock(t *testing.T, what string, srcs []netip.AddrPort, egress netip.Addr, b portblock.Range) {
	t.Helper()
	if len(srcs) == 0 {
		t.Errorf("%s: the peer saw no source", what)
	}
	for _, a := range srcs {
		if a.Addr().Unmap() != egress || a.Port() < b.Lo || a.Port() > b.Hi {
			t.Errorf("%s: source %s, want %s port %d-%d", what, a, egress, b.Lo, b.Hi)
		}
	}
}

// newSources returns the sources recorded after the first n.
func newSources(all []netip.AddrPort, n int) []netip.AddrPort { return all[n:] }

// testTCP: bytes both ways, the job's half-close carried to the outside
// and the outside's back, source ports from the job's block of the family.
func (s *suite) testTCP(t *testing.T, f *ipfamily.Family) {
	j, spec := s.job(t, forward.Job{})
	before := len(s.peers.tcpSources())
	var wg sync.WaitGroup
	const conns = 3
	errs := make(chan error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- echoTCP(ctxT(t, 15*time.Second), j, peer(f, echoPort), 200<<10+i)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	inBlock(t, "tcp", newSources(s.peers.tcpSources(), before), sides[f.Index].egress, blockOf(spec, f))

	// The outside half-closes first; the job still sends after its EOF.
	heard := len(s.peers.heardCounts())
	c, err := j.DialTCP(ctxT(t, 10*time.Second), peer(f, speakPort))
	if err != nil {
		t.Fatalf("dial %s: %v", peer(f, speakPort), err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || len(got) != speakLen {
		t.Fatalf("read until the outside's half-close: %d bytes, %v; want %d and EOF", len(got), err, speakLen)
	}
	const reply = 32 << 10
	if _, err := c.Write(make([]byte, reply)); err != nil {
		t.Fatalf("write after the outside's half-close: %v", err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(s.peers.heardCounts()) == heard && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if h := s.peers.heardCounts()[heard:]; len(h) != 1 || h[0] != reply {
		t.Errorf("the outside received %v after its half-close, want [%d]", h, reply)
	}
}

// echoTCP sends n bytes to the echo server at dst, half-closes, and
// expects the same bytes back followed by the server's EOF.
func echoTCP(ctx context.Context, j *JobStack, dst netip.AddrPort, n int) error {
	c, err := j.DialTCP(ctx, dst)
	if err != nil {
		return fmt.Errorf("dial %s: %w", dst, err)
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		c.SetDeadline(d)
	}
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i * 7)
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("read echo after %d bytes: %w", len(got), err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("write: %w", err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("echo: got %d bytes, want the %d sent", len(got), n)
	}
	return nil
}

func isRefused(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "refused") || strings.Contains(err.Error(), "reset"))
}

// refusedFast dials dst and expects "connection refused" within 3 s.
func refusedFast(t *testing.T, j *JobStack, dst netip.AddrPort) {
	t.Helper()
	start := time.Now()
	c, err := j.DialTCP(ctxT(t, 3*time.Second), dst)
	if err == nil {
		c.Close()
		t.Errorf("dial %s: connected, want refused", dst)
		return
	}
	if !isRefused(err) {
		t.Errorf("dial %s: %v after %v, want connection refused at once", dst, err, time.Since(start).Round(time.Millisecond))
	}
}

func (s *suite) testTCPRefused(t *testing.T, f *ipfamily.Family) {
	j, _ := s.job(t, forward.Job{})
	refusedFast(t, j, peer(f, closedPort))
}

// echoUDP sends count datagrams of size n from c and expects each back.
func echoUDP(c net.Conn, count, n int) error {
	buf := make([]byte, 65536)
	for i := range count {
		msg := bytes.Repeat([]byte{byte('a' + i%26)}, n)
		var got int
		var err error
		for try := 0; try < 5; try++ { // UDP: a first datagram may race the flow's setup
			if _, err = c.Write(msg); err != nil {
				return fmt.Errorf("udp write: %w", err)
			}
			c.SetReadDeadline(time.Now().Add(time.Second))
			if got, err = c.Read(buf); err == nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("udp datagram %d: no echo: %w", i, err)
		}
		if !bytes.Equal(buf[:got], msg) {
			return fmt.Errorf("udp datagram %d: echo %d bytes, want %d", i, got, n)
		}
	}
	return nil
}

func (s *suite) testUDP(t *testing.T, f *ipfamily.Family) {
	j, spec := s.job(t, forward.Job{})
	before := len(s.peers.udpSources())
	for i := range 3 {
		c, err := j.DialUDP(peer(f, echoPort))
		if err != nil {
			t.Fatal(err)
		}
		if err := echoUDP(c, 3, 100+i*500); err != nil {
			t.Error(err)
		}
		c.Close()
	}
	inBlock(t, "udp", newSources(s.peers.udpSources(), before), sides[f.Index].egress, blockOf(spec, f))
}

// waitRecent waits up to d for an ended flow of job (a flows.Filter's
// Job: an address of a live job, or its ID) matching match in the flow
// table's recent records.
func (s *suite) waitRecent(job string, d time.Duration, match func(flows.Record) bool) (flows.Record, bool) {
	deadline := time.Now().Add(d)
	for {
		for _, r := range s.env.Flows.Recent(flows.Filter{Job: job}) {
			if match(r) {
				return r, true
			}
		}
		if time.Now().After(deadline) {
			return flows.Record{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *suite) testUDPIdle(t *testing.T, f *ipfamily.Family) {
	j, _ := s.job(t, forward.Job{})
	c, err := j.DialUDP(peer(f, echoPort))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := echoUDP(c, 1, 10); err != nil {
		t.Fatal(err)
	}
	src := c.LocalAddr().String()
	r, ok := s.waitRecent(j.Addr(f).String(), UDPIdle+4*time.Second, func(r flows.Record) bool {
		return r.Proto == "udp" && r.Src == src && r.Verdict == flows.Allowed
	})
	if !ok {
		t.Fatalf("udp flow %s: not ended %v after its last datagram (idle timeout %v); active: %+v", src, UDPIdle+4*time.Second, UDPIdle, s.env.Flows.Active(flows.Filter{Job: j.Addr(f).String()}))
	}
	t.Logf("ended: %s after %v", r.EndReason, r.End.Sub(r.LastSeen).Round(100*time.Millisecond))
	// A new datagram after expiry opens a new flow that works.
	if err := echoUDP(c, 1, 10); err != nil {
		t.Errorf("after expiry: %v", err)
	}
}

func (s *suite) testPing(t *testing.T, f *ipfamily.Family) {
	j, _ := s.job(t, forward.Job{})
	if err := j.Ping(sides[f.Index].peer, []byte("airlock suite"), 3*time.Second); err != nil {
		t.Error(err)
	}
	if err := j.Ping(s.tunnel(f), []byte("gateway"), 3*time.Second); err != nil {
		t.Errorf("gateway tunnel address: %v", err)
	}
}

// testDNS: the gateway's resolver at its tunnel address of the family,
// over UDP and TCP.
func (s *suite) testDNS(t *testing.T, f *ipfamily.Family) {
	j, _ := s.job(t, forward.Job{})
	c, err := j.DialUDP(netip.AddrPortFrom(s.tunnel(f), 53))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := lookupA(c, DNSName, DNSAnswer); err != nil {
		t.Errorf("udp: %v", err)
	}
	tc, err := j.DialTCP(ctxT(t, 5*time.Second), netip.AddrPortFrom(s.tunnel(f), 53))
	if err != nil {
		t.Fatalf("dns over tcp: %v", err)
	}
	defer tc.Close()
	if err := lookupA(tc, DNSName, DNSAnswer); err != nil {
		t.Errorf("tcp: %v", err)
	}
}

func (s *suite) testBlockExhausted(t *testing.T, f *ipfamily.Family) {
	j, _ := s.job(t, forward.Job{})
	ctx := ctxT(t, 10*time.Second)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range BlockSize {
		c, err := j.DialTCP(ctx, peer(f, echoPort))
		if err != nil {
			t.Fatalf("connection %d of a block of %d: %v", i+1, BlockSize, err)
		}
		held = append(held, c)
	}
	before, _ := s.b.Stats()
	refusedFast(t, j, peer(f, echoPort))
	after, err := s.b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if after.BlockRefusals <= before.BlockRefusals {
		t.Errorf("BlockRefusals: %d before, %d after, want more", before.BlockRefusals, after.BlockRefusals)
	}
	// The block is full towards one destination only (ports are shared
	// across destinations; a closed port stays in TIME_WAIT).
	if err := echoTCP(ctx, j, peer(f, sinkPort), 100); err != nil {
		t.Errorf("another destination with the block full towards %s: %v", peer(f, echoPort), err)
	}
}

// drops returns the backend's policy drop counts.
func (s *suite) drops(t *testing.T) map[string]uint64 {
	t.Helper()
	st, err := s.b.Stats()
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st.PolicyDrops
}

// waitDrop waits up to 2 s for rule's drop count to exceed before.
func (s *suite) waitDrop(t *testing.T, rule string, before uint64) bool {
	deadline := time.Now().Add(2 * time.Second)
	for {
		if s.drops(t)[rule] > before {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// expectDenied sends a new flow (TCP, or UDP for destinations TCP cannot
// reach) from j to dst and expects it denied by rule: a TCP connection
// refused at once, the rule's drop count grown.
func (s *suite) expectDenied(t *testing.T, j *JobStack, proto string, dst netip.AddrPort, rule string) {
	t.Helper()
	before := s.drops(t)[rule]
	switch {
	case proto == "tcp":
		refusedFast(t, j, dst)
	case proto == "icmp":
		if err := j.Ping(dst.Addr(), []byte("denied?"), 500*time.Millisecond); err == nil {
			t.Errorf("ping %s: answered, want dropped", dst.Addr())
		}
	case proto == "udp":
		c, err := j.DialUDP(dst)
		if err != nil {
			t.Errorf("udp to %s: %v", dst, err)
			return
		}
		c.Write([]byte("denied?"))
		c.Close()
	}
	if !s.waitDrop(t, rule, before) {
		t.Errorf("%s to %s: drop count of %q did not grow (drops %v)", proto, dst, rule, s.drops(t))
	}
}

// floorCase is one destination of the built-in table and the rule that
// must deny it.
type floorCase struct {
	dst   netip.Addr
	proto string
	rule  string
}

// floorCases derives the cases from policy.Ranges: an address inside each
// protected range (and the tunnel subnets, the gateway's own public
// addresses), with the rule policy.Builtin names for it, plus the
// addresses that embed a protected IPv4 address.
func (s *suite) floorCases() []floorCase {
	var out []floorCase
	add := func(a netip.Addr, host bool) {
		rule, _ := policy.Builtin(a, s.subnets, host)
		if rule == "" {
			return
		}
		// A job's kernel never sends loopback or broadcast
		// destinations into the tunnel (gVisor's job stack refuses
		// to, as martians or without SO_BROADCAST).
		// Nor the unspecified address (connect(::) is local).
		if a.Unmap().IsLoopback() || a.IsUnspecified() || a == netip.MustParseAddr("255.255.255.255") {
			return
		}
		proto := "tcp"
		if a.IsMulticast() {
			proto = "udp"
		}
		out = append(out, floorCase{a, proto, rule})
	}
	for _, r := range policy.Ranges() {
		if r.Rule == "" {
			continue
		}
		a := r.Prefix.Addr()
		if r.Prefix.Bits() < r.Prefix.Addr().BitLen() {
			a = a.Next()
		}
		if a.Is6() && a.IsMulticast() {
			// gVisor's IPv6 (the job's and user mode's) drops
			// multicast it has not joined before any forwarder sees
			// it; a job's kernel would send it, unjudged here.
			continue
		}
		add(a, false)
	}
	// The tunnel subnets (another job), the gateway's own public
	// addresses, shared address space outside the tunnel subnet, NAT64
	// discovery.
	add(netip.MustParseAddr("100.64.7.7"), false)
	add(netip.MustParseAddr("fd00:a10c::7:7"), false)
	add(netip.MustParseAddr("100.100.0.10"), false)
	add(netip.MustParseAddr("192.0.0.170"), false)
	add(EgressAddr, true)
	add(EgressAddr6, true)
	// IPv4-embedding IPv6 forms of protected IPv4 addresses.
	for _, s := range []string{
		"::ffff:0.1.2.3", "::ffff:10.1.2.3", "64:ff9b::a9fe:a9fe", "64:ff9b::a00:1",
		"64:ff9b:1::c0a8:101", "2002:a00:1::1", "2002:1:2::1", "::10.1.2.3",
		"2001:0:a00:1::1", "64:ff9b::6440:707",
	} {
		add(netip.MustParseAddr(s), false)
	}
	return out
}

// testFloor: every row of the built-in table, of both families, from a
// job with an address of each.
func (s *suite) testFloor(t *testing.T) {
	j, _ := s.job(t, forward.Job{})
	for _, c := range s.floorCases() {
		t.Run(c.dst.String(), func(t *testing.T) {
			s.expectDenied(t, j, c.proto, netip.AddrPortFrom(c.dst, 80), c.rule)
		})
	}
}

func mustPolicy(t *testing.T, p *policy.Policy) *policy.Policy {
	t.Helper()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *suite) setPolicy(t *testing.T, p *policy.Policy) {
	t.Helper()
	if err := s.b.SetPolicy(mustPolicy(t, p)); err != nil {
		t.Fatalf("SetPolicy: %v", err)
	}
}

// hostPrefix is the prefix of a alone.
func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// Per family: an address the floor closes (0.0.0.0/8 and its NAT64
// form), and one in a protected range (RFC 1918, unique local).
var (
	floorAddr   = [ipfamily.N]netip.Addr{netip.MustParseAddr("0.1.2.3"), netip.MustParseAddr("64:ff9b::1:203")}
	privateAddr = [ipfamily.N]netip.Addr{netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("fd12::3")}
)

// testRules: rules by token, protocol and port, over the family's
// addresses; the floor stays closed under an allow of everything.
func (s *suite) testRules(t *testing.T, f *ipfamily.Family) {
	blue, _ := s.job(t, forward.Job{Ref: jobs.Ref{Token: "blue"}})
	plain, _ := s.job(t, forward.Job{})
	at := sides[f.Index]
	private := hostPrefix(at.private)
	s.setPolicy(t, &policy.Policy{Default: policy.Allow, Rules: []policy.Rule{
		{Name: "no-echo-udp", Action: policy.Deny, To: []netip.Prefix{hostPrefix(at.peer)}, Proto: policy.ProtoUDP, Ports: []portblock.Range{{Lo: echoPort, Hi: echoPort}}},
		{Name: "no-ping-private", Action: policy.Deny, To: []netip.Prefix{private}, Proto: policy.ProtoICMP},
		{Name: "blue-private", Action: policy.Allow, To: []netip.Prefix{private, hostPrefix(PrivatePeerAddr)}, Tokens: []string{"blue"}},
		{Name: "no-discard", Action: policy.Deny, To: []netip.Prefix{hostPrefix(at.peer)}, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: closedPort, Hi: closedPort}}},
	}})
	t.Cleanup(func() { s.b.SetPolicy(&policy.Policy{}) })
	ctx := ctxT(t, 10*time.Second)

	// An allow rule scoped to a token opens a protected range for that
	// token only.
	if err := echoTCP(ctx, blue, netip.AddrPortFrom(at.private, echoPort), 1000); err != nil {
		t.Errorf("token blue to %s: %v", at.private, err)
	}
	s.expectDenied(t, plain, "tcp", netip.AddrPortFrom(at.private, echoPort), policy.RulePrivate)
	if f == ipfamily.V6 {
		// An IPv4 allow rule does not open the address's NAT64 form.
		nat64 := netip.AddrFrom16([16]byte{0, 0x64, 0xff, 0x9b, 12: 10, 13: 99, 14: 0, 15: 2})
		s.expectDenied(t, blue, "tcp", netip.AddrPortFrom(nat64, echoPort), policy.RulePrivate)
	}
	// Deny rules by protocol and port, counted by name.
	s.expectDenied(t, plain, "tcp", peer(f, closedPort), "no-discard")
	s.expectDenied(t, plain, "udp", peer(f, echoPort), "no-echo-udp")
	// ICMP echo: by rule, and by the built-in protection of a range.
	s.expectDenied(t, blue, "icmp", netip.AddrPortFrom(at.private, 0), "no-ping-private")
	s.expectDenied(t, plain, "icmp", netip.AddrPortFrom(privateAddr[f.Index], 0), policy.RulePrivate)
	if err := plain.Ping(at.peer, []byte("allowed"), 3*time.Second); err != nil {
		t.Errorf("ping %s, allowed by default: %v", at.peer, err)
	}
	if err := echoTCP(ctx, plain, peer(f, echoPort), 1000); err != nil {
		t.Errorf("tcp echo, allowed by default: %v", err)
	}
	// The floor stays closed whatever the rules.
	s.setPolicy(t, &policy.Policy{Default: policy.Allow, Rules: []policy.Rule{
		{Name: "open-all", Action: policy.Allow, To: []netip.Prefix{f.All}},
	}})
	s.expectDenied(t, plain, "tcp", netip.AddrPortFrom(floorAddr[f.Index], 80), policy.RuleFloor)
	// Default deny, with one allow.
	s.setPolicy(t, &policy.Policy{Default: policy.Deny, Rules: []policy.Rule{
		{Name: "echo-only", Action: policy.Allow, To: []netip.Prefix{hostPrefix(at.peer)}, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: echoPort, Hi: echoPort}}},
	}})
	if err := echoTCP(ctx, plain, peer(f, echoPort), 1000); err != nil {
		t.Errorf("default deny, allowed echo: %v", err)
	}
	s.expectDenied(t, plain, "tcp", peer(f, sinkPort), policy.RuleDefault)
	// The old counts survive SetPolicy.
	if d := s.drops(t); d["no-discard"] == 0 || d["no-echo-udp"] == 0 {
		t.Errorf("drop counts after SetPolicy: %v, want the replaced rules' counts kept", d)
	}
}

// refusedCount expects a dial from j to dst refused at once, and the
// backend's count that what reads grown.
func (s *suite) refusedCount(t *testing.T, j *JobStack, dst netip.AddrPort, name string, what func(forward.Stats) uint64) {
	t.Helper()
	before, _ := s.b.Stats()
	refusedFast(t, j, dst)
	after, err := s.b.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if what(after) <= what(before) {
		t.Errorf("%s: %d before, %d after, want more", name, what(before), what(after))
	}
}

func flowsRefused(st forward.Stats) uint64 { return st.Limits.FlowsRefused }

func (s *suite) testLimits(t *testing.T, f *ipfamily.Family) {
	j, spec := s.job(t, forward.Job{Limits: limits.Job{MaxFlows: 2}})
	ctx := ctxT(t, 10*time.Second)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := range 2 {
		c, err := j.DialTCP(ctx, peer(f, echoPort))
		if err != nil {
			t.Fatalf("flow %d of 2: %v", i+1, err)
		}
		held = append(held, c)
	}
	s.refusedCount(t, j, peer(f, echoPort), "FlowsRefused", flowsRefused)
	// Raised limits apply to new flows at once.
	if err := s.b.SetJobLimits(spec.ID, limits.Job{MaxFlows: 3}); err != nil {
		t.Fatalf("SetJobLimits: %v", err)
	}
	if c, err := j.DialTCP(ctx, peer(f, echoPort)); err != nil {
		t.Errorf("third flow under MaxFlows 3: %v", err)
	} else {
		held = append(held, c)
	}
	// New flows per second: one at once, the next refused.
	k, _ := s.job(t, forward.Job{Limits: limits.Job{NewFlowsPerSec: 0.2}})
	if c, err := k.DialTCP(ctx, peer(f, echoPort)); err != nil {
		t.Errorf("first flow under 0.2 new flows/s: %v", err)
	} else {
		held = append(held, c)
	}
	s.refusedCount(t, k, peer(f, echoPort), "RateRefused", func(st forward.Stats) uint64 { return st.Limits.RateRefused })
	if err := s.b.SetJobLimits("no-such-job", limits.Job{MaxFlows: 1}); !errors.Is(err, forward.ErrUnknownJob) {
		t.Errorf("SetJobLimits of an unknown job: %v, want ErrUnknownJob", err)
	}
}

// testLimitsAcrossFamilies: a job's limits count its flows of both
// families together: a job is one ID, not one address.
func (s *suite) testLimitsAcrossFamilies(t *testing.T) {
	j, _ := s.job(t, forward.Job{Limits: limits.Job{MaxFlows: 2}})
	ctx := ctxT(t, 10*time.Second)
	for _, f := range ipfamily.All {
		c, err := j.DialTCP(ctx, peer(f, echoPort))
		if err != nil {
			t.Fatalf("the job's %s flow, one of 2: %v", f, err)
		}
		defer c.Close()
	}
	for _, f := range ipfamily.All {
		s.refusedCount(t, j, peer(f, echoPort), "FlowsRefused ("+f.Name+", a third flow)", flowsRefused)
	}
}

// testDNSLimitsAcrossFamilies: a job's DNS budget is one for both
// families (each family's relay limited per source address, so a
// dual-stack job got its budget twice): at 0.2 queries per second, a
// burst of one, the query over IPv4 is answered and the next, over IPv6,
// refused.
func (s *suite) testDNSLimitsAcrossFamilies(t *testing.T) {
	j, _ := s.job(t, forward.Job{Limits: limits.Job{DNSQueriesPerSec: 0.2}})
	want := []int{dns.RcodeSuccess, dns.RcodeRefused}
	for i, f := range ipfamily.All {
		c, err := j.DialUDP(netip.AddrPortFrom(s.tunnel(f), 53))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		rc, err := queryRcode(c, DNSName)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if rc != want[i] {
			t.Errorf("query %d of the job, over %s: rcode %s, want %s", i+1, f, dns.RcodeToString[rc], dns.RcodeToString[want[i]])
		}
	}
}

// serveEcho echoes every TCP connection ln accepts, and every datagram
// uc reads, until they are closed.
func serveEcho(ln net.Listener, uc net.PacketConn) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	if uc == nil {
		return
	}
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := uc.ReadFrom(buf)
			if err != nil {
				return
			}
			uc.WriteTo(buf[:n], from)
		}
	}()
}

// listenEcho opens the job's echo servers on its address of family f:
// TCP on tcpPort, UDP on udpPort (0: none); closed in t.Cleanup.
func listenEcho(t *testing.T, j *JobStack, f *ipfamily.Family, tcpPort, udpPort uint16) {
	t.Helper()
	ln, err := j.ListenTCP(f, tcpPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var uc net.PacketConn
	if udpPort != 0 {
		u, err := j.ListenUDP(f, udpPort)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { u.Close() })
		uc = u
	}
	serveEcho(ln, uc)
}

// testExposures: one job with TCP and UDP exposures at the gateway's
// public address of each family; each reaches the job's address of its
// family, recorded as the job's inbound flow, until RemoveJob.
func (s *suite) testExposures(t *testing.T) {
	spec := s.nextSpec(forward.Job{})
	for _, f := range ipfamily.All {
		lo := blockOf(spec, f).Lo
		spec.Exposures = append(spec.Exposures,
			forward.Exposure{Proto: ipproto.TCP, JobPort: 8080, PublicPort: lo, PublicAddr: sides[f.Index].egress},
			forward.Exposure{Proto: ipproto.UDP, JobPort: 5353, PublicPort: lo + 1, PublicAddr: sides[f.Index].egress})
	}
	if err := s.b.AddJob(spec); err != nil {
		t.Fatalf("AddJob with exposures: %v", err)
	}
	t.Cleanup(func() { s.b.RemoveJob(spec.ID) })
	j := s.jobs.addJob(t, s.env.Tunnels, spec.Addrs)
	for _, f := range ipfamily.All {
		listenEcho(t, j, f, 8080, 5353)
	}
	public := func(f *ipfamily.Family, port uint16) netip.AddrPort {
		return netip.AddrPortFrom(sides[f.Index].egress, blockOf(spec, f).Lo+port)
	}
	for _, f := range ipfamily.All {
		t.Run(f.Name, func(t *testing.T) {
			var tcpErr, udpErr error
			err := s.out.Do(func() error {
				tcpErr = outsideEcho("tcp", public(f, 0))
				udpErr = outsideEcho("udp", public(f, 1))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if tcpErr != nil {
				t.Errorf("tcp exposure: %v", tcpErr)
			}
			if udpErr != nil {
				t.Errorf("udp exposure: %v", udpErr)
			}
			// The inbound flows are recorded as the job's.
			for _, port := range []uint16{8080, 5353} {
				dst := netip.AddrPortFrom(addrOf(spec, f), port).String()
				deadline := time.Now().Add(4 * time.Second)
				for !s.hasFlow(addrOf(spec, f).String(), func(r flows.Record) bool {
					return r.Direction == flows.Inbound && r.Dst == dst && r.Lease == spec.ID
				}) {
					if time.Now().After(deadline) {
						t.Errorf("no inbound flow of %s to %s in the flow table", spec.ID, dst)
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	// After RemoveJob nothing listens.
	s.b.RemoveJob(spec.ID)
	for _, f := range ipfamily.All {
		var tcpErr error
		if err := s.out.Do(func() error { tcpErr = outsideEcho("tcp", public(f, 0)); return nil }); err != nil {
			t.Fatal(err)
		}
		if tcpErr == nil {
			t.Errorf("tcp exposure at %s after RemoveJob: still reaches the job", public(f, 0))
		}
	}
}

// testOwnAddress: a job whose IPv6 egress entry is its own public address
// (in OwnPrefix, --egress-prefix): its flows leave from that address, and
// an exposure there listens at the job's port.
func (s *suite) testOwnAddress(t *testing.T) {
	spec := s.nextSpec(forward.Job{})
	own := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 0, 0x77, 15: addrOf(spec, ipfamily.V4).As4()[3]})
	if !OwnPrefix.Contains(own) {
		t.Fatalf("own address %v outside %v", own, OwnPrefix)
	}
	spec.Egress[1] = forward.Egress{Addr: own, Own: true}
	spec.Exposures = []forward.Exposure{{Proto: ipproto.TCP, JobPort: 8081, PublicPort: 8081, PublicAddr: own}}
	if err := s.b.AddJob(spec); err != nil {
		t.Fatalf("AddJob with an own IPv6 address: %v", err)
	}
	t.Cleanup(func() { s.b.RemoveJob(spec.ID) })
	j := s.jobs.addJob(t, s.env.Tunnels, spec.Addrs)
	listenEcho(t, j, ipfamily.V6, 8081, 0)

	before := len(s.peers.tcpSources())
	if err := echoTCP(ctxT(t, 10*time.Second), j, peer(ipfamily.V6, echoPort), 10000); err != nil {
		t.Fatalf("tcp from the own address: %v", err)
	}
	for _, src := range newSources(s.peers.tcpSources(), before) {
		if src.Addr() != own {
			t.Errorf("the peer saw source %s, want the job's own address %s", src, own)
		}
	}
	// IPv4 still leaves from the gateway's shared address and block.
	before = len(s.peers.tcpSources())
	if err := echoTCP(ctxT(t, 10*time.Second), j, peer(ipfamily.V4, echoPort), 1000); err != nil {
		t.Fatalf("tcp over IPv4: %v", err)
	}
	inBlock(t, "tcp over IPv4", newSources(s.peers.tcpSources(), before), EgressAddr, blockOf(spec, ipfamily.V4))
	var err error
	if oerr := s.out.Do(func() error { err = outsideEcho("tcp", netip.AddrPortFrom(own, 8081)); return nil }); oerr != nil {
		t.Fatal(oerr)
	}
	if err != nil {
		t.Errorf("exposure at the own address [%s]:8081: %v", own, err)
	}
}

// outsideEcho connects from the outside to addr and expects an echo;
// call it inside Outside.Do (the dial must start there).
func outsideEcho(network string, addr netip.AddrPort) error {
	c, err := net.DialTimeout(network, addr.String(), 3*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	msg := []byte("hello from outside")
	if tc, ok := c.(*net.TCPConn); ok {
		// Half-close: the job's echo sees EOF, closes, and that
		// reaches the outside as EOF after the echo.
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := tc.Write(msg); err != nil {
			return err
		}
		if err := tc.CloseWrite(); err != nil {
			return err
		}
		got, err := io.ReadAll(tc)
		if err != nil {
			return fmt.Errorf("read echo until EOF: %w", err)
		}
		if !bytes.Equal(got, msg) {
			return fmt.Errorf("echo %q, want %q", got, msg)
		}
		return nil
	}
	buf := make([]byte, 100)
	for try := 0; try < 3; try++ {
		if _, err := c.Write(msg); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(time.Second))
		var n int
		if n, err = c.Read(buf); err == nil {
			if !bytes.Equal(buf[:n], msg) {
				return fmt.Errorf("echo %q, want %q", buf[:n], msg)
			}
			return nil
		}
	}
	return err
}

// udpHeaders and tcpHeaders are the IP and transport header bytes of a
// UDP datagram and the range of a TCP segment's, by family.
var (
	udpHeaders = [ipfamily.N]uint64{28, 48}
	tcpHeaders = [ipfamily.N][2]uint64{{40, 60}, {60, 80}}
)

func (s *suite) testAccounting(t *testing.T, f *ipfamily.Family) {
	j, _ := s.job(t, forward.Job{})
	// UDP: 5 datagrams of 300 bytes each way.
	c, err := j.DialUDP(peer(f, echoPort))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const count, size = 5, 300
	for i := range count {
		if _, err := c.Write(bytes.Repeat([]byte{'x'}, size)); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 2048)
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
	}
	src := c.LocalAddr().String()
	per := uint64(size)
	if s.o.IPBytes {
		per += udpHeaders[f.Index]
	}
	want := count * per
	s.waitFlow(t, j.Addr(f).String(), "udp", src, func(r flows.Record) bool {
		return r.BytesOut == want && r.BytesIn == want && r.PacketsOut == count && r.PacketsIn == count
	}, fmt.Sprintf("%d bytes and %d packets each way", want, count))

	// TCP: the stream's bytes each way (IP bytes: with the family's
	// headers per packet, options included).
	const n = 20000
	tc, err := j.DialTCP(ctxT(t, 5*time.Second), peer(f, echoPort))
	if err != nil {
		t.Fatal(err)
	}
	tsrc := tc.LocalAddr().String()
	tc.Write(bytes.Repeat([]byte{'y'}, n))
	tc.CloseWrite()
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := io.ReadAll(tc); err != nil || len(got) != n {
		t.Fatalf("tcp echo: %d bytes, %v", len(got), err)
	}
	tc.Close()
	exact := func(bytes, pkts uint64) bool {
		if !s.o.IPBytes {
			return bytes == n
		}
		h := tcpHeaders[f.Index]
		return bytes >= n+h[0]*pkts && bytes <= n+h[1]*pkts
	}
	s.waitFlow(t, j.Addr(f).String(), "tcp", tsrc, func(r flows.Record) bool {
		return exact(r.BytesOut, r.PacketsOut) && exact(r.BytesIn, r.PacketsIn)
	}, fmt.Sprintf("%d stream bytes each way", n))
}

// hasFlow reports whether job's flows (active or ended; job as for
// waitRecent) hold one that matches.
func (s *suite) hasFlow(job string, match func(flows.Record) bool) bool {
	fl := flows.Filter{Job: job}
	for _, r := range append(s.env.Flows.Active(fl), s.env.Flows.Recent(fl)...) {
		if match(r) {
			return true
		}
	}
	return false
}

// waitFlow waits up to 4 s for job's flow from src (active or ended; job
// as for waitRecent) to satisfy ok.
func (s *suite) waitFlow(t *testing.T, job string, proto, src string, ok func(flows.Record) bool, want string) {
	t.Helper()
	deadline := time.Now().Add(4 * time.Second)
	for {
		var seen []flows.Record
		fl := flows.Filter{Job: job}
		for _, r := range append(s.env.Flows.Active(fl), s.env.Flows.Recent(fl)...) {
			if r.Proto == proto && r.Src == src {
				if ok(r) {
					return
				}
				seen = append(seen, r)
			}
		}
		if time.Now().After(deadline) {
			t.Errorf("%s flow %s: want %s; records: %+v", proto, src, want, seen)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testAddJobRollback: an AddJob that fails on its last exposure leaves
// nothing of the job, the exposures of both families before it included.
func (s *suite) testAddJobRollback(t *testing.T) {
	// The last exposure's public port is taken on the gateway: AddJob
	// must fail and leave nothing of the job.
	spec := s.nextSpec(forward.Job{Limits: limits.Job{MaxFlows: 5}, Ref: jobs.Ref{Token: "blue"}})
	lo := blockOf(spec, ipfamily.V4).Lo
	taken, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(netip.AddrPortFrom(EgressAddr, lo+1)))
	if err != nil {
		t.Fatal(err)
	}
	spec.Exposures = []forward.Exposure{
		{Proto: ipproto.TCP, JobPort: 80, PublicPort: lo, PublicAddr: EgressAddr},
		{Proto: ipproto.TCP, JobPort: 80, PublicPort: blockOf(spec, ipfamily.V6).Lo, PublicAddr: EgressAddr6},
		{Proto: ipproto.TCP, JobPort: 81, PublicPort: lo + 1, PublicAddr: EgressAddr},
	}
	err = s.b.AddJob(spec)
	taken.Close()
	if err == nil {
		// Kernel mode: DNAT takes the port before the socket would.
		// A last exposure the backend cannot take at all instead.
		s.b.RemoveJob(spec.ID)
		spec.Exposures[2].Proto = ipproto.Proto(132) // sctp
		if err = s.b.AddJob(spec); err == nil {
			s.b.RemoveJob(spec.ID)
			t.Fatal("AddJob with an sctp exposure: accepted")
		}
	}
	j := s.jobs.addJob(t, s.env.Tunnels, spec.Addrs)
	for _, x := range spec.Exposures[:2] {
		at := netip.AddrPortFrom(x.PublicAddr, x.PublicPort)
		var dialErr error
		s.out.Do(func() error {
			c, err := net.DialTimeout("tcp", at.String(), time.Second)
			if err == nil {
				c.Close()
			}
			dialErr = err
			return nil
		})
		if dialErr == nil {
			t.Errorf("the exposure at %s of the failed AddJob still listens", at)
		}
	}
	if err := s.b.SetJobLimits(spec.ID, limits.Job{MaxFlows: 1}); !errors.Is(err, forward.ErrUnknownJob) {
		t.Errorf("SetJobLimits after the failed AddJob: %v, want ErrUnknownJob", err)
	}
	for _, a := range spec.Addrs {
		if id, ok := s.env.Flows.Index().Lookup(a); ok {
			t.Errorf("the job index still maps %s to %s after the failed AddJob", a, id)
		}
	}
	// The same job with free ports is added from scratch.
	spec.Exposures = spec.Exposures[:2]
	if err := s.b.AddJob(spec); err != nil {
		t.Fatalf("AddJob after the rollback: %v", err)
	}
	defer s.b.RemoveJob(spec.ID)
	for _, f := range ipfamily.All {
		if err := echoTCP(ctxT(t, 5*time.Second), j, peer(f, echoPort), 100); err != nil {
			t.Errorf("the job after the rollback, %s: %v", f, err)
		}
	}
}

// testIsolation: jobs cannot reach each other's addresses of the family;
// concurrent transfers each leave from their job's block; RemoveJob ends
// the job's flows and leaves the other's.
func (s *suite) testIsolation(t *testing.T, f *ipfamily.Family) {
	a, specA := s.job(t, forward.Job{})
	b, specB := s.job(t, forward.Job{})
	// Jobs cannot reach each other.
	s.expectDenied(t, a, "tcp", netip.AddrPortFrom(b.Addr(f), 22), policy.RuleFloor)
	// Concurrent transfers each leave from their own block.
	before := len(s.peers.tcpSources())
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, j := range []*JobStack{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- echoTCP(ctxT(t, 15*time.Second), j, peer(f, echoPort), 300<<10)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	srcs := newSources(s.peers.tcpSources(), before)
	var inA, inB int
	for _, src := range srcs {
		switch {
		case blockOf(specA, f).Contains(src.Port()):
			inA++
		case blockOf(specB, f).Contains(src.Port()):
			inB++
		default:
			t.Errorf("source %s in neither job's block", src)
		}
	}
	if inA != 2 || inB != 2 {
		t.Errorf("connections per block: %d and %d, want 2 and 2", inA, inB)
	}
	// Removing one job ends its open flows and leaves the other working.
	held, err := a.DialTCP(ctxT(t, 5*time.Second), peer(f, echoPort))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	heldSrc := held.LocalAddr().String()
	if _, err := held.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	// The flow is in the table before the job goes (kernel mode learns
	// of flows from conntrack once a second).
	s.waitFlow(t, a.Addr(f).String(), "tcp", heldSrc, func(flows.Record) bool { return true }, "the held flow")
	s.b.RemoveJob(specA.ID)
	// Gone from the index, the job's flows are found by its ID.
	s.waitFlow(t, string(specA.ID), "tcp", heldSrc, func(r flows.Record) bool { return r.EndReason == flows.EndJob }, "end reason "+flows.EndJob)
	if err := echoTCP(ctxT(t, 5*time.Second), b, peer(f, echoPort), 1000); err != nil {
		t.Errorf("job b after job a left: %v", err)
	}
}

// testJobIdentity: a job is its ID. Its addresses map to it in the
// backend's job index while it lives; an ID or an address taken by a
// live job is refused with ErrJobExists and changes nothing; a job with
// an address of one family only works over that family.
func (s *suite) testJobIdentity(t *testing.T) {
	j, spec := s.job(t, forward.Job{})
	index := s.env.Flows.Index()
	for _, a := range spec.Addrs {
		if id, ok := index.Lookup(a); !ok || id != spec.ID {
			t.Errorf("index: %s is %q (%v), want %s", a, id, ok, spec.ID)
		}
	}
	if err := s.b.AddJob(spec); !errors.Is(err, forward.ErrJobExists) {
		t.Errorf("AddJob of a live ID: %v, want ErrJobExists", err)
	}
	for _, f := range ipfamily.All {
		other := s.nextSpec(forward.Job{})
		other.Addrs = []netip.Addr{addrOf(spec, f)}
		e, _ := other.EgressOf(f)
		other.Egress = []forward.Egress{e}
		if err := s.b.AddJob(other); !errors.Is(err, forward.ErrJobExists) {
			if err == nil {
				s.b.RemoveJob(other.ID)
			}
			t.Errorf("AddJob of another ID with the live job's %s address: %v, want ErrJobExists", f, err)
		}
		if id, _ := index.Lookup(addrOf(spec, f)); id != spec.ID {
			t.Errorf("index after the refused AddJob: %s is %q, want %s", addrOf(spec, f), id, spec.ID)
		}
		if err := echoTCP(ctxT(t, 5*time.Second), j, peer(f, echoPort), 100); err != nil {
			t.Errorf("the live job after the refused AddJob, %s: %v", f, err)
		}
	}
	// Jobs of one family only.
	for _, f := range ipfamily.All {
		t.Run(f.Name+"Only", func(t *testing.T) {
			one := s.nextSpec(forward.Job{})
			one.Addrs = []netip.Addr{addrOf(one, f)}
			e, _ := one.EgressOf(f)
			one.Egress = []forward.Egress{e}
			if err := s.b.AddJob(one); err != nil {
				t.Fatalf("AddJob with %s only: %v", f, err)
			}
			defer s.b.RemoveJob(one.ID)
			k := s.jobs.addJob(t, s.env.Tunnels, one.Addrs)
			if err := echoTCP(ctxT(t, 5*time.Second), k, peer(f, echoPort), 1000); err != nil {
				t.Error(err)
			}
			if err := k.Ping(s.tunnel(f), []byte("gateway"), 3*time.Second); err != nil {
				t.Errorf("gateway tunnel address: %v", err)
			}
		})
	}
	s.b.RemoveJob(spec.ID)
	for _, a := range spec.Addrs {
		if id, ok := index.Lookup(a); ok {
			t.Errorf("index after RemoveJob: %s is still %s", a, id)
		}
	}
}

// testBandwidth: a job's egress limit and the global ingress limit each
// slow an echo of bwBytes to about bwBytes*8/bwRate seconds (1.05 s; both
// backends measured 0.98-1.09 s); the check allows 0.7 of that for the
// shapers' bursts. Load only makes it slower.
func (s *suite) testBandwidth(t *testing.T, f *ipfamily.Family) {
	const bwRate, bwBytes = 8_000_000, 1 << 20
	min := time.Duration(float64(bwBytes*8)/bwRate*0.7*1e9) * time.Nanosecond
	j, spec := s.job(t, forward.Job{Limits: limits.Job{EgressBitsPerSec: bwRate}})
	timed := func(what string) {
		t.Helper()
		start := time.Now()
		if err := echoTCP(ctxT(t, 15*time.Second), j, peer(f, echoPort), bwBytes); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		d := time.Since(start)
		t.Logf("%s: %d bytes echoed in %v", what, bwBytes, d.Round(time.Millisecond))
		if d < min {
			t.Errorf("%s: %d bytes echoed in %v, want at least %v at %d bit/s", what, bwBytes, d, min, bwRate)
		}
	}
	timed("job egress limit")
	if err := s.b.SetJobLimits(spec.ID, limits.Job{}); err != nil {
		t.Fatal(err)
	}
	if err := s.b.SetGlobalLimits(0, bwRate); err != nil {
		t.Fatalf("SetGlobalLimits: %v", err)
	}
	defer s.b.SetGlobalLimits(0, 0)
	timed("global ingress limit")
}

// checkGoroutines registers a cleanup, to run after all cleanups registered
// later (the backend's Close among them), that fails the test if the
// goroutine count does not return to its value now within 3 s.
func checkGoroutines(t *testing.T) {
	base := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				buf = buf[:runtime.Stack(buf, true)]
				t.Errorf("goroutines after Close: %d, want <= %d\n%s", runtime.NumGoroutine(), base, buf)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
}
