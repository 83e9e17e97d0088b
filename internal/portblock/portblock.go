// SPDX-License-Identifier: MIT

// Package portblock splits the gateway's egress port range into fixed-size
// blocks, one per job, and opens outgoing sockets whose source port stays
// inside a job's block. Because every job owns a fixed block, a public
// (address, port, time) names the job without per-connection NAT logs.
package portblock

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// ErrExhausted means every port of a job's block is in use towards that
// destination; the connection fails at once instead of waiting.
var ErrExhausted = errors.New("port block exhausted")

// Range is an inclusive range of ports.
type Range struct{ Lo, Hi uint16 }

// String formats r as LO-HI.
func (r Range) String() string { return fmt.Sprintf("%d-%d", r.Lo, r.Hi) }

// Len returns the number of ports in r.
func (r Range) Len() int { return int(r.Hi) - int(r.Lo) + 1 }

// Contains reports whether port is in r.
func (r Range) Contains(port uint16) bool { return port >= r.Lo && port <= r.Hi }

// ParseRange parses "LO-HI" with 1 <= LO <= HI <= 65535.
func ParseRange(s string) (Range, error) {
	lo, hi, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		return Range{}, fmt.Errorf("port range %q: want LO-HI, e.g. 20000-59999", s)
	}
	l, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	h, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 16)
	if err1 != nil || err2 != nil || l == 0 || l > h {
		return Range{}, fmt.Errorf("port range %q: want LO-HI with 1 <= LO <= HI <= 65535", s)
	}
	return Range{uint16(l), uint16(h)}, nil
}

// HostEphemeralRange reads this network namespace's
// net.ipv4.ip_local_port_range, the ports the kernel picks source ports
// from.
func HostEphemeralRange() (Range, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return Range{}, fmt.Errorf("read ip_local_port_range: %w", err)
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return Range{}, fmt.Errorf("read ip_local_port_range: unexpected %q", b)
	}
	return ParseRange(f[0] + "-" + f[1])
}

// Plan divides a range into blocks of Size ports; ports left over at the top
// are not used. The zero value is not usable: call NewPlan.
type Plan struct {
	Range Range
	Size  int
}

// NewPlan checks that r holds at least one block of size ports.
func NewPlan(r Range, size int) (Plan, error) {
	if size < 1 || size > r.Len() {
		return Plan{}, fmt.Errorf("block size %d: want 1 to %d (the range %s)", size, r.Len(), r)
	}
	return Plan{Range: r, Size: size}, nil
}

// Blocks returns the number of blocks.
func (p Plan) Blocks() int { return p.Range.Len() / p.Size }

// Block returns block i, 0 <= i < Blocks().
func (p Plan) Block(i int) Range {
	lo := int(p.Range.Lo) + i*p.Size
	return Range{uint16(lo), uint16(lo + p.Size - 1)}
}

// BlockOf returns the index of the block holding port, or -1.
func (p Plan) BlockOf(port uint16) int {
	if !p.Range.Contains(port) {
		return -1
	}
	i := (int(port) - int(p.Range.Lo)) / p.Size
	if i >= p.Blocks() {
		return -1
	}
	return i
}

// LogValue makes slog show Range as its String form in every log format
// (the JSON handler would otherwise print its fields).
func (r Range) LogValue() slog.Value { return slog.StringValue(r.String()) }
