// SPDX-License-Identifier: MIT

package main

// rawsyn IFACE DST:PORT WAIT   (inside a job) send one TCP SYN from IFACE's
//                              IPv4 address to DST:PORT through a packet
//                              socket, bypassing the job's routing (so that
//                              e.g. 127.0.0.1 goes out of the tunnel), and
//                              print what comes back within WAIT: "synack",
//                              "rst" or "none"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

func rawSYN(ifname, dst string, wait time.Duration) error {
	ifi, err := net.InterfaceByName(ifname)
	if err != nil {
		return err
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return err
	}
	var src netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() {
			src = p.Addr()
		}
	}
	if !src.IsValid() {
		return fmt.Errorf("%s has no IPv4 address", ifname)
	}
	d, err := netip.ParseAddrPort(dst)
	if err != nil || !d.Addr().Is4() {
		return fmt.Errorf("bad destination %q: want IPv4:PORT", dst)
	}
	proto := htons(unix.ETH_P_IP)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM, int(proto))
	if err != nil {
		return fmt.Errorf("packet socket: %w", err)
	}
	defer unix.Close(fd)
	ll := &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifi.Index}
	if err := unix.Bind(fd, ll); err != nil {
		return fmt.Errorf("bind packet socket: %w", err)
	}
	const sport = 41234
	pkt := synPacket(src, d, sport)
	if err := unix.Sendto(fd, pkt, 0, ll); err != nil {
		return fmt.Errorf("send: %w", err)
	}
	deadline := time.Now().Add(wait)
	buf := make([]byte, 2048)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			fmt.Println("none")
			return nil
		}
		tv := unix.NsecToTimeval(left.Nanoseconds())
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("receive: %w", err)
		}
		p := buf[:n]
		if n < 40 || p[0]>>4 != 4 || p[9] != unix.IPPROTO_TCP {
			continue
		}
		ihl := int(p[0]&0xf) * 4
		if n < ihl+20 || netip.AddrFrom4([4]byte(p[12:16])) != d.Addr() ||
			binary.BigEndian.Uint16(p[ihl:]) != d.Port() || binary.BigEndian.Uint16(p[ihl+2:]) != sport {
			continue
		}
		switch flags := p[ihl+13]; {
		case flags&0x04 != 0:
			fmt.Println("rst")
		case flags&0x12 == 0x12:
			fmt.Println("synack")
		default:
			continue
		}
		return nil
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// synPacket builds an IPv4 TCP SYN with valid checksums.
func synPacket(src netip.Addr, dst netip.AddrPort, sport uint16) []byte {
	p := make([]byte, 40)
	p[0], p[8], p[9] = 0x45, 64, unix.IPPROTO_TCP
	binary.BigEndian.PutUint16(p[2:], 40)
	s, d := src.As4(), dst.Addr().As4()
	copy(p[12:], s[:])
	copy(p[16:], d[:])
	binary.BigEndian.PutUint16(p[10:], checksum(p[:20], 0))
	t := p[20:]
	binary.BigEndian.PutUint16(t[0:], sport)
	binary.BigEndian.PutUint16(t[2:], dst.Port())
	binary.BigEndian.PutUint32(t[4:], 0x01020304)
	t[12], t[13] = 5<<4, 0x02
	binary.BigEndian.PutUint16(t[14:], 65535)
	var pseudo uint32
	for i := 0; i < 4; i += 2 {
		pseudo += uint32(binary.BigEndian.Uint16(s[i:])) + uint32(binary.BigEndian.Uint16(d[i:]))
	}
	pseudo += unix.IPPROTO_TCP + 20
	binary.BigEndian.PutUint16(t[16:], checksum(t, pseudo))
	return p
}

func checksum(b []byte, sum uint32) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
