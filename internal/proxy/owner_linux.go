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
// UDP socket bound to the port is found too. The answer's socket id is
// checked against the request.

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
// IPv4). It fails if no such socket exists.
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
	family := uint8(unix.AF_INET6)
	if sock.Addr().Is4() {
		family = unix.AF_INET
	}
	req := make([]byte, unix.NLMSG_HDRLEN+sizeofInetDiagReqV2)
	ne := binary.NativeEndian
	ne.PutUint32(req[0:], uint32(len(req)))
	ne.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
	ne.PutUint16(req[6:], unix.NLM_F_REQUEST)
	ne.PutUint32(req[8:], 1) // sequence
	r := req[unix.NLMSG_HDRLEN:]
	r[0], r[1] = family, proto
	ne.PutUint32(r[4:], tcpStatesAll)
	putSockID(r[8:], src, dst)

	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_INET_DIAG)
	if err != nil {
		return 0, fmt.Errorf("sock_diag socket: %w", err)
	}
	defer unix.Close(fd)
	tv := unix.NsecToTimeval((2 * time.Second).Nanoseconds())
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return 0, fmt.Errorf("sock_diag request: %w", err)
	}
	buf := make([]byte, 4096)
	n, _, err := unix.Recvfrom(fd, buf, 0)
	if err != nil {
		return 0, fmt.Errorf("sock_diag answer: %w", err)
	}
	msgs, err := syscall.ParseNetlinkMessage(buf[:n])
	if err != nil {
		return 0, fmt.Errorf("sock_diag answer: %w", err)
	}
	for _, m := range msgs {
		switch m.Header.Type {
		case unix.NLMSG_ERROR:
			if len(m.Data) >= 4 {
				if e := int32(ne.Uint32(m.Data)); e != 0 {
					return 0, fmt.Errorf("sock_diag: no %s socket %v ↔ %v: %w", network, sock, peer, unix.Errno(-e))
				}
			}
			return 0, errors.New("sock_diag: empty answer")
		case unix.SOCK_DIAG_BY_FAMILY:
			if len(m.Data) < sizeofInetDiagMsg {
				return 0, errors.New("sock_diag: short answer")
			}
			// The answer names the socket by its own addresses, local
			// first.
			if p := binary.BigEndian.Uint16(m.Data[4:]); p != sock.Port() {
				return 0, fmt.Errorf("sock_diag: answer for port %d, asked for %v", p, sock)
			}
			return ne.Uint32(m.Data[64:]), nil
		}
	}
	return 0, errors.New("sock_diag: no answer")
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
