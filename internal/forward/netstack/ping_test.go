// SPDX-License-Identifier: MIT

package netstack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// fakePings is a Config.ListenPing that behaves like the kernel's ping
// sockets with every destination answering: each socket gets its own echo
// id, which replaces the request's, and every request comes back as a reply
// from its destination.
type fakePings struct {
	v6     bool // ICMPv6 sockets
	mu     sync.Mutex
	nextID uint16
	open   map[*fakePing]bool
	sent   []string // "dst id seq" as sent on the wire
}

func newFakePings() *fakePings { return &fakePings{nextID: 1000, open: make(map[*fakePing]bool)} }

func (f *fakePings) listen() (net.PacketConn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	c := &fakePing{f: f, id: f.nextID, replies: make(chan fakeReply, 16), done: make(chan struct{})}
	f.open[c] = true
	return c, nil
}

// openCount returns how many sockets are open.
func (f *fakePings) openCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.open)
}

type fakeReply struct {
	msg  []byte
	from net.Addr
}

type fakePing struct {
	f       *fakePings
	id      uint16
	replies chan fakeReply
	done    chan struct{}
	once    sync.Once

	mu       sync.Mutex
	deadline time.Time
}

func (c *fakePing) WriteTo(b []byte, addr net.Addr) (int, error) {
	select {
	case <-c.done:
		return 0, net.ErrClosed
	default:
	}
	ua := addr.(*net.UDPAddr)
	if c.f.v6 {
		msg := header.ICMPv6(append([]byte(nil), b...))
		if len(msg) < header.ICMPv6EchoMinimumSize || msg.Type() != header.ICMPv6EchoRequest || ua.IP.To4() != nil {
			return 0, syscall.EINVAL // what the kernel's ICMPv6 ping socket says
		}
		msg.SetIdent(c.id)
		c.f.mu.Lock()
		c.f.sent = append(c.f.sent, fmt.Sprintf("%s %d %d", ua.IP, c.id, msg.Sequence()))
		c.f.mu.Unlock()
		msg.SetType(header.ICMPv6EchoReply)
		c.replies <- fakeReply{msg: msg, from: &net.UDPAddr{IP: ua.IP}}
		return len(b), nil
	}
	msg := header.ICMPv4(append([]byte(nil), b...))
	msg.SetIdent(c.id)
	c.f.mu.Lock()
	c.f.sent = append(c.f.sent, fmt.Sprintf("%s %d %d", ua.IP, c.id, msg.Sequence()))
	c.f.mu.Unlock()
	msg.SetType(header.ICMPv4EchoReply)
	msg.SetChecksum(0)
	msg.SetChecksum(^checksum.Checksum(msg, 0))
	c.replies <- fakeReply{msg: msg, from: &net.UDPAddr{IP: ua.IP}}
	return len(b), nil
}

func (c *fakePing) ReadFrom(b []byte) (int, net.Addr, error) {
	c.mu.Lock()
	d := c.deadline
	c.mu.Unlock()
	var timeout <-chan time.Time
	if !d.IsZero() {
		tm := time.NewTimer(time.Until(d))
		defer tm.Stop()
		timeout = tm.C
	}
	select {
	case r := <-c.replies:
		return copy(b, r.msg), r.from, nil
	case <-c.done:
		return 0, nil, net.ErrClosed
	case <-timeout:
		return 0, nil, os.ErrDeadlineExceeded
	}
}

func (c *fakePing) Close() error {
	c.once.Do(func() {
		close(c.done)
		c.f.mu.Lock()
		delete(c.f.open, c)
		c.f.mu.Unlock()
	})
	return nil
}

func (c *fakePing) LocalAddr() net.Addr { return &net.UDPAddr{Port: int(c.id)} }
func (c *fakePing) SetDeadline(t time.Time) error {
	return c.SetReadDeadline(t)
}
func (c *fakePing) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return nil
}
func (c *fakePing) SetWriteDeadline(time.Time) error { return nil }

// echoRequest builds an IPv4 ICMP echo request packet.
func echoRequest(src, dst netip.Addr, id, seq uint16, payload []byte) []byte {
	p := make([]byte, header.IPv4MinimumSize+header.ICMPv4MinimumSize+len(payload))
	msg := header.ICMPv4(p[header.IPv4MinimumSize:])
	msg.SetType(header.ICMPv4Echo)
	msg.SetIdent(id)
	msg.SetSequence(seq)
	copy(msg.Payload(), payload)
	msg.SetChecksum(^checksum.Checksum(msg, 0))
	ip := header.IPv4(p)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(p)), TTL: 64, Protocol: uint8(header.ICMPv4ProtocolNumber),
		SrcAddr: tcpip.AddrFrom4(src.As4()), DstAddr: tcpip.AddrFrom4(dst.As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	return p
}

// echoReply is a parsed, checked reply read from the Stack.
type echoReply struct {
	src, dst netip.Addr
	id, seq  uint16
	payload  string
}

// readReply reads one packet from s and checks that it is a well-formed
// IPv4 echo reply with valid checksums.
func readReply(t *testing.T, s *Stack, timeout time.Duration) (echoReply, bool) {
	t.Helper()
	type res struct {
		b   []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		bufs := [][]byte{make([]byte, 65536)}
		sizes := []int{0}
		_, err := s.Read(bufs, sizes, 0)
		ch <- res{bufs[0][:sizes[0]], err}
	}()
	var r res
	select {
	case r = <-ch:
	case <-time.After(timeout):
		return echoReply{}, false
	}
	if r.err != nil {
		t.Fatalf("Read: %v", r.err)
	}
	ip := header.IPv4(r.b)
	if !ip.IsValid(len(r.b)) || ip.Protocol() != uint8(header.ICMPv4ProtocolNumber) {
		t.Fatalf("read %x: want an IPv4 ICMP packet", r.b)
	}
	if ip.CalculateChecksum() != 0xffff {
		t.Errorf("IPv4 header checksum wrong in %x", r.b)
	}
	msg := header.ICMPv4(ip.Payload())
	if msg.Type() != header.ICMPv4EchoReply || msg.Code() != 0 {
		t.Errorf("ICMP type %d code %d, want echo reply (0, 0)", msg.Type(), msg.Code())
	}
	if checksum.Checksum(msg, 0) != 0xffff {
		t.Errorf("ICMP checksum wrong in %x", r.b)
	}
	src := netip.AddrFrom4(ip.SourceAddress().As4())
	dst := netip.AddrFrom4(ip.DestinationAddress().As4())
	return echoReply{src: src, dst: dst, id: msg.Ident(), seq: msg.Sequence(), payload: string(msg.Payload())}, true
}

// newPingStack returns a Stack whose ping sockets are fp's; it has no job
// pumps: tests Write and Read themselves.
func newPingStack(t *testing.T, fp *fakePings) *Stack {
	return newPingStack46(t, fp, nil)
}

// newPingStack46 is newPingStack with fp6's ICMPv6 ping sockets as well,
// and the IPv6 tunnel address fd00:a1::1/64.
func newPingStack46(t *testing.T, fp, fp6 *fakePings) *Stack {
	t.Helper()
	checkGoroutines(t)
	cfg := Config{
		Logger:       testLogger(),
		Addrs:        []netip.Prefix{gwPrefix},
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
		HostAddrs:    func() ([]netip.Addr, error) { return []netip.Addr{netip.MustParseAddr("192.0.2.99")}, nil },
	}
	if fp6 != nil {
		cfg.Addrs = append(cfg.Addrs, netip.MustParsePrefix("fd00:a1::1/64"))
	}
	if fp != nil || fp6 != nil {
		cfg.ListenPing = func(f *ipfamily.Family, _ netip.Addr) (net.PacketConn, error) {
			if f == ipfamily.V6 && fp6 != nil {
				return fp6.listen()
			}
			if f == ipfamily.V4 && fp != nil {
				return fp.listen()
			}
			return nil, os.NewSyscallError("socket", syscall.EAFNOSUPPORT)
		}
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// addJobs adds a job per address: "A", "B", ...
func addJobs(t *testing.T, s *Stack, addrs ...netip.Addr) {
	t.Helper()
	for i, a := range addrs {
		if err := s.AddJob(testJob(jobs.ID(rune('A'+i)), a)); err != nil {
			t.Fatal(err)
		}
	}
}

func write(t *testing.T, s *Stack, pkts ...[]byte) {
	t.Helper()
	if _, err := s.Write(pkts, 0); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

// TestPingRelay: two jobs that use the same echo id each get their own
// replies, with their own id, sequence numbers and payload, from the
// outside host.
func TestPingRelay(t *testing.T) {
	fp := newFakePings()
	s := newPingStack(t, fp)
	jobA, jobB := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("100.64.0.3")
	addJobs(t, s, jobA, jobB)
	outside := netip.MustParseAddr("198.51.100.7")
	const id = 0x4242
	for seq := uint16(1); seq <= 3; seq++ {
		write(t, s,
			echoRequest(jobA, outside, id, seq, []byte(fmt.Sprintf("job A %d", seq))),
			echoRequest(jobB, outside, id, seq+100, []byte(fmt.Sprintf("job B %d", seq))))
		got := map[netip.Addr]echoReply{}
		for range 2 {
			r, ok := readReply(t, s, 5*time.Second)
			if !ok {
				t.Fatalf("seq %d: no reply within 5 s (got %v)", seq, got)
			}
			got[r.dst] = r
		}
		for _, tc := range []struct {
			job  netip.Addr
			seq  uint16
			data string
		}{{jobA, seq, fmt.Sprintf("job A %d", seq)}, {jobB, seq + 100, fmt.Sprintf("job B %d", seq)}} {
			r, ok := got[tc.job]
			if !ok {
				t.Fatalf("seq %d: no reply to %v; got %v", seq, tc.job, got)
			}
			want := echoReply{src: outside, dst: tc.job, id: id, seq: tc.seq, payload: tc.data}
			if r != want {
				t.Errorf("reply to %v: got %+v, want %+v", tc.job, r, want)
			}
		}
	}
	if n := fp.openCount(); n != 2 {
		t.Errorf("open ping sockets: got %d, want 2 (one per job echo flow)", n)
	}
	if st := s.Counters(); st.Denied != 0 || st.Dropped != 0 {
		t.Errorf("stats: got denied %d dropped %d, want 0, 0", st.Denied, st.Dropped)
	}

	// RemoveJob closes that job's socket only.
	s.RemoveJob("A")
	if n := fp.openCount(); n != 1 {
		t.Errorf("open ping sockets after RemoveJob: got %d, want 1", n)
	}
	s.Close()
	if n := fp.openCount(); n != 0 {
		t.Errorf("open ping sockets after Close: got %d, want 0", n)
	}
}

// TestPingDenied: echo requests to destinations a job may not reach are
// dropped and counted, and no socket sends them.
func TestPingDenied(t *testing.T) {
	fp := newFakePings()
	s := newPingStack(t, fp)
	job := netip.MustParseAddr("100.64.0.2")
	denied := []string{"127.0.0.1", "169.254.169.254", "224.0.0.1", "255.255.255.255", "192.0.2.99"}
	for i, d := range denied {
		write(t, s, echoRequest(job, netip.MustParseAddr(d), 7, uint16(i), []byte("x")))
	}
	if r, ok := readReply(t, s, 300*time.Millisecond); ok {
		t.Errorf("got reply %+v to a denied destination", r)
	}
	if st := s.Counters(); st.Denied != uint64(len(denied)) {
		t.Errorf("Denied: got %d, want %d", st.Denied, len(denied))
	}
	fp.mu.Lock()
	sent := fp.sent
	fp.mu.Unlock()
	if len(sent) != 0 {
		t.Errorf("sent to denied destinations: %v", sent)
	}
}

// TestPingTunnelAddress: the netstack answers echo to the gateway's tunnel
// address itself, without a ping socket.
func TestPingTunnelAddress(t *testing.T) {
	fp := newFakePings()
	s := newPingStack(t, fp)
	job := netip.MustParseAddr("100.64.0.2")
	write(t, s, echoRequest(job, gwPrefix.Addr(), 9, 1, []byte("hello gateway")))
	r, ok := readReply(t, s, 5*time.Second)
	if !ok {
		t.Fatal("no reply from the tunnel address within 5 s")
	}
	want := echoReply{src: gwPrefix.Addr(), dst: job, id: 9, seq: 1, payload: "hello gateway"}
	if r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
	if n := fp.openCount(); n != 0 {
		t.Errorf("ping sockets opened for the tunnel address: %d", n)
	}
}

// TestPingFlowsPerJobCapped: a job's echo flows are bounded.
func TestPingFlowsPerJobCapped(t *testing.T) {
	fp := newFakePings()
	s := newPingStack(t, fp)
	job := netip.MustParseAddr("100.64.0.2")
	outside := netip.MustParseAddr("198.51.100.7")
	for id := range uint16(maxPingFlowsPerJob + 4) {
		write(t, s, echoRequest(job, outside, id, 1, nil))
	}
	if n := fp.openCount(); n != maxPingFlowsPerJob {
		t.Errorf("open ping sockets: got %d, want %d", n, maxPingFlowsPerJob)
	}
	if st := s.Counters(); st.Dropped != 4 {
		t.Errorf("Dropped: got %d, want 4", st.Dropped)
	}
}

// TestCheckPing: when ping sockets are not allowed, the start-up check
// says so and names the sysctl that enables them.
func TestCheckPing(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		wantErr bool
		want    []string
	}{
		{"allowed", nil, false, nil},
		{"eacces", os.NewSyscallError("socket", syscall.EACCES), true, []string{"ping_group_range", PingSysctlHint}},
		{"eperm", os.NewSyscallError("socket", syscall.EPERM), true, []string{"ping_group_range", PingSysctlHint}},
		{"other", errors.New("boom"), true, []string{"open ping socket", "boom"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listen := func(*ipfamily.Family, netip.Addr) (net.PacketConn, error) {
				if tc.err != nil {
					return nil, tc.err
				}
				return newFakePings().listen()
			}
			err := checkPing(listen, ipfamily.V4)
			if (err != nil) != tc.wantErr {
				t.Fatalf("checkPing: got %v, want error %v", err, tc.wantErr)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("checkPing: got %q, want it to contain %q", err, w)
				}
			}
		})
	}

	// The start-up log line.
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	refuse := func(*ipfamily.Family, netip.Addr) (net.PacketConn, error) {
		return nil, os.NewSyscallError("socket", syscall.EACCES)
	}
	logPingAvailability(log, refuse)
	if out := buf.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "unavailable") || !strings.Contains(out, "ping_group_range") {
		t.Errorf("start-up log: got %q, want a Warn saying ping is unavailable and naming ping_group_range", out)
	}
}

// TestPingHostSocket uses a real ping socket to 127.0.0.1 through the
// relay's host opener when this host allows it (not through the Stack:
// jobs may not reach loopback).
func TestPingHostSocket(t *testing.T) {
	c, err := listenPingHost(ipfamily.V4, netip.Addr{})
	if err != nil {
		t.Skipf("ping sockets not available here: %v", err)
	}
	defer c.Close()
	req := echoRequest(netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("127.0.0.1"), 77, 5, []byte("real"))
	if _, err := c.WriteTo(req[header.IPv4MinimumSize:], &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
		t.Fatalf("WriteTo: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	deadline, _ := ctx.Deadline()
	c.SetReadDeadline(deadline)
	buf := make([]byte, 1500)
	n, from, err := c.ReadFrom(buf)
	if err != nil {
		t.Fatalf("ReadFrom: %v", err)
	}
	msg := header.ICMPv4(buf[:n])
	if msg.Type() != header.ICMPv4EchoReply || msg.Sequence() != 5 || string(msg.Payload()) != "real" {
		t.Errorf("reply from %v: type %d seq %d payload %q, want echo reply, 5, %q", from, msg.Type(), msg.Sequence(), msg.Payload(), "real")
	}
	pkt := buildEchoReply(ipfamily.V4, append(make([]byte, header.IPv4MinimumSize), buf[:n]...), netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("100.64.0.2"), 77)
	ip := header.IPv4(pkt)
	if !ip.IsValid(len(pkt)) || ip.CalculateChecksum() != 0xffff || checksum.Checksum(ip.Payload(), 0) != 0xffff || header.ICMPv4(ip.Payload()).Ident() != 77 {
		t.Errorf("built reply %x: want valid checksums and id 77", pkt)
	}
}

// echoRequest6 builds an IPv6 ICMPv6 echo request packet.
func echoRequest6(src, dst netip.Addr, id, seq uint16, payload []byte) []byte {
	p := make([]byte, header.IPv6MinimumSize+header.ICMPv6EchoMinimumSize+len(payload))
	msg := header.ICMPv6(p[header.IPv6MinimumSize:])
	msg.SetType(header.ICMPv6EchoRequest)
	copy(msg[header.ICMPv6EchoMinimumSize:], payload)
	msg.SetIdent(id)
	msg.SetSequence(seq)
	msg.SetChecksum(header.ICMPv6Checksum(header.ICMPv6ChecksumParams{
		Header: msg, Src: tcpip.AddrFrom16(src.As16()), Dst: tcpip.AddrFrom16(dst.As16()),
	}))
	header.IPv6(p).Encode(&header.IPv6Fields{
		PayloadLength: uint16(len(msg)), TransportProtocol: header.ICMPv6ProtocolNumber, HopLimit: 64,
		SrcAddr: tcpip.AddrFrom16(src.As16()), DstAddr: tcpip.AddrFrom16(dst.As16()),
	})
	return p
}

// readReply6 reads one packet from s and checks that it is a well-formed
// IPv6 ICMPv6 echo reply with a valid checksum.
func readReply6(t *testing.T, s *Stack, timeout time.Duration) (echoReply, bool) {
	t.Helper()
	type res struct {
		b   []byte
		err error
	}
	ch := make(chan res, 1)
	go func() {
		bufs := [][]byte{make([]byte, 65536)}
		sizes := []int{0}
		_, err := s.Read(bufs, sizes, 0)
		ch <- res{bufs[0][:sizes[0]], err}
	}()
	var r res
	select {
	case r = <-ch:
	case <-time.After(timeout):
		return echoReply{}, false
	}
	if r.err != nil {
		t.Fatalf("Read: %v", r.err)
	}
	ip := header.IPv6(r.b)
	if !ip.IsValid(len(r.b)) || ip.NextHeader() != uint8(header.ICMPv6ProtocolNumber) || int(ip.PayloadLength()) != len(r.b)-header.IPv6MinimumSize {
		t.Fatalf("read %x: want an IPv6 ICMPv6 packet", r.b)
	}
	msg := header.ICMPv6(ip.Payload())
	if msg.Type() != header.ICMPv6EchoReply || msg.Code() != 0 {
		t.Errorf("ICMPv6 type %d code %d, want echo reply (129, 0)", msg.Type(), msg.Code())
	}
	sum := header.PseudoHeaderChecksum(header.ICMPv6ProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(msg)))
	if checksum.Checksum(msg, sum) != 0xffff {
		t.Errorf("ICMPv6 checksum wrong in %x", r.b)
	}
	src := netip.AddrFrom16(ip.SourceAddress().As16())
	dst := netip.AddrFrom16(ip.DestinationAddress().As16())
	return echoReply{src: src, dst: dst, id: msg.Ident(), seq: msg.Sequence(), payload: string(msg[header.ICMPv6EchoMinimumSize:])}, true
}

// TestPing6Relay: ICMPv6 echo of two jobs with the same echo id goes out
// of ICMPv6 ping sockets, one per job flow, and each reply comes back to
// its job as an IPv6 packet with the job's id, sequence and payload.
func TestPing6Relay(t *testing.T) {
	fp, fp6 := newFakePings(), newFakePings()
	fp6.v6 = true
	s := newPingStack46(t, fp, fp6)
	jobA, jobB := netip.MustParseAddr("fd00:a1::2"), netip.MustParseAddr("fd00:a1::3")
	addJobs(t, s, jobA, jobB)
	outside := netip.MustParseAddr("2606:4700::7")
	const id = 0x6666
	for seq := uint16(1); seq <= 3; seq++ {
		write(t, s,
			echoRequest6(jobA, outside, id, seq, []byte(fmt.Sprintf("job A %d", seq))),
			echoRequest6(jobB, outside, id, seq+100, []byte(fmt.Sprintf("job B %d", seq))))
		got := map[netip.Addr]echoReply{}
		for range 2 {
			r, ok := readReply6(t, s, 5*time.Second)
			if !ok {
				t.Fatalf("seq %d: no reply within 5 s (got %v)", seq, got)
			}
			got[r.dst] = r
		}
		for _, tc := range []struct {
			job  netip.Addr
			seq  uint16
			data string
		}{{jobA, seq, fmt.Sprintf("job A %d", seq)}, {jobB, seq + 100, fmt.Sprintf("job B %d", seq)}} {
			want := echoReply{src: outside, dst: tc.job, id: id, seq: tc.seq, payload: tc.data}
			if r := got[tc.job]; r != want {
				t.Errorf("reply to %v: got %+v, want %+v", tc.job, r, want)
			}
		}
	}
	if n, n4 := fp6.openCount(), fp.openCount(); n != 2 || n4 != 0 {
		t.Errorf("open ping sockets: got %d ICMPv6 and %d ICMPv4, want 2 and 0", n, n4)
	}
	if st := s.Counters(); st.Denied != 0 || st.Dropped != 0 {
		t.Errorf("stats: got denied %d dropped %d, want 0, 0", st.Denied, st.Dropped)
	}
	s.RemoveJob("A")
	if n := fp6.openCount(); n != 1 {
		t.Errorf("open ICMPv6 ping sockets after RemoveJob: got %d, want 1", n)
	}
}

// TestPing6Denied: the floor applies to ICMPv6 echo: loopback,
// link-local, unique-local, multicast and IPv4-embedding addresses of
// denied IPv4 ones are neither sent nor answered.
func TestPing6Denied(t *testing.T) {
	fp6 := newFakePings()
	fp6.v6 = true
	s := newPingStack46(t, newFakePings(), fp6)
	job := netip.MustParseAddr("fd00:a1::2")
	denied := []string{"::1", "fe80::1", "fd00:1::1", "ff02::1", "::ffff:127.0.0.1", "64:ff9b::a9fe:a9fe", "2002:7f00:1::1"}
	for i, d := range denied {
		write(t, s, echoRequest6(job, netip.MustParseAddr(d), 7, uint16(i), []byte("x")))
	}
	if r, ok := readReply6(t, s, 300*time.Millisecond); ok {
		t.Errorf("got reply %+v to a denied destination", r)
	}
	if st := s.Counters(); st.Denied != uint64(len(denied)) {
		t.Errorf("Denied: got %d, want %d", st.Denied, len(denied))
	}
	fp6.mu.Lock()
	sent := fp6.sent
	fp6.mu.Unlock()
	if len(sent) != 0 {
		t.Errorf("sent to denied destinations: %v", sent)
	}
}

// TestPing6HostSocket uses a real ICMPv6 ping socket to ::1 through the
// relay's host opener when this host allows it, and checks the reply the
// relay builds from what it receives.
func TestPing6HostSocket(t *testing.T) {
	c, err := listenPingHost(ipfamily.V6, netip.Addr{})
	if err != nil {
		t.Skipf("ICMPv6 ping sockets not available here: %v", err)
	}
	defer c.Close()
	req := echoRequest6(netip.MustParseAddr("fd00:a1::2"), netip.IPv6Loopback(), 77, 5, []byte("real6"))
	if _, err := c.WriteTo(req[header.IPv6MinimumSize:], &net.UDPAddr{IP: net.IPv6loopback}); err != nil {
		t.Skipf("WriteTo ::1: %v (no IPv6 loopback here?)", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1500)
	n, from, err := c.ReadFrom(buf)
	if err != nil {
		t.Fatalf("ReadFrom: %v", err)
	}
	msg := header.ICMPv6(buf[:n])
	if msg.Type() != header.ICMPv6EchoReply || msg.Sequence() != 5 || string(msg[header.ICMPv6EchoMinimumSize:]) != "real6" {
		t.Errorf("reply from %v: type %d seq %d, want echo reply, 5", from, msg.Type(), msg.Sequence())
	}
	// A job's own IPv6 egress address is on no interface (a local route
	// for --egress-prefix brings its packets): the socket binds to it all
	// the same (IPV6_FREEBIND).
	own := netip.MustParseAddr("2001:db8:ffff::6440:2")
	if c2, err := listenPingHost(ipfamily.V6, own); err != nil {
		t.Errorf("ICMPv6 ping socket on %v (on no interface): %v, want it bound with IPV6_FREEBIND", own, err)
	} else {
		if got := c2.LocalAddr().String(); !strings.Contains(got, own.String()) {
			t.Errorf("ICMPv6 ping socket bound to %s, want %v", got, own)
		}
		c2.Close()
	}
	src, dst := netip.MustParseAddr("2606:4700::7"), netip.MustParseAddr("fd00:a1::2")
	pkt := buildEchoReply(ipfamily.V6, append(make([]byte, header.IPv6MinimumSize), buf[:n]...), src, dst, 77)
	ip := header.IPv6(pkt)
	sum := header.PseudoHeaderChecksum(header.ICMPv6ProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(n))
	if !ip.IsValid(len(pkt)) || checksum.Checksum(ip.Payload(), sum) != 0xffff || header.ICMPv6(ip.Payload()).Ident() != 77 {
		t.Errorf("built reply %x: want a valid checksum and id 77", pkt)
	}
}

// TestPingJobBothFamilies: a job's ICMPv6 echo flows count against the
// job's one cap with its ICMPv4 flows, and RemoveJob closes them all.
func TestPingJobBothFamilies(t *testing.T) {
	fp, fp6 := newFakePings(), newFakePings()
	fp6.v6 = true
	s := newPingStack46(t, fp, fp6)
	job4, job6 := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("fd00:a1::2")
	if err := s.AddJob(testJob("L", job4, job6)); err != nil {
		t.Fatal(err)
	}
	out4, out6 := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2606:4700::7")
	half := uint16(maxPingFlowsPerJob / 2)
	for id := range half {
		write(t, s, echoRequest(job4, out4, id, 1, nil))
	}
	for id := range half + 3 {
		write(t, s, echoRequest6(job6, out6, id, 1, nil))
	}
	if n4, n6 := fp.openCount(), fp6.openCount(); n4+n6 != maxPingFlowsPerJob || n4 != int(half) {
		t.Errorf("open ping sockets: %d ICMPv4 + %d ICMPv6, want %d + %d (one cap per job)", n4, n6, half, maxPingFlowsPerJob-int(half))
	}
	if st := s.Counters(); st.Dropped != 3 {
		t.Errorf("Dropped: got %d, want 3", st.Dropped)
	}
	s.RemoveJob("L")
	if n4, n6 := fp.openCount(), fp6.openCount(); n4 != 0 || n6 != 0 {
		t.Errorf("open ping sockets after RemoveJob: %d ICMPv4, %d ICMPv6; want none", n4, n6)
	}
}

// TestPing6TunnelAddress: the netstack answers ICMPv6 echo to the
// gateway's IPv6 tunnel address itself, without a ping socket.
func TestPing6TunnelAddress(t *testing.T) {
	fp6 := newFakePings()
	fp6.v6 = true
	s := newPingStack46(t, newFakePings(), fp6)
	job, gw := netip.MustParseAddr("fd00:a1::2"), netip.MustParseAddr("fd00:a1::1")
	write(t, s, echoRequest6(job, gw, 9, 1, []byte("hello gateway")))
	r, ok := readReply6(t, s, 5*time.Second)
	if !ok {
		t.Fatal("no reply from the IPv6 tunnel address within 5 s")
	}
	if want := (echoReply{src: gw, dst: job, id: 9, seq: 1, payload: "hello gateway"}); r != want {
		t.Errorf("got %+v, want %+v", r, want)
	}
	if n := fp6.openCount(); n != 0 {
		t.Errorf("ICMPv6 ping sockets opened for the tunnel address: %d", n)
	}
}
