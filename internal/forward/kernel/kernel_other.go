// SPDX-License-Identifier: MIT

//go:build !linux

package kernel

import (
	"errors"
	"fmt"
	"net/netip"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// CheckPrefix6 has nothing to check outside Linux.
func CheckPrefix6(netip.Prefix, string) []string { return nil }

// Forwarder is unavailable outside Linux.
type Forwarder struct{ tun.Device }

// New fails: kernel egress needs Linux (nftables, TUN offloads).
func New(Config) (*Forwarder, error) {
	return nil, errors.New("kernel egress needs Linux; use --egress user")
}

var _ forward.Backend = (*Forwarder)(nil)

// Queues implements forward.Backend.
func (*Forwarder) Queues() int { return 1 }

// errNotLinux is what every method returns: New never makes a Forwarder
// outside Linux.
var errNotLinux = fmt.Errorf("kernel egress needs Linux: %w", forward.ErrNotSupported)

// AddJob implements forward.Backend.
func (*Forwarder) AddJob(forward.Job) error { return errNotLinux }

// RemoveJob implements forward.Backend.
func (*Forwarder) RemoveJob(jobs.ID) {}

// SetJobLimits implements forward.Backend.
func (*Forwarder) SetJobLimits(jobs.ID, limits.Job) error { return errNotLinux }

// SetPolicy implements forward.Backend.
func (*Forwarder) SetPolicy(*policy.Policy) error { return errNotLinux }

// SetGlobalLimits implements forward.Backend.
func (*Forwarder) SetGlobalLimits(uint64, uint64) error { return errNotLinux }

// Stats implements forward.Backend.
func (*Forwarder) Stats() (forward.Stats, error) { return forward.Stats{}, errNotLinux }
