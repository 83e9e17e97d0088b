package netstack

import (
	"fmt"
	"net/netip"
)

// dnsPort is the port of the DNS server on the tunnel address.
const dnsPort = 53

// allowedDestination reports whether a job may reach dst:port through the
// host, returning an error wrapping ErrDestinationDenied if not. It is the
// gateway's fixed safety floor; the policy (checkFlow) comes on top of it
// and also denies link-local and private destinations and the host's own
// addresses unless a rule names them.
//
// Denied: loopback (127/8, ::1, and their IPv4-mapped forms), unspecified
// and "this network" (0/8, ::), multicast (including link-local multicast),
// the limited broadcast address, and the tunnel address self on any port
// except DNS.
func allowedDestination(self netip.Addr, dst netip.Addr, port uint16) error {
	a := dst.Unmap()
	var why string
	switch {
	case !a.IsValid():
		why = "invalid address"
	case a.IsLoopback():
		why = "loopback"
	case a.IsUnspecified(), a.Is4() && a.As4()[0] == 0:
		why = "unspecified"
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		why = "multicast"
	case a.Is4() && a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		why = "broadcast"
	case a == self.Unmap() && port != dnsPort:
		why = "gateway tunnel address"
	default:
		return nil
	}
	return fmt.Errorf("%s port %d (%s): %w", dst, port, why, ErrDestinationDenied)
}
