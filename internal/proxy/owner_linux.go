// SPDX-License-Identifier: MIT

package proxy

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Theory of operation: the kernel knows the owner (uid) of every socket
// and tells anyone who asks through sock_diag (NETLINK_SOCK_DIAG,
// INET_DIAG), the interface ss(8) uses. One request names a socket by its
// exact addresses (family, protocol, both ends) and the answer carries
// the socket's uid. Reading /proc/net/{tcp,udp} would tell the same but
// costs a scan of every socket of the node.
//
// The lookup follows the kernel's own receive path: a TCP request's "src"
// is the socket's local end; a UDP request's is its remote end ("swapped
// for historical reasons", net/ipv4/udp_diag.c), so that an unconnected
// UDP socket bound to the port is found too. A UDP socket connected to
// another peer is not found that way; then the UDP sockets are listed
// (a dump, as ss -u does) and matched by local address. The answer's
// socket id is checked against the request.

// Kernel ABI (include/uapi/linux/inet_diag.h).
const (
	sizeofInetDiagReqV2 = 56
	sizeofInetDiagMsg   = 72
	inetDiagNoCookie    = 0xffffffff
	tcpStatesAll        = 0xffffffff
)

// SocketOwner returns the uid owning the local socket whose own address
// is sock, talking to (or receiving from) peer; network is "tcp" or
// "udp". Both addresses are of one family (IPv4-mapped IPv6 counts as
// IPv4). It fails if no such socket exists. A UDP socket bound at sock
// but connected elsewhere is found too (by a scan of the UDP sockets).
func SocketOwner(network string, sock, peer netip.AddrPort) (uint32, error) {
	sock = netip.AddrPortFrom(sock.Addr().Unmap(), sock.Port())
	peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
	if sock.Addr().Is4() != peer.Addr().Is4() {
		return 0, fmt.Errorf("sock_diag: %v and %v are of different families", sock, peer)
	}
	var proto uint8
	var src, dst netip.AddrPort
	switch network {
	case "tcp":
		proto, src, dst = unix.IPPROTO_TCP, sock, peer
	case "udp":
		proto, src, dst = unix.IPPROTO_UDP, peer, sock
	default:
		return 0, fmt.Errorf("sock_diag: network %q", network)
	}
	var id [48]byte
	putSockID(id[:], src, dst)
	var uid uint32
	found := false
	err := sockDiag(family(sock.Addr()), proto, false, id, func(local netip.AddrPort, u uint32) bool {
		// The answer names the socket by its own addresses, local first.
		if local.Port() == sock.Port() {
			uid, found = u, true
		}
		return false
	})
	if network == "udp" && errors.Is(err, unix.ENOENT) {
		err = nil
		match := func(local netip.AddrPort, u uint32) bool {
			a := local.Addr().Unmap()
			if local.Port() == sock.Port() && (a == sock.Addr() || a.IsUnspecified()) {
				uid, found = u, true
				return false
			}
			return true
		}
		fams := []uint8{family(sock.Addr())}
		if sock.Addr().Is4() {
			fams = append(fams, unix.AF_INET6) // dual-stack sockets
		}
		for _, f := range fams {
			if err = sockDiag(f, proto, true, [48]byte{}, match); err != nil || found {
				break
			}
		}
	}
	if err != nil {
		return 0, fmt.Errorf("sock_diag: %s socket %v ↔ %v: %w", network, sock, peer, err)
	}
	if !found {
		return 0, fmt.Errorf("sock_diag: no %s socket %v ↔ %v", network, sock, peer)
	}
	return uid, nil
}

func family(a netip.Addr) uint8 {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// sockDiag sends one SOCK_DIAG_BY_FAMILY request, for the socket id or
// (dump) for every socket of the family and protocol, and calls each with
// every answer's local address and uid until it returns false.
func sockDiag(fam, proto uint8, dump bool, id [48]byte, each func(local netip.AddrPort, uid uint32) bool) error {
	req := make([]byte, unix.NLMSG_HDRLEN+sizeofInetDiagReqV2)
	ne := binary.NativeEndian
	flags := uint16(unix.NLM_F_REQUEST)
	if dump {
		flags |= unix.NLM_F_DUMP
	}
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], flags)
	ne.PutUint32(req[8:], 1) // sequence
	r := req[unix.NLMSG_HDRLEN:]
	r[0], r[1] = fam, proto
	ne.PutUint32(r[4:], tcpStatesAll)
	copy(r[8:], id[:])

	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_INET_DIAG)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	buf := make([]byte, 32<<10)
	// A dump arrives in several reads, each bounded; 4096 reads of 32 KiB
	// are far more sockets than a node has.
	for range 4096 {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return fmt.Errorf("answer: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return fmt.Errorf("answer: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return nil
			case unix.NLMSG_ERROR:
				if len(m.Data) >= 4 {
					if e := int32(ne.Uint32(m.Data)); e != 0 {
						return unix.Errno(-e)
					}
				}
				return nil
			case unix.SOCK_DIAG_BY_FAMILY:
				if len(m.Data) < sizeofInetDiagMsg {
					return errors.New("short answer")
				}
				var a netip.Addr
				if m.Data[0] == unix.AF_INET {
					a = netip.AddrFrom4([4]byte(m.Data[8:12]))
				} else {
					a = netip.AddrFrom16([16]byte(m.Data[8:24]))
				}
				local := netip.AddrPortFrom(a, binary.BigEndian.Uint16(m.Data[4:]))
				if !each(local, ne.Uint32(m.Data[64:])) {
					return nil
				}
			}
		}
		if !dump {
			return nil
		}
	}
	return errors.New("answer too long")
}

// putSockID writes struct inet_diag_sockid for src and dst into b (48
// bytes): ports and addresses in network order, no interface, no cookie.
func putSockID(b []byte, src, dst netip.AddrPort) {
	binary.BigEndian.PutUint16(b[0:], src.Port())
	binary.BigEndian.PutUint16(b[2:], dst.Port())
	putAddr(b[4:20], src.Addr())
	putAddr(b[20:36], dst.Addr())
	binary.NativeEndian.PutUint32(b[36:], 0)
	binary.NativeEndian.PutUint32(b[40:], inetDiagNoCookie)
	binary.NativeEndian.PutUint32(b[44:], inetDiagNoCookie)
}

func putAddr(b []byte, a netip.Addr) {
	clear(b)
	if a.Is4() {
		v := a.As4()
		copy(b, v[:])
		return
	}
	v := a.As16()
	copy(b, v[:])
}
