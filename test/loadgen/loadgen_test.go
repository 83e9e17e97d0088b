// SPDX-License-Identifier: MIT

package loadgen

import (
	"net/netip"
	"testing"
	"time"
)

// TestUDPPacket: the hand-made datagram is a valid IPv4 header (checksum
// verifies to zero) and udpPayload reads a reply back, refusing one from
// another source or to another port.
func TestUDPPacket(t *testing.T) {
	src := netip.MustParseAddr("100.64.0.2")
	echo := netip.MustParseAddrPort("203.0.113.2:7")
	p := udpPacket(src, 40000, echo, []byte("hello"))
	if len(p) != 33 || ipChecksum(p[:20]) != 0 {
		t.Fatalf("packet %x: length %d, header checksum %#x; want 33 and 0", p, len(p), ipChecksum(p[:20]))
	}
	// The echo server's reply: the same datagram with addresses and
	// ports swapped.
	reply := udpPacket(echo.Addr(), echo.Port(), netip.AddrPortFrom(src, 40000), []byte("hello"))
	if got, ok := udpPayload(reply, echo, 40000); !ok || string(got) != "hello" {
		t.Errorf("udpPayload(reply) = %q, %v; want hello", got, ok)
	}
	if _, ok := udpPayload(reply, netip.MustParseAddrPort("203.0.113.3:7"), 40000); ok {
		t.Error("udpPayload took a reply from another source")
	}
	if _, ok := udpPayload(reply, echo, 40001); ok {
		t.Error("udpPayload took a reply to another port")
	}
	if _, ok := udpPayload(reply[:20], echo, 40000); ok {
		t.Error("udpPayload took a truncated packet")
	}
}

func TestSummarize(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	s := summarize(d)
	if s.N != 100 || s.P50 != 50 || s.P99 != 99 || s.Max != 100 {
		t.Errorf("summarize(1..100 ms) = %+v, want N 100, p50 50, p99 99, max 100", s)
	}
	if (summarize(nil) != Summary{}) {
		t.Error("summarize(nil) is not zero")
	}
}
