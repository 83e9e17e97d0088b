// SPDX-License-Identifier: MIT

package flows

import (
	"cmp"
	"context"
	"log/slog"
	"net/netip"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

// Default idle timeouts: a flow without traffic for this long is ended
// (and closed in the backend).
const (
	DefaultTCPIdle  = time.Hour
	DefaultUDPIdle  = time.Minute
	DefaultICMPIdle = 30 * time.Second
)

// Rate limits of refused-flow log records and of DNS query records, each
// per job (and one more shared by addresses of no known job), so that one
// job's flood cannot crowd another job's records out of the log.
const (
	refusalLogRate  = 10 // records per second
	refusalLogBurst = 50
	dnsLogRate      = 20
	dnsLogBurst     = 100
)

// recentLen is how many ended or refused flows Recent remembers.
const recentLen = 1024

// rateInterval is how often Run samples the jobs' rates.
const rateInterval = time.Second

// Timeouts are the idle timeouts per protocol; a zero field disables the
// timeout for that protocol.
type Timeouts struct {
	TCP, UDP, ICMP time.Duration
}

// DefaultTimeouts returns the default idle timeouts.
func DefaultTimeouts() Timeouts {
	return Timeouts{TCP: DefaultTCPIdle, UDP: DefaultUDPIdle, ICMP: DefaultICMPIdle}
}

func (t Timeouts) of(proto ipproto.Proto) time.Duration {
	switch proto {
	case ProtoTCP:
		return t.TCP
	case ProtoUDP:
		return t.UDP
	case ProtoICMP:
		return t.ICMP
	}
	return t.UDP
}

// Config configures a Table.
type Config struct {
	// Logger receives warnings (flow log write errors, rate-limited).
	Logger *slog.Logger
	// Log receives one record per ended flow and per refused flow
	// (rate-limited); nil logs nothing.
	Log RecordWriter
	// Bulk lists the known-good bulk destinations: their flows are
	// counted per rule, not logged.
	Bulk []BulkRule
	// Idle are the idle timeouts; see DefaultTimeouts.
	Idle Timeouts
	// Jobs is the index of jobs' tunnel addresses that attributes flows
	// to jobs; the egress backend that reports to the table adds and
	// removes the addresses. nil: a fresh index (Table.Index).
	Jobs *jobs.Index
}

// RecordWriter takes flow records. WriteRecord is called from many
// goroutines; it must be safe for concurrent use.
type RecordWriter interface {
	WriteRecord(Record) error
}

// counters are cumulative traffic counts. The zero value is ready; all
// methods accept a nil receiver and do nothing.
type counters struct {
	bytesOut, bytesIn, pktsOut, pktsIn atomic.Uint64
}

func (c *counters) addOut(n, p uint64) {
	if c != nil {
		c.bytesOut.Add(n)
		c.pktsOut.Add(p)
	}
}

func (c *counters) addIn(n, p uint64) {
	if c != nil {
		c.bytesIn.Add(n)
		c.pktsIn.Add(p)
	}
}

// Traffic is a snapshot of cumulative counts.
type Traffic struct {
	BytesOut   uint64 `json:"bytes_out"`
	BytesIn    uint64 `json:"bytes_in"`
	PacketsOut uint64 `json:"packets_out"`
	PacketsIn  uint64 `json:"packets_in"`
}

func (c *counters) snapshot() Traffic {
	return Traffic{BytesOut: c.bytesOut.Load(), BytesIn: c.bytesIn.Load(), PacketsOut: c.pktsOut.Load(), PacketsIn: c.pktsIn.Load()}
}

// job is one job's entry.
type job struct {
	id  jobs.ID
	ref jobs.Ref
	// addr is the job's first tunnel address, public its egress address
	// per family (zero: none on record).
	addr   netip.Addr
	public [ipfamily.N]netip.Addr
	totals counters
	// logs are the job's own log rate limits.
	logs   logLimits
	active int    // open flows, guarded by Table.mu
	flows  uint64 // flows opened, guarded by Table.mu
	// rate sampling, guarded by Table.mu
	lastOut, lastIn uint64
	rateOut, rateIn float64 // bits per second
	start           time.Time
	bypass          jobBypass // guarded by Table.mu (bypass.go)
}

// Table is the flow table. It is safe for concurrent use; create it with
// New.
type Table struct {
	log  *slog.Logger
	out  RecordWriter
	bulk []BulkRule
	idle Timeouts
	// index maps job-side addresses to jobs.
	index *jobs.Index

	nextID atomic.Uint64
	totals counters
	// bulkTotals[i] aggregates the flows of bulk rule i.
	bulkTotals []bulkCounters

	// anon limits the records of addresses that are no known job's.
	anon    logLimits
	dns     dnsCounters
	warnLim *rate.Limiter

	// mu guards the maps below and job's guarded fields.
	mu       sync.Mutex
	recent   []Record // ring of the last recentLen logged records
	next     int      // where the next record goes in recent
	active   map[uint64]*Flow
	jobs     map[jobs.ID]*job
	opened   uint64            // flows opened since start
	verdicts map[string]uint64 // flows by verdict (allowed and refusals)
	logErrs  uint64
	bypass   map[string]*BypassStats // reported bypass totals by rule (bypass.go)
	// bypassRefused counts bypass report entries refused (bypass.go).
	bypassRefused uint64
}

type bulkCounters struct {
	counters
	flows atomic.Uint64
}

// New returns an empty table.
func New(cfg Config) *Table {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	index := cfg.Jobs
	if index == nil {
		index = new(jobs.Index)
	}
	return &Table{
		log:        log,
		index:      index,
		out:        cfg.Log,
		bulk:       cfg.Bulk,
		idle:       cfg.Idle,
		bulkTotals: make([]bulkCounters, len(cfg.Bulk)),
		anon:       newLogLimits(),
		warnLim:    rate.NewLimiter(rate.Every(10*time.Second), 1),
		active:     make(map[uint64]*Flow),
		jobs:       make(map[jobs.ID]*job),
		verdicts:   make(map[string]uint64),
	}
}

// Index returns the job index the table attributes flows with.
func (t *Table) Index() *jobs.Index { return t.index }

// AddJob registers job id, so that the flows of its tunnel addresses (the
// index's) are attributed to it with ref, and each flow's record carries
// the address of public of its family (at most one per family; unspecified
// addresses are left out) as the public address. Adding an id again
// replaces its entry (and its totals).
func (t *Table) AddJob(id jobs.ID, ref jobs.Ref, public ...netip.Addr) {
	j := &job{id: id, ref: ref, start: time.Now(), logs: newLogLimits()}
	if addrs := t.index.Addrs(id); len(addrs) > 0 {
		j.addr = addrs[0]
	}
	for _, a := range public {
		if f := ipfamily.Of(a); f != nil && !a.IsUnspecified() {
			j.public[f.Index] = a.Unmap()
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.jobs[id] = j
}

// RemoveJob forgets job id, after writing the flow log rows of its
// site-local bypass that its budget held back (bypass.go). Its active
// flows stay in the table until they end (the backend ends them as the
// job's state goes).
func (t *Table) RemoveJob(id jobs.ID) {
	t.mu.Lock()
	j := t.jobs[id]
	var rows []Record
	var refused int
	if j != nil {
		rows, refused = t.bypassEndLocked(j, time.Now())
	}
	delete(t.jobs, id)
	t.mu.Unlock()
	if j != nil {
		t.bypassWritten(rows, refused, j)
	}
}

// jobOfLocked returns the entry of the job whose tunnel address is a; nil
// for an address of no registered job. t.mu must be held.
func (t *Table) jobOfLocked(a netip.Addr) *job {
	id, ok := t.index.Lookup(a)
	if !ok {
		return nil
	}
	return t.jobs[id]
}

// jobAddr returns the job-side address of a flow.
func jobAddr(k Key, dir string) netip.Addr {
	if dir == Inbound {
		return k.Dst.Addr().Unmap()
	}
	return k.Src.Addr().Unmap()
}

// outside returns the outside end of a flow.
func outside(k Key, dir string) netip.AddrPort {
	if dir == Inbound {
		return k.Src
	}
	return k.Dst
}

// Open starts tracking an allowed flow of direction dir (Egress or
// Inbound). The caller must End it.
func (t *Table) Open(k Key, dir string) *Flow {
	now := time.Now()
	f := &Flow{
		id: t.nextID.Add(1), t: t, key: k, dir: dir, start: now,
		jaddr: jobAddr(k, dir), bulk: matchBulk(t.bulk, k.Proto, outside(k, dir)),
	}
	f.lastSeen.Store(now.UnixNano())
	t.mu.Lock()
	if j := t.jobOfLocked(f.jaddr); j != nil {
		f.job, f.ref, f.jt = j.id, j.ref, &j.totals
		f.public, f.jaddr = j.publicOf(f.jaddr), j.addr
		j.active++
		j.flows++
	}
	t.active[f.id] = f
	t.opened++
	t.verdicts[Allowed]++
	t.mu.Unlock()
	if f.bulk >= 0 {
		t.bulkTotals[f.bulk].flows.Add(1)
	}
	return f
}

// publicOf returns the job's public address of the family of a.
func (j *job) publicOf(a netip.Addr) netip.Addr {
	if f := ipfamily.Of(a); f != nil {
		return j.public[f.Index]
	}
	return netip.Addr{}
}

// attribution is what a record of a flow at job-side address a says of
// its job, and the job's log budgets; an address that is no known job's
// keeps itself as the job address and shares the anonymous budgets. t.mu
// must be held.
func (t *Table) attributionLocked(a netip.Addr) (Record, *logLimits) {
	j := t.jobOfLocked(a)
	if j == nil {
		return Record{JobAddr: addrString(a)}, &t.anon
	}
	return Record{JobAddr: addrString(j.addr), Lease: j.id, Ref: j.ref, PublicAddr: j.publicOf(a)}, &j.logs
}

// Refuse records a flow the backend or the policy refused with verdict
// (BlockExhausted, FlowLimit, NewFlowRate, Denied(rule)): it is counted
// and logged, at most refusalLogRate records per second per job (the
// job's next logged record says how many were suppressed). It does not
// allocate when the record is suppressed.
func (t *Table) Refuse(k Key, dir, verdict string) {
	now := time.Now()
	t.mu.Lock()
	t.verdicts[verdict]++
	r, lim := t.attributionLocked(jobAddr(k, dir))
	t.mu.Unlock()
	if t.out == nil {
		return
	}
	supp, ok := lim.refusal.allow(now)
	if !ok {
		return
	}
	r.ID, r.Proto, r.Src, r.Dst = t.nextID.Add(1), k.Proto.String(), k.Src.String(), k.Dst.String()
	r.Direction, r.Verdict, r.Start, r.End, r.Suppressed = dir, verdict, now, now, supp
	if b := matchBulk(t.bulk, k.Proto, outside(k, dir)); b >= 0 {
		r.Bulk = t.bulk[b].Name
	}
	t.write(r)
}

// end removes f from the active table and logs or aggregates it.
func (t *Table) end(f *Flow, reason string, now time.Time) {
	t.mu.Lock()
	delete(t.active, f.id)
	if j := t.jobs[f.job]; j != nil && &j.totals == f.jt {
		j.active--
	}
	t.mu.Unlock()
	r := f.record(now, reason)
	if f.packets != nil {
		// Packets kept by the backend reach the totals now.
		f.jt.addOut(0, r.PacketsOut)
		f.jt.addIn(0, r.PacketsIn)
		t.totals.addOut(0, r.PacketsOut)
		t.totals.addIn(0, r.PacketsIn)
	}
	if f.bulk >= 0 {
		b := &t.bulkTotals[f.bulk]
		b.addOut(r.BytesOut, r.PacketsOut)
		b.addIn(r.BytesIn, r.PacketsIn)
		return
	}
	t.write(r)
}

func (t *Table) write(r Record) {
	t.mu.Lock()
	if len(t.recent) < recentLen {
		t.recent = append(t.recent, r)
	} else {
		t.recent[t.next] = r
	}
	t.next = (t.next + 1) % recentLen
	t.mu.Unlock()
	if t.out == nil {
		return
	}
	if err := t.out.WriteRecord(r); err != nil {
		t.mu.Lock()
		t.logErrs++
		t.mu.Unlock()
		if t.warnLim.Allow() {
			t.log.Error("cannot write the flow log; flows are not being recorded", "err", err)
		}
	}
}

// Run ends idle flows and samples the jobs' rates every second until ctx
// is done; then it ends every remaining flow with EndStopped.
func (t *Table) Run(ctx context.Context) {
	tick := time.NewTicker(rateInterval)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			t.EndAll(EndStopped)
			return
		case now := <-tick.C:
			t.sweep(now)
			t.sampleRates(now.Sub(last))
			last = now
		}
	}
}

// sweep ends the flows idle for longer than their protocol's timeout,
// closing them in the backend first.
func (t *Table) sweep(now time.Time) {
	var idle []*Flow
	t.mu.Lock()
	for _, f := range t.active {
		to := t.idle.of(f.key.Proto)
		if to > 0 && now.Sub(time.Unix(0, f.lastSeen.Load())) > to {
			idle = append(idle, f)
		}
	}
	t.mu.Unlock()
	for _, f := range idle {
		f.End(EndIdle)
		if f.closer != nil {
			f.closer.Close()
		}
	}
}

func (t *Table) sampleRates(d time.Duration) {
	if d <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, j := range t.jobs {
		o, i := j.totals.bytesOut.Load(), j.totals.bytesIn.Load()
		j.rateOut = float64(o-j.lastOut) * 8 / d.Seconds()
		j.rateIn = float64(i-j.lastIn) * 8 / d.Seconds()
		j.lastOut, j.lastIn = o, i
	}
}

// EndAll ends every active flow with reason, closing it in the backend.
func (t *Table) EndAll(reason string) {
	t.mu.Lock()
	all := make([]*Flow, 0, len(t.active))
	for _, f := range t.active {
		all = append(all, f)
	}
	t.mu.Unlock()
	for _, f := range all {
		f.End(reason)
	}
}

// Filter selects flows for Active and Recent.
type Filter struct {
	// Job matches a flow's batch job id, lease id or job address (any
	// tunnel address of a live job: its flows of both families); ""
	// matches every flow.
	Job string
}

// matcher returns fl's match function; the job of an address is looked up
// once, in index.
func (fl Filter) matcher(index *jobs.Index) func(*Record) bool {
	if fl.Job == "" {
		return func(*Record) bool { return true }
	}
	var id jobs.ID
	if a, err := netip.ParseAddr(fl.Job); err == nil {
		id, _ = index.Lookup(a)
	}
	return func(r *Record) bool {
		return fl.Job == r.JobID || fl.Job == string(r.Lease) || fl.Job == r.JobAddr || (id != "" && r.Lease == id)
	}
}

// Active returns the active flows matching fl, oldest first.
func (t *Table) Active(fl Filter) []Record {
	t.mu.Lock()
	all := make([]*Flow, 0, len(t.active))
	for _, f := range t.active {
		all = append(all, f)
	}
	t.mu.Unlock()
	out := make([]Record, 0, len(all))
	match := fl.matcher(t.index)
	for _, f := range all {
		r := f.record(time.Time{}, "")
		if match(&r) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// JobStats is one job's traffic as status shows it.
type JobStats struct {
	// Addr is the job's first tunnel address.
	Addr netip.Addr `json:"addr"`
	// Lease is the job's ID.
	Lease jobs.ID `json:"lease"`
	jobs.Ref
	// PublicAddr is the job's first public address on record.
	PublicAddr netip.Addr `json:"public_addr,omitzero"`
	Traffic
	// RateOut and RateIn are the bits per second over the last second.
	RateOut     float64 `json:"rate_out_bps"`
	RateIn      float64 `json:"rate_in_bps"`
	ActiveFlows int     `json:"active_flows"`
	Flows       uint64  `json:"flows"`
	// Bypass is what the job's client reported carrying around the
	// gateway (site-local bypass), by entry.
	Bypass []BypassStats `json:"bypass,omitempty"`
}

// Jobs returns the registered jobs' statistics, by address.
func (t *Table) Jobs() []JobStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]JobStats, 0, len(t.jobs))
	for _, j := range t.jobs {
		out = append(out, JobStats{
			Addr: j.addr, Lease: j.id, Ref: j.ref, PublicAddr: cmp.Or(j.public[0], j.public[1]), Traffic: j.totals.snapshot(),
			RateOut: j.rateOut, RateIn: j.rateIn, ActiveFlows: j.active, Flows: j.flows,
			Bypass: bypassOfLocked(j),
		})
	}
	sort.Slice(out, func(i, k int) bool {
		if out[i].Addr != out[k].Addr {
			return out[i].Addr.Less(out[k].Addr)
		}
		return out[i].Lease < out[k].Lease
	})
	return out
}

// BulkStats are one bulk rule's aggregate counts.
type BulkStats struct {
	Rule  string `json:"rule"`
	Flows uint64 `json:"flows"`
	// Traffic counts the rule's ended flows.
	Traffic
}

// Stats are the table's gateway-wide counts.
type Stats struct {
	// Traffic counts every flow's bytes and packets, active ones
	// included (user-mode TCP packets once the flow ended).
	Traffic
	ActiveFlows int    `json:"active_flows"`
	Flows       uint64 `json:"flows"`
	// Verdicts counts flows by verdict: Allowed and every refusal.
	Verdicts map[string]uint64 `json:"verdicts"`
	Bulk     []BulkStats       `json:"bulk,omitempty"`
	// Bypass counts what jobs' clients reported carrying around the
	// gateway (site-local bypass), by entry; not in Traffic.
	Bypass []BypassStats `json:"bypass,omitempty"`
	// BypassRefused counts entries of bypass reports refused because
	// their counters went down.
	BypassRefused uint64 `json:"bypass_refused,omitempty"`
	// LogErrors counts records the flow log could not write.
	LogErrors uint64 `json:"log_errors"`
	// DNS counts jobs' DNS queries by result: "answered", "servfail",
	// DNSRate, DNSInflight, DNSNotQuery.
	DNS map[string]uint64 `json:"dns,omitempty"`
	// DNSLogSuppressed counts DNS query records not logged (per-job rate
	// limit).
	DNSLogSuppressed uint64 `json:"dns_log_suppressed,omitempty"`
}

// Stats returns the gateway-wide counts.
func (t *Table) Stats() Stats {
	s := Stats{Traffic: t.totals.snapshot(), Verdicts: map[string]uint64{}}
	t.mu.Lock()
	s.ActiveFlows = len(t.active)
	s.Flows = t.opened
	for k, v := range t.verdicts {
		s.Verdicts[k] = v
	}
	s.LogErrors = t.logErrs
	s.Bypass = t.bypassTotalsLocked()
	s.BypassRefused = t.bypassRefused
	t.mu.Unlock()
	s.DNS = t.dns.snapshot()
	s.DNSLogSuppressed = t.dns.suppressed.Load()
	for i := range t.bulkTotals {
		b := &t.bulkTotals[i]
		s.Bulk = append(s.Bulk, BulkStats{Rule: t.bulk[i].Name, Flows: b.flows.Load(), Traffic: b.snapshot()})
	}
	return s
}

// CountRefused adds n refusals with verdict to the counts without logging
// them: for backends that learn of refusals only as counts (kernel mode's
// nftables counters).
func (t *Table) CountRefused(verdict string, n uint64) {
	t.mu.Lock()
	t.verdicts[verdict] += n
	t.mu.Unlock()
}

// Recent returns the most recent ended and refused flows that went to the
// flow log (at most 1024; bulk flows are not among them) matching fl,
// oldest first.
func (t *Table) Recent(fl Filter) []Record {
	t.mu.Lock()
	all := make([]Record, 0, len(t.recent))
	if len(t.recent) == recentLen {
		all = append(all, t.recent[t.next:]...)
		all = append(all, t.recent[:t.next]...)
	} else {
		all = append(all, t.recent...)
	}
	t.mu.Unlock()
	out := all[:0]
	match := fl.matcher(t.index)
	for i := range all {
		if match(&all[i]) {
			out = append(out, all[i])
		}
	}
	return out
}

// CloseJob ends the active flows of job id with reason and closes them in
// the backend (a lease ended: its flows must not outlive it).
func (t *Table) CloseJob(id jobs.ID, reason string) {
	var mine []*Flow
	t.mu.Lock()
	for _, f := range t.active {
		if f.job == id && id != "" {
			mine = append(mine, f)
		}
	}
	t.mu.Unlock()
	for _, f := range mine {
		f.End(reason)
		if f.closer != nil {
			f.closer.Close()
		}
	}
}
