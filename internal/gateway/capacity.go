// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// fdsPerIdleJob is how many file descriptors one idle job holds in the
// gateway: the connection of its control session (its WireGuard traffic
// shares the gateway's one UDP socket; a client older than sessions holds
// two, its lease watch and a kept-alive connection). Each flow it opens
// takes one or two more (the outside socket; with kernel TCP also the
// accepted job-side socket), so fdsPerJob leaves room for a few.
const (
	fdsPerIdleJob = 1
	fdsPerJob     = 8
	// fdsReserved are the gateway's own descriptors (listeners, state
	// db, logs, TUNs) and headroom.
	fdsReserved = 256
)

// capacity is how many concurrent jobs the gateway can hold and what
// bounds that: the smallest of its bounds.
type capacity struct {
	// Jobs is the smallest bound; Bound names it and Hint says how to
	// widen it.
	Jobs  int
	Bound string
	Hint  string
	// The bounds: port blocks (0 when jobs get no block), tunnel
	// addresses, and jobs whose descriptors fit RLIMIT_NOFILE.
	Blocks, Addresses, FDJobs int
	// NoFile is the soft RLIMIT_NOFILE (Go raises it to the hard limit at
	// start).
	NoFile uint64
}

// subnetHosts returns how many job addresses p holds: every address but
// the network address, the gateway's own and, for IPv4, the broadcast
// address; capped at 1<<24.
func subnetHosts(p netip.Prefix) int {
	bits := p.Addr().BitLen() - p.Bits()
	if bits >= 24 {
		return 1 << 24
	}
	n := 1<<bits - 2
	if p.Addr().Is4() {
		n--
	}
	return max(n, 0)
}

// planCapacity computes the capacity of a gateway with plan blocks (0: no
// blocks), subnet and a descriptor limit of nofile.
func planCapacity(blocks int, subnet netip.Prefix, nofile uint64) capacity {
	c := capacity{Blocks: blocks, Addresses: subnetHosts(subnet), NoFile: nofile}
	c.FDJobs = 0
	if nofile > fdsReserved {
		c.FDJobs = int(min((nofile-fdsReserved)/fdsPerJob, 1<<30))
	}
	c.Jobs, c.Bound, c.Hint = c.Addresses, "tunnel subnet", "widen --subnet"
	if blocks > 0 && blocks < c.Jobs {
		c.Jobs, c.Bound, c.Hint = blocks, "egress port blocks", "add --egress-addr addresses, widen --egress-ports or lower --block-size"
	}
	if c.FDJobs < c.Jobs {
		c.Jobs, c.Bound, c.Hint = c.FDJobs, "file descriptors (RLIMIT_NOFILE)", "raise the gateway's open-files limit (ulimit -n, LimitNOFILE=)"
	}
	return c
}

// openFilesLimit returns the soft RLIMIT_NOFILE, or 0 if unknown.
func openFilesLimit() uint64 {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	return r.Cur
}

// log writes the capacity at start, and a warning when the descriptor
// limit is below what the port blocks could hold.
func (c capacity) log(log *slog.Logger) {
	log.Info(fmt.Sprintf("capacity: %d concurrent jobs, bound by %s (%s)", c.Jobs, c.Bound, c.Hint),
		"port_blocks", c.Blocks, "tunnel_addresses", c.Addresses, "open_files_limit", c.NoFile,
		"jobs_by_open_files", c.FDJobs, "fds_per_job", fdsPerJob)
	if want := max(c.Blocks, 0); c.FDJobs < want {
		log.Warn("RLIMIT_NOFILE is too low for the port blocks: jobs beyond it will fail to open connections; raise the gateway's open-files limit",
			"open_files_limit", c.NoFile, "port_blocks", c.Blocks, "needed", uint64(want)*fdsPerJob+fdsReserved)
	}
}

// registerCapacityMetrics exports the capacity and the egress address.
func (e *egress) registerCapacityMetrics(reg prometheus.Registerer) error {
	jobs := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "airlock_capacity_jobs",
		Help: "Concurrent jobs this gateway can hold: the smallest of its port blocks, tunnel addresses and open-files limit.",
	})
	jobs.Set(float64(e.capacity.Jobs))
	addr := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "airlock_egress_address_info",
		Help: "The egress (public) address jobs' flows leave from and exposed ports listen on; value 1.",
	}, []string{"address"})
	if !e.public.IsUnspecified() {
		addr.WithLabelValues(e.public.String()).Set(1)
	}
	for _, c := range []prometheus.Collector{jobs, addr} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register capacity metrics: %w", err)
		}
	}
	return nil
}
