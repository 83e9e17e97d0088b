// SPDX-License-Identifier: MIT

// Package metrics exports the gateway's Prometheus metrics
// (github.com/prometheus/client_golang). Everything registers on a registry
// the caller passes in; nothing uses the default registry or other globals.
// docs/metrics.md lists every series.
//
// Two kinds of series: counters the gateway updates as things happen
// (joins, join latency), and series read at scrape time from the gateway's
// own state through [Source] (jobs, flows, bytes, packets, limits, port
// blocks, policy drops), so the values always agree with `airlock status`.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
)

// Namespace prefixes every series name.
const Namespace = "airlock"

// Source is what the scrape-time series read. Every field may be nil.
type Source struct {
	// Jobs returns the number of live leases.
	Jobs func() int
	// Flows is the flow table.
	Flows *flows.Table
	// Backend returns the egress backend's counters (its limits' and
	// each policy rule's drops), read once per scrape. Counts must never
	// decrease while the gateway runs, except that a rule removed by a
	// reload may disappear. It is called concurrently with everything
	// else and must not block.
	Backend func() (forward.Stats, error)
	// PortBlocks returns the port blocks in use and in total.
	PortBlocks func() (used, total int)
	// Start is when the gateway started.
	Start time.Time
	// Identities counts the live leases by where their uid and their
	// batch job id come from: JobIdentity keys, "claimed" or the means
	// of attestation ("munge").
	Identities func() map[JobIdentity]int
	// Issuers counts the live leases identified by an issuer-verified
	// bearer token, by the issuer's configured name.
	Issuers func() map[string]int
}

// JobIdentity is where a job's uid and batch job id come from, the labels
// uid_source and job_id_source of airlock_jobs_identity (not "job", the
// label Prometheus gives every series of a scrape job).
type JobIdentity struct{ UID, Job string }

// ExampleAddr is the --metrics address the docs and messages show: a
// port outside 9100-9999, which Prometheus's default port allocations
// list has given away entirely (9108 is the Graphite exporter's).
const ExampleAddr = "127.0.0.1:8446"

// Metrics holds the gateway's metrics. It is safe for concurrent use.
type Metrics struct {
	clientVersions *prometheus.CounterVec
	versionMu      sync.Mutex
	versionSeen    map[string]bool
	joins          prometheus.Counter
	joinFailures   *prometheus.CounterVec
	joinSeconds    prometheus.Histogram
	handshake      prometheus.Histogram
	noHandshake    prometheus.Counter
	col            *collector
}

// New registers the gateway's metrics on reg.
func New(reg prometheus.Registerer, src Source) (*Metrics, error) {
	m := &Metrics{
		versionSeen: map[string]bool{},
		clientVersions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "joins_by_client_version_total",
			Help: "Join requests by the client's airlock version (major.minor; none: a client before the version exchange; dev: a development build), served or refused.",
		}, []string{"version"}),
		joins: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "joins_total",
			Help: "Join requests that got a lease.",
		}),
		joinFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "join_failures_total",
			Help: "Join requests refused, by reason (the control API's error code: bad_token, bad_request, rate_limited, no_address, internal).",
		}, []string{"reason"}),
		joinSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "join_duration_seconds",
			Help:    "Time the gateway took to answer join requests (token check, lease, egress set-up, history record), successful or not.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}),
		handshake: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "wireguard_first_handshake_seconds",
			Help:    "Time from a job's lease grant to its first completed WireGuard handshake (as WireGuard timed it).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		noHandshake: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "wireguard_handshake_missing_total",
			Help: "Joins whose first WireGuard handshake did not complete within 30 s (UDP to the gateway blocked?).",
		}),
		col: newCollector(src),
	}
	for _, c := range []prometheus.Collector{m.clientVersions, m.joins, m.joinFailures, m.joinSeconds, m.handshake, m.noHandshake, m.col} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	// The reasons appear at zero before the first failure, so that rate()
	// works from the start.
	for _, r := range []string{"bad_token", "bad_request", "rate_limited", "no_address", "internal"} {
		m.joinFailures.WithLabelValues(r)
	}
	return m, nil
}

// ObserveJoin records one answered join request: code is the control API's
// error code, "" for success. It fits control.ServerConfig.OnJoin.
// ObserveClientVersion counts a join request by its client's version
// label (version.Label: major.minor, "none" or "dev"), at most
// maxVersionLabels distinct ones, then "other".
func (m *Metrics) ObserveClientVersion(label string) {
	m.versionMu.Lock()
	if !m.versionSeen[label] {
		if len(m.versionSeen) >= maxVersionLabels {
			label = "other"
		} else {
			m.versionSeen[label] = true
		}
	}
	m.versionMu.Unlock()
	m.clientVersions.WithLabelValues(label).Inc()
}

// maxVersionLabels bounds the client version labels: clients choose them.
const maxVersionLabels = 32

func (m *Metrics) ObserveJoin(code string, took time.Duration) {
	m.joinSeconds.Observe(took.Seconds())
	if code == "" {
		m.joins.Inc()
		return
	}
	m.joinFailures.WithLabelValues(code).Inc()
}

// ObserveHandshake records the time from a lease grant to the job's first
// WireGuard handshake.
func (m *Metrics) ObserveHandshake(d time.Duration) { m.handshake.Observe(d.Seconds()) }

// HandshakeMissing counts a join whose first handshake never came.
func (m *Metrics) HandshakeMissing() { m.noHandshake.Inc() }

// collector reads the scrape-time series from a Source.
type collector struct {
	src Source

	jobs, flowsActive, portBlocks, portBlocksUsed, start     *prometheus.Desc
	bytes, packets, flowsTotal, bulkFlows, bulkBytes, logErr *prometheus.Desc
	limitDrops, policyDrops, dnsQueries, dnsLogSupp          *prometheus.Desc
	bypassFlows, bypassBytes, bypassRefused                  *prometheus.Desc
	identities, issuers                                      *prometheus.Desc
}

func desc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, labels, nil)
}

func newCollector(src Source) *collector {
	return &collector{
		src:            src,
		jobs:           desc("jobs", "Jobs with a live lease."),
		flowsActive:    desc("flows_active", "Flows open now."),
		portBlocks:     desc("port_blocks", "Egress port blocks in the plan."),
		portBlocksUsed: desc("port_blocks_used", "Egress port blocks leased to jobs."),
		start:          desc("start_time_seconds", "When the gateway started, in seconds since the Unix epoch."),
		bytes:          desc("bytes_total", "Bytes of jobs' flows, by direction: out = sent by jobs, in = received by jobs. User mode counts transport payload, kernel mode IP bytes.", "direction"),
		packets:        desc("packets_total", "Packets of jobs' flows, by direction (see docs/metrics.md for how each mode counts them).", "direction"),
		flowsTotal:     desc("flows_total", "Flows by verdict: allowed (opened), refused:<limit> (refused by a limit or an exhausted port block), denied:<rule> (denied by the policy).", "verdict"),
		bulkFlows:      desc("bulk_flows_total", "Flows to known-good bulk destinations (--bulk), by rule; counted, not logged.", "rule"),
		bulkBytes:      desc("bulk_bytes_total", "Bytes of ended flows to bulk destinations, by rule and direction.", "rule", "direction"),
		logErr:         desc("flow_log_errors_total", "Flow records the flow log could not write."),
		limitDrops:     desc("limit_drops_total", "What the traffic limits refused or dropped: flow_limit and new_flow_rate count refused flows, bandwidth counts dropped packets (UDP over the rate in user mode, shaper queue drops in kernel mode).", "limit"),
		policyDrops:    desc("policy_drops_total", "Flows or packets dropped by each policy rule.", "rule"),
		dnsQueries:     desc("dns_queries_total", "Jobs' DNS queries to the gateway's relay, by result: answered, servfail (no upstream answered), refused:dns-rate and refused:dns-inflight (over the job's DNS limits, answered REFUSED).", "result"),
		dnsLogSupp:     desc("dns_log_suppressed_total", "DNS query records not written to the flow log because their job was over its log rate."),
		bypassFlows:    desc("bypass_flows_total", "Flows jobs' clients carried around the gateway (site-local bypass), as they reported them at renewals, by bypass entry.", "rule"),
		bypassBytes:    desc("bypass_bytes_total", "Payload bytes of bypassed flows, as jobs' clients reported them, by bypass entry and direction.", "rule", "direction"),
		bypassRefused:  desc("bypass_reports_refused_total", "Entries of jobs' bypass reports refused because their cumulative counters went down."),
		identities:     desc("jobs_identity", "Jobs with a live lease by where their uid and batch job id come from: claimed by the client, or attested (munge).", "uid_source", "job_id_source"),
		issuers:        desc("jobs_issuer_verified", "Jobs with a live lease identified by a bearer token its issuer vouched for, by the issuer's configured name.", "issuer"),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.jobs, c.flowsActive, c.portBlocks, c.portBlocksUsed, c.start,
		c.bytes, c.packets, c.flowsTotal, c.bulkFlows, c.bulkBytes, c.logErr, c.limitDrops, c.policyDrops,
		c.dnsQueries, c.dnsLogSupp, c.bypassFlows, c.bypassBytes, c.bypassRefused, c.identities, c.issuers} {
		ch <- d
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	if !c.src.Start.IsZero() {
		gauge(ch, c.start, float64(c.src.Start.UnixNano())/1e9)
	}
	if c.src.Jobs != nil {
		gauge(ch, c.jobs, float64(c.src.Jobs()))
	}
	if c.src.Identities != nil {
		for k, n := range c.src.Identities() {
			gauge(ch, c.identities, float64(n), k.UID, k.Job)
		}
	}
	if c.src.Issuers != nil {
		for k, n := range c.src.Issuers() {
			gauge(ch, c.issuers, float64(n), k)
		}
	}
	if c.src.PortBlocks != nil {
		used, total := c.src.PortBlocks()
		gauge(ch, c.portBlocks, float64(total))
		gauge(ch, c.portBlocksUsed, float64(used))
	}
	if c.src.Flows != nil {
		c.collectFlows(ch, c.src.Flows.Stats())
	}
	if c.src.Backend != nil {
		if st, err := c.src.Backend(); err == nil {
			counter(ch, c.limitDrops, st.Limits.FlowsRefused, "flow_limit")
			counter(ch, c.limitDrops, st.Limits.RateRefused, "new_flow_rate")
			counter(ch, c.limitDrops, st.Limits.Dropped, "bandwidth")
			for rule, n := range st.PolicyDrops {
				counter(ch, c.policyDrops, n, rule)
			}
		}
	}
}

// collectFlows sends the flow table's totals st: flows, bytes, packets,
// verdicts, bulk and bypass rules, flow log and DNS relay.
func (c *collector) collectFlows(ch chan<- prometheus.Metric, st flows.Stats) {
	gauge(ch, c.flowsActive, float64(st.ActiveFlows))
	counter(ch, c.bytes, st.BytesOut, "out")
	counter(ch, c.bytes, st.BytesIn, "in")
	counter(ch, c.packets, st.PacketsOut, "out")
	counter(ch, c.packets, st.PacketsIn, "in")
	if _, ok := st.Verdicts[flows.Allowed]; !ok {
		st.Verdicts[flows.Allowed] = 0
	}
	for v, n := range st.Verdicts {
		counter(ch, c.flowsTotal, n, v)
	}
	for _, b := range st.Bulk {
		counter(ch, c.bulkFlows, b.Flows, b.Rule)
		counter(ch, c.bulkBytes, b.BytesOut, b.Rule, "out")
		counter(ch, c.bulkBytes, b.BytesIn, b.Rule, "in")
	}
	for _, b := range st.Bypass {
		counter(ch, c.bypassFlows, b.Flows, b.Rule)
		counter(ch, c.bypassBytes, b.BytesOut, b.Rule, "out")
		counter(ch, c.bypassBytes, b.BytesIn, b.Rule, "in")
	}
	counter(ch, c.bypassRefused, st.BypassRefused)
	counter(ch, c.logErr, st.LogErrors)
	for _, r := range []string{"answered", "servfail", flows.DNSRate, flows.DNSInflight, flows.DNSNotQuery} {
		counter(ch, c.dnsQueries, st.DNS[r], r)
	}
	counter(ch, c.dnsLogSupp, st.DNSLogSuppressed)
}

// gauge sends gauge d's value v with labels l.
func gauge(ch chan<- prometheus.Metric, d *prometheus.Desc, v float64, l ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, l...)
}

// counter sends counter d's value v with labels l.
func counter(ch chan<- prometheus.Metric, d *prometheus.Desc, v uint64, l ...string) {
	ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), l...)
}

// Handler serves g's metrics in the Prometheus exposition format.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

// Listen opens the metrics listener on addr (HOST:PORT). It refuses an
// address that is not loopback unless public is true: metrics say who
// runs what, and an admin must open them to the network on purpose.
func Listen(addr string, public bool) (net.Listener, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("bad --metrics %q: want HOST:PORT, e.g. %s", addr, ExampleAddr)
	}
	if !public {
		ip := net.ParseIP(host)
		if host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return nil, fmt.Errorf("--metrics %s is not a loopback address: metrics name jobs and destinations; use 127.0.0.1:PORT, or add --metrics-public to serve them on %s on purpose", addr, host)
		}
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	return l, nil
}

// Serve serves /metrics for g on l until ctx is done.
func Serve(ctx context.Context, l net.Listener, g prometheus.Gatherer) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", Handler(g))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}
