// SPDX-License-Identifier: MIT

package netstack

// Jobs in user mode. A job is its ID; forward.Jobs (the bookkeeping every
// backend shares) keeps the job as AddJob took it and its addresses in the
// job index, and the Stack keeps its own state of the job in jobTable,
// keyed by ID: where its flows of each address family leave from, its
// token, its limits. A flow's job is found from its job-side address
// through the index (jobOf), whatever its family, so a job's flows of
// both families share its limits, its token and its flow table entry.

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/dnsfwd"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// jobEgress is where a job's outside flows of one family leave from.
type jobEgress struct {
	// addr is the host address (zero: the kernel's choice per
	// destination); block the source ports (zero: any).
	addr  netip.Addr
	block portblock.Range
	// own: addr is the job's own address (on no interface, bound with
	// IPV6_FREEBIND).
	own bool
}

// jobState is the Stack's state of one job. Its fields are set before it
// is published and not changed after, except through lim's own methods.
type jobState struct {
	id     jobs.ID
	token  string
	egress [ipfamily.N]jobEgress
	lim    *jobLimits
}

// jobTable holds the Stack's jobs by ID. It is safe for concurrent use;
// the zero value is an empty table.
type jobTable struct {
	mu   sync.RWMutex
	jobs map[jobs.ID]*jobState
}

func (t *jobTable) set(j *jobState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.jobs == nil {
		t.jobs = make(map[jobs.ID]*jobState)
	}
	t.jobs[j.id] = j
}

func (t *jobTable) remove(id jobs.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.jobs, id)
}

func (t *jobTable) get(id jobs.ID) *jobState {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.jobs[id]
}

// jobOf returns the job whose tunnel address is a, nil for none.
func (s *Stack) jobOf(a netip.Addr) *jobState {
	id, ok := s.reg.Lookup(a)
	if !ok {
		return nil
	}
	return s.jobs.get(id)
}

// AddJob implements forward.Backend (forward.Jobs: checks, index, flow
// table, one undo path) with the Stack's steps: addJob, SetJobLimits,
// expose, removeJob.
func (s *Stack) AddJob(j forward.Job) error { return s.reg.Add(j) }

// RemoveJob implements forward.Backend: it closes the job's exposures and
// echo flows, forgets its egress, limits, token and DNS state, and ends
// its open flows (flows.EndJob, which closes them).
func (s *Stack) RemoveJob(id jobs.ID) { s.reg.Remove(id) }

// jobSteps are the Stack's steps of AddJob and RemoveJob.
func (s *Stack) jobSteps() forward.JobSteps {
	return forward.JobSteps{
		Add:       s.addJob,
		SetLimits: s.SetJobLimits,
		Expose:    func(j forward.Job) error { return s.expose(j.ID, j.Exposures) },
		Remove:    s.removeJob,
	}
}

// addJob makes the outside flows of job j of each family leave from its
// egress address of that family (unspecified: the Stack's Egress of the
// family, else the kernel's choice) and ports of its block (zero: any).
func (s *Stack) addJob(j forward.Job) error {
	if s.closing.Load() {
		return errors.New("closed")
	}
	js := &jobState{id: j.ID, token: j.Ref.Token, lim: new(jobLimits)}
	for _, a := range j.Addrs {
		f := ipfamily.Of(a)
		e, _ := j.EgressOf(f)
		if !e.Addr.IsValid() || e.Addr.IsUnspecified() {
			e.Addr = s.egress[f.Index]
		}
		js.egress[f.Index] = jobEgress{addr: e.Addr.Unmap(), block: e.Block, own: e.Own}
	}
	s.jobs.set(js)
	return nil
}

// removeJob forgets the job's egress, limits, token and DNS state and
// closes its exposures and ICMP echo flows; its TCP and UDP flows already
// open keep running until they end (forward.Jobs ends them next), still
// under the job's bandwidth limits.
func (s *Stack) removeJob(j forward.Job) {
	s.unexpose(j.ID)
	s.jobs.remove(j.ID)
	s.pings.removeJob(j.ID)
	s.dnsLimits.RemoveJob(j.Addrs)
}

// setJobDNSLimits sets the DNS limits of job j, one budget for all its
// addresses.
func (s *Stack) setJobDNSLimits(j forward.Job, l dnsfwd.Limits) error {
	return s.dnsLimits.SetJob(j.Addrs, l)
}

// egressOf returns where the job at tunnel address src sends its flows to
// dst's family from; ok false for no job.
func (s *Stack) egressOf(src, dst netip.Addr) (jobEgress, bool) {
	j := s.jobOf(src)
	if j == nil {
		return jobEgress{addr: s.egress[ipfamily.Of(dst).Index]}, false
	}
	return j.egress[ipfamily.Of(dst).Index], true
}

// dial opens the host socket for a job's flow from src to dst: through the
// Dial hook if one is configured, else from a port of the job's block of
// dst's family on its egress address. A job with a block that has no
// free port fails at once with portblock.ErrExhausted, counted and logged.
func (s *Stack) dial(ctx context.Context, src netip.Addr, network string, dst netip.AddrPort) (net.Conn, error) {
	c, err := s.dialOut(ctx, src, network, dst)
	if err != nil {
		s.noteNoFiles(err, "job", src, "dst", dst)
	}
	return c, err
}

// noteNoFiles reports whether err says the gateway is out of file
// descriptors, and then counts it and has s.noFiles warn.
func (s *Stack) noteNoFiles(err error, attrs ...any) bool {
	if !s.noFiles.Note(err, "a job's connection failed", attrs...) {
		return false
	}
	s.stats.noFiles.Add(1)
	return true
}

// dialOut is dial without the check for exhausted descriptors.
func (s *Stack) dialOut(ctx context.Context, src netip.Addr, network string, dst netip.AddrPort) (net.Conn, error) {
	if s.cfg.Dial != nil {
		return s.cfg.Dial(ctx, network, dst.String())
	}
	base := net.Dialer{Timeout: s.cfg.DialTimeout, KeepAlive: 30 * time.Second}
	je, _ := s.egressOf(src, dst.Addr())
	if je.block == (portblock.Range{}) {
		if je.addr.IsValid() {
			base.LocalAddr = localAddr(network, je.addr, 0)
			// A job's own address is on no interface.
			base.Control = freebind
		}
		return base.DialContext(ctx, network, dst.String())
	}
	d := portblock.Dialer{Block: je.block, Base: base, LocalIP: je.addr, Explicit: s.cfg.ExplicitPorts}
	c, err := d.DialContext(ctx, network, dst.String())
	if errors.Is(err, portblock.ErrExhausted) {
		s.stats.blockExhausted.Add(1)
		if s.flowLog.Allow() {
			s.log.Warn("job's port block exhausted: new connection refused", "job", src, "dst", dst, "block", je.block)
		}
	}
	return c, err
}

func localAddr(network string, ip netip.Addr, port int) net.Addr {
	switch network {
	case "udp", "udp4", "udp6":
		return &net.UDPAddr{IP: ip.AsSlice(), Port: port}
	default:
		return &net.TCPAddr{IP: ip.AsSlice(), Port: port}
	}
}

// Stats implements forward.Backend.
func (s *Stack) Stats() (forward.Stats, error) {
	if s.closing.Load() {
		return forward.Stats{}, errors.New("user-mode egress: closed")
	}
	return forward.Stats{
		Limits:        s.limitStats(),
		PolicyDrops:   s.policyDrops(),
		BlockRefusals: s.stats.blockExhausted.Load(),
	}, nil
}

// newJobs makes the Stack's job bookkeeping over its tunnel subnets.
func (s *Stack) newJobs() error {
	reg, err := forward.NewJobs("user-mode egress", s.cfg.Addrs, s.cfg.Jobs, s.cfg.Flows, s.jobSteps())
	if err != nil {
		return err
	}
	s.reg = reg
	return nil
}
