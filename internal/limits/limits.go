// SPDX-License-Identifier: MIT

// Package limits holds the traffic limits of jobs as the config states them
// and the egress backends enforce them: per-job bandwidth, flow and DNS
// limits, their counters, and the parsing and formatting of bandwidths. It
// imports nothing of airlock, so that config and the backends share it.
package limits

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Job are one job's traffic limits. A zero field means unlimited.
type Job struct {
	// EgressBitsPerSec caps the job's traffic to the outside (job →
	// outside), in bits per second of IP payload as the backend counts it.
	EgressBitsPerSec uint64
	// IngressBitsPerSec caps the traffic from the outside to the job.
	IngressBitsPerSec uint64
	// MaxFlows caps the job's concurrent flows (TCP connections and UDP
	// flows it opened); a new flow beyond it is refused at once (TCP
	// reset, UDP dropped or answered with ICMP port unreachable).
	MaxFlows int
	// NewFlowsPerSec caps how fast the job may open flows; up to
	// max(1, ⌈NewFlowsPerSec⌉) may open at once, then NewFlowsPerSec per
	// second. Excess flows are refused like those over MaxFlows.
	NewFlowsPerSec float64
	// DNSMaxInflight caps the job's DNS queries to the gateway's relay
	// being answered at once, DNSQueriesPerSec how many it may send per
	// second (bursts of as many); excess queries are answered REFUSED.
	// Unlike the others, zero means the relay's default (dnsfwd:
	// DefaultMaxInflight, DefaultPerSec): DNS through the gateway is never
	// unlimited.
	DNSMaxInflight   int
	DNSQueriesPerSec float64
}

// IsZero reports whether l limits nothing.
func (l Job) IsZero() bool { return l == Job{} }

// Validate checks l for values no backend can enforce.
func (l Job) Validate() error {
	if l.MaxFlows < 0 {
		return fmt.Errorf("max flows %d: want 0 (unlimited) or more", l.MaxFlows)
	}
	if l.NewFlowsPerSec < 0 || math.IsNaN(l.NewFlowsPerSec) || math.IsInf(l.NewFlowsPerSec, 0) {
		return fmt.Errorf("new flows per second %v: want 0 (unlimited) or a positive number", l.NewFlowsPerSec)
	}
	if l.DNSMaxInflight < 0 || l.DNSMaxInflight > 1<<20 {
		return fmt.Errorf("dns max in-flight %d: want 0 (default) to %d", l.DNSMaxInflight, 1<<20)
	}
	if l.DNSQueriesPerSec < 0 || l.DNSQueriesPerSec > 1e6 || math.IsNaN(l.DNSQueriesPerSec) {
		return fmt.Errorf("dns queries per second %v: want 0 (default) to 1000000", l.DNSQueriesPerSec)
	}
	return nil
}

// Stats are an egress backend's cumulative counts of what its limits
// refused or dropped, for metrics.
type Stats struct {
	// FlowsRefused counts new flows refused because the job had MaxFlows
	// flows open.
	FlowsRefused uint64
	// RateRefused counts new flows refused because of NewFlowsPerSec.
	RateRefused uint64
	// Dropped counts packets dropped by bandwidth limits: UDP datagrams
	// over the rate in user mode; the shaper's queue drops in kernel mode
	// (TCP recovers from those; they are how a queue tells TCP to slow).
	Dropped uint64
}

// ParseRate parses a bandwidth such as "100mbit", "1gbit", "2.5Gbit",
// "500kbit", "800000" (bits per second) or "10MB" (bytes: 8×): an optional
// decimal number followed by a unit of bit or byte (B, Bps) with an
// optional SI prefix k, m, g or t (powers of 1000). "" and "0" mean 0
// (unlimited).
func ParseRate(s string) (uint64, error) {
	in := s
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	num, unit := s[:i], strings.TrimSpace(s[i:])
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("bad rate %q: want a number and a unit, e.g. 100mbit or 1gbit", in)
	}
	mult := 1.0
	if unit != "" {
		switch unit[0] {
		case 'k', 'K':
			mult, unit = 1e3, unit[1:]
		case 'm', 'M':
			mult, unit = 1e6, unit[1:]
		case 'g', 'G':
			mult, unit = 1e9, unit[1:]
		case 't', 'T':
			mult, unit = 1e12, unit[1:]
		}
	}
	switch unit {
	case "", "bit", "bits", "bps", "bit/s":
	case "B", "Bps", "byte", "bytes", "B/s":
		mult *= 8
	default:
		return 0, fmt.Errorf("bad rate %q: unknown unit %q; want e.g. 100mbit, 1gbit, 500kbit or 10MB (bytes)", in, unit)
	}
	bits := v * mult
	if bits >= math.MaxUint64/2 {
		return 0, fmt.Errorf("bad rate %q: too large", in)
	}
	if bits > 0 && bits < 8000 {
		return 0, fmt.Errorf("bad rate %q: below 8kbit, the smallest rate the shapers hold", in)
	}
	return uint64(math.Round(bits)), nil
}

// FormatRate formats bits per second the way ParseRate reads it.
func FormatRate(bps uint64) string {
	switch {
	case bps == 0:
		return "unlimited"
	case bps%1e9 == 0:
		return strconv.FormatUint(bps/1e9, 10) + "gbit"
	case bps%1e6 == 0:
		return strconv.FormatUint(bps/1e6, 10) + "mbit"
	case bps%1e3 == 0:
		return strconv.FormatUint(bps/1e3, 10) + "kbit"
	}
	return strconv.FormatUint(bps, 10) + "bit"
}
