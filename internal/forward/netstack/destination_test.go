// SPDX-License-Identifier: MIT

package netstack

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/airlock-vpn/airlock/internal/policy"
)

// TestFloor checks checkFlow's built-in floor and protections with no
// policy: the one list of package policy, with the stack's tunnel subnet
// and embedded IPv4 addresses.
func TestFloor(t *testing.T) {
	s, err := New(Config{Logger: testLogger(), Addrs: []netip.Prefix{gwPrefix}, Dial: newDialer().Dial,
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
		HostAddrs: func() ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("203.0.113.1")}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	src := netip.AddrPortFrom(jobAddr, 40000)
	tests := []struct {
		dst  string
		port uint16
		rule string // "" allowed
	}{
		{"198.51.100.7", 80, ""},
		{"2001:db8::7", 443, ""},
		{"64:ff9b::808:808", 443, ""},
		{"100.64.0.9", 80, policy.RuleFloor}, // another job: the tunnel subnet is closed
		{"100.64.0.1", 22, policy.RuleFloor},
		{"100.64.0.1", 53, policy.RuleFloor}, // DNS is served by the netstack's endpoint before any flow check
		{"::ffff:100.64.0.1", 80, policy.RuleFloor},
		{"127.0.0.1", 80, policy.RuleFloor},
		{"127.1.2.3", 53, policy.RuleFloor},
		{"::1", 80, policy.RuleFloor},
		{"::ffff:127.0.0.1", 80, policy.RuleFloor},
		{"0.0.0.0", 80, policy.RuleFloor},
		{"0.1.2.3", 80, policy.RuleFloor},
		{"::", 80, policy.RuleFloor},
		{"224.0.0.251", 5353, policy.RuleFloor},
		{"239.1.1.1", 1234, policy.RuleFloor},
		{"ff02::fb", 5353, policy.RuleFloor},
		{"ff01::1", 1, policy.RuleFloor},
		{"255.255.255.255", 67, policy.RuleFloor},
		{"64:ff9b::7f00:1", 80, policy.RuleFloor},
		{"169.254.169.254", 80, policy.RuleMetadata},
		{"64:ff9b::a9fe:a9fe", 80, policy.RuleMetadata},
		{"2002:a9fe:a9fe::1", 80, policy.RuleMetadata},
		{"100.100.100.200", 80, policy.RuleMetadata},
		{"168.63.129.16", 80, policy.RuleMetadata},
		{"100.100.1.1", 80, policy.RuleInternal},
		{"192.0.0.170", 80, policy.RuleInternal},
		{"64:ff9b::c000:aa", 80, policy.RuleInternal},
		{"fe80::1", 80, policy.RuleLinkLocal},
		{"10.1.2.3", 80, policy.RulePrivate},
		{"203.0.113.1", 80, policy.RuleHost},
		{"64:ff9b::cb00:7101", 80, policy.RuleHost}, // NAT64 of the host's 203.0.113.1
	}
	for _, tt := range tests {
		dst := netip.AddrPortFrom(netip.MustParseAddr(tt.dst), tt.port)
		err := s.checkFlow(src, policy.ProtoTCP, dst)
		if tt.rule == "" {
			if err != nil {
				t.Errorf("checkFlow(%v): %v, want allowed", dst, err)
			}
			continue
		}
		if !errors.Is(err, ErrDestinationDenied) || !strings.Contains(err.Error(), "rule "+tt.rule+")") {
			t.Errorf("checkFlow(%v): %v, want denied by %s", dst, err, tt.rule)
		}
	}
}

// rawPacket builds an IPv4 or IPv6 packet carrying a TCP SYN (proto TCP)
// or a UDP datagram with payload (proto UDP) from src to dst.
func rawPacket(proto tcpip.TransportProtocolNumber, src, dst netip.AddrPort, payload []byte) []byte {
	var l4 []byte
	if proto == header.TCPProtocolNumber {
		l4 = make([]byte, header.TCPMinimumSize)
		header.TCP(l4).Encode(&header.TCPFields{
			SrcPort: src.Port(), DstPort: dst.Port(), SeqNum: 1000,
			DataOffset: header.TCPMinimumSize, Flags: header.TCPFlagSyn, WindowSize: 65535,
		})
	} else {
		l4 = make([]byte, header.UDPMinimumSize+len(payload))
		copy(l4[header.UDPMinimumSize:], payload)
		header.UDP(l4).Encode(&header.UDPFields{SrcPort: src.Port(), DstPort: dst.Port(), Length: uint16(len(l4))})
	}
	sa := tcpip.AddrFromSlice(src.Addr().AsSlice())
	da := tcpip.AddrFromSlice(dst.Addr().AsSlice())
	xsum := header.PseudoHeaderChecksum(proto, sa, da, uint16(len(l4)))
	xsum = checksumBytes(l4, xsum)
	if proto == header.TCPProtocolNumber {
		header.TCP(l4).SetChecksum(^xsum)
	} else {
		header.UDP(l4).SetChecksum(^xsum)
	}
	if src.Addr().Is4() {
		b := make([]byte, header.IPv4MinimumSize+len(l4))
		ip := header.IPv4(b)
		ip.Encode(&header.IPv4Fields{
			TotalLength: uint16(len(b)), TTL: 64, Protocol: uint8(proto), SrcAddr: sa, DstAddr: da,
		})
		ip.SetChecksum(^ip.CalculateChecksum())
		copy(b[header.IPv4MinimumSize:], l4)
		return b
	}
	b := make([]byte, header.IPv6MinimumSize+len(l4))
	header.IPv6(b).Encode(&header.IPv6Fields{
		PayloadLength: uint16(len(l4)), TransportProtocol: proto, HopLimit: 64, SrcAddr: sa, DstAddr: da,
	})
	copy(b[header.IPv6MinimumSize:], l4)
	return b
}

// checksumBytes adds b to a partial Internet checksum.
func checksumBytes(b []byte, initial uint16) uint16 {
	sum := uint32(initial)
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// TestDeniedDestinations sends crafted packets, as a misbehaving job could,
// to destinations that must never be dialled from the gateway host.
func TestDeniedDestinations(t *testing.T) {
	checkGoroutines(t)
	d := newDialer()
	s, err := New(Config{Logger: testLogger(), Addrs: []netip.Prefix{gwPrefix}, Dial: d.Dial,
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	out := make(chan []byte, 64)
	go func() {
		bufs := [][]byte{make([]byte, 65536)}
		sizes := []int{0}
		for {
			if _, err := s.Read(bufs, sizes, 0); err != nil {
				close(out)
				return
			}
			out <- append([]byte(nil), bufs[0][:sizes[0]]...)
		}
	}()

	src4 := netip.AddrPortFrom(jobAddr, 40000)
	src6 := netip.MustParseAddrPort("[fd00::2]:40000")
	tests := []struct {
		proto   tcpip.TransportProtocolNumber
		dst     string
		wantRST bool // false: a RST or silence (gVisor itself drops loopback and IPv4-mapped destinations)
	}{
		{header.TCPProtocolNumber, "127.0.0.1:80", false},
		{header.TCPProtocolNumber, "[::1]:80", false},
		{header.TCPProtocolNumber, "[::ffff:127.0.0.1]:80", false},
		{header.TCPProtocolNumber, "100.64.0.1:22", true},
		{header.TCPProtocolNumber, "0.0.0.0:80", false},
		{header.TCPProtocolNumber, "169.254.169.254:80", true},
		{header.TCPProtocolNumber, "[fe80::1]:80", true},
		{header.TCPProtocolNumber, "100.64.0.9:80", true}, // another job
		{header.TCPProtocolNumber, "100.100.100.200:80", true},
		{header.TCPProtocolNumber, "192.0.0.170:80", true},
		{header.TCPProtocolNumber, "[64:ff9b::a9fe:a9fe]:80", true},
		{header.UDPProtocolNumber, "100.100.100.200:53", false},
		{header.UDPProtocolNumber, "[64:ff9b::a9fe:a9fe]:53", false},
		{header.UDPProtocolNumber, "127.0.0.1:53", false},
		{header.UDPProtocolNumber, "[::ffff:127.0.0.1]:53", false},
		{header.UDPProtocolNumber, "100.64.0.1:123", false},
		{header.UDPProtocolNumber, "224.0.0.251:5353", false},
		{header.UDPProtocolNumber, "255.255.255.255:67", false},
		{header.UDPProtocolNumber, "[ff02::fb]:5353", false},
	}
	for i, tt := range tests {
		dst := netip.MustParseAddrPort(tt.dst)
		src := src4
		if dst.Addr().Is6() {
			src = src6
		}
		src = netip.AddrPortFrom(src.Addr(), src.Port()+uint16(i))
		pkt := rawPacket(tt.proto, src, dst, []byte("hello"))
		if _, err := s.Write([][]byte{pkt}, 0); err != nil {
			t.Fatalf("%s: Write: %v", tt.dst, err)
		}
		if tt.proto != header.TCPProtocolNumber {
			continue
		}
		gotRST := false
		timeout := time.After(300 * time.Millisecond)
	wait:
		for {
			select {
			case b := <-out:
				if isRSTTo(b, src) {
					gotRST = true
					break wait
				}
			case <-timeout:
				break wait
			}
		}
		if tt.wantRST && !gotRST {
			t.Errorf("tcp to %s: no RST", tt.dst)
		}
	}
	if calls := d.Calls(); len(calls) != 0 {
		t.Errorf("dial hook called for denied destinations: %q", calls)
	}
	if st := s.Counters(); st.TCPFlows+st.UDPFlows != 0 {
		t.Errorf("flows opened: %+v", st)
	}
}

// isRSTTo reports whether b is a TCP RST for the job address to.
func isRSTTo(b []byte, to netip.AddrPort) bool {
	var l4 []byte
	var dst tcpip.Address
	switch {
	case len(b) >= header.IPv4MinimumSize && b[0]>>4 == 4:
		ip := header.IPv4(b)
		if ip.TransportProtocol() != header.TCPProtocolNumber {
			return false
		}
		l4, dst = ip.Payload(), ip.DestinationAddress()
	case len(b) >= header.IPv6MinimumSize && b[0]>>4 == 6:
		ip := header.IPv6(b)
		if ip.TransportProtocol() != header.TCPProtocolNumber {
			return false
		}
		l4, dst = ip.Payload(), ip.DestinationAddress()
	default:
		return false
	}
	if len(l4) < header.TCPMinimumSize {
		return false
	}
	tcp := header.TCP(l4)
	return dst == tcpip.AddrFromSlice(to.Addr().AsSlice()) && tcp.DestinationPort() == to.Port() &&
		tcp.Flags().Contains(header.TCPFlagRst)
}

func TestHostAddrsDenied(t *testing.T) {
	reads := 0
	h := hostAddrs{list: func() ([]netip.Addr, error) {
		reads++
		return []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")}, nil
	}}
	now := time.Unix(1000, 0)
	tests := []struct {
		addr string
		want bool
	}{
		{"203.0.113.1", true},
		{"::ffff:203.0.113.1", true},
		{"2001:db8::1", true},
		{"203.0.113.2", false},
	}
	for _, tt := range tests {
		if got := h.contains(netip.MustParseAddr(tt.addr), now); got != tt.want {
			t.Errorf("contains(%s): got %v, want %v", tt.addr, got, tt.want)
		}
	}
	if reads != 1 {
		t.Errorf("address list read %d times within the TTL, want 1", reads)
	}
	h.contains(netip.MustParseAddr("203.0.113.1"), now.Add(hostAddrsTTL+time.Second))
	if reads != 2 {
		t.Errorf("address list read %d times after the TTL, want 2", reads)
	}
}
