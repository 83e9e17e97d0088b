// SPDX-License-Identifier: MIT

package portblock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
)

// Dialer opens outgoing TCP and UDP sockets with their source port inside
// one block. It uses the kernel's per-socket IP_LOCAL_PORT_RANGE (Linux 6.3
// and later) together with IP_BIND_ADDRESS_NO_PORT, so the kernel picks a
// free port of the block at connect time, unique per destination; where the
// kernel lacks the option (EL8/EL9 kernels) it binds explicitly to ports of
// the block, trying them from a random start. It is safe for concurrent use.
type Dialer struct {
	// Block is the job's port block.
	Block Range
	// Base supplies the timeout and keep-alive; its LocalAddr and
	// Control are overwritten.
	Base net.Dialer
	// LocalIP, if valid, is the source address; invalid means the
	// kernel's choice per destination.
	LocalIP netip.Addr
	// Explicit forces the explicit-bind fallback (for tests).
	Explicit bool
}

// rangeValue packs a block for IP_LOCAL_PORT_RANGE: low port in the low 16
// bits, high port in the high 16 bits.
func rangeValue(r Range) int { return int(uint32(r.Lo) | uint32(r.Hi)<<16) }

// errNoRangeOption reports a kernel without IP_LOCAL_PORT_RANGE.
var errNoRangeOption = errors.New("kernel lacks IP_LOCAL_PORT_RANGE")

func (d *Dialer) control(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if network == "tcp4" || network == "tcp6" || network == "tcp" {
			if e := unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1); e != nil {
				serr = fmt.Errorf("set IP_BIND_ADDRESS_NO_PORT: %w", e)
				return
			}
		}
		if e := unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_LOCAL_PORT_RANGE, rangeValue(d.Block)); e != nil {
			if errors.Is(e, unix.ENOPROTOOPT) || errors.Is(e, unix.EINVAL) {
				serr = errNoRangeOption
				return
			}
			serr = fmt.Errorf("set IP_LOCAL_PORT_RANGE %s: %w", d.Block, e)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// DialContext connects to address over network ("tcp4", "tcp6", "udp4",
// "udp6") from a port of the block. When the block has no free port towards
// this destination it fails at once with an error wrapping ErrExhausted.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	if !d.Explicit {
		nd := d.Base
		nd.LocalAddr = d.local(network, 0)
		nd.Control = d.control
		c, err := nd.DialContext(ctx, network, address)
		switch {
		case err == nil:
			return c, nil
		case errors.Is(err, errNoRangeOption):
			// Fall through to explicit binding.
		case errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.EADDRINUSE):
			return nil, fmt.Errorf("dial %s from ports %s: %w", address, d.Block, ErrExhausted)
		default:
			return nil, err
		}
	}
	return d.dialExplicit(ctx, network, address)
}

// dialExplicit binds to each port of the block in turn, from a random
// start, until one is free.
func (d *Dialer) dialExplicit(ctx context.Context, network, address string) (net.Conn, error) {
	n := d.Block.Len()
	start := rand.IntN(n)
	for i := 0; i < n; i++ {
		port := int(d.Block.Lo) + (start+i)%n
		nd := d.Base
		// TCP: SO_REUSEADDR lets a port in TIME_WAIT, or one used towards
		// another destination, be bound again; connect still refuses a
		// duplicate 4-tuple (EADDRNOTAVAIL), and then the next port is
		// tried. UDP: no SO_REUSEADDR, since connect would not refuse a
		// duplicate and two flows would share one port (the replies go
		// to one of them): a UDP port serves one flow at a time.
		nd.Control = nil
		if network == "tcp" || network == "tcp4" || network == "tcp6" {
			nd.Control = reuseAddr
		}
		nd.LocalAddr = d.local(network, port)
		c, err := nd.DialContext(ctx, network, address)
		if err == nil {
			return c, nil
		}
		if errors.Is(err, unix.EADDRINUSE) || errors.Is(err, unix.EADDRNOTAVAIL) {
			continue
		}
		return nil, err
	}
	return nil, fmt.Errorf("dial %s from ports %s: %w", address, d.Block, ErrExhausted)
}

// local returns the socket's local address for network, or nil when
// neither an address nor a port is fixed.
func (d *Dialer) local(network string, port int) net.Addr {
	var ip net.IP
	if d.LocalIP.IsValid() {
		ip = d.LocalIP.AsSlice()
	} else if port == 0 {
		return nil
	}
	switch network {
	case "tcp", "tcp4", "tcp6":
		return &net.TCPAddr{IP: ip, Port: port}
	default:
		return &net.UDPAddr{IP: ip, Port: port}
	}
}

func reuseAddr(network, address string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set SO_REUSEADDR: %w", serr)
	}
	return nil
}
