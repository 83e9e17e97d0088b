//go:build !linux

package kernel

import (
	"errors"
	"log/slog"
	"net/netip"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// Config configures a Forwarder; see the Linux documentation.
type Config struct {
	Logger       *slog.Logger
	Name         string
	Addr         netip.Prefix
	MTU          int
	DNSUpstreams []netip.AddrPort
	EgressAddr   netip.Addr
	BlockSize    int
	Flows        *flows.Table
}

// Forwarder is unavailable outside Linux.
type Forwarder struct{ tun.Device }

// New fails: kernel egress needs Linux (nftables, TUN offloads).
func New(Config) (*Forwarder, error) {
	return nil, errors.New("kernel egress needs Linux; use --egress user")
}

// AddJob implements forward.Jobs.
func (*Forwarder) AddJob(netip.Addr, netip.Addr, portblock.Range) error {
	return errors.New("kernel egress needs Linux")
}

// RemoveJob implements forward.Jobs.
func (*Forwarder) RemoveJob(netip.Addr) {}

// Expose implements forward.Exposer.
func (*Forwarder) Expose(netip.Addr, []forward.Exposure) error {
	return errors.New("kernel egress needs Linux")
}

// Unexpose implements forward.Exposer.
func (*Forwarder) Unexpose(netip.Addr) {}

// BlockRefusals reports nothing: kernel egress is Linux-only.
func (*Forwarder) BlockRefusals() (uint64, error) { return 0, errors.New("kernel egress needs Linux") }
