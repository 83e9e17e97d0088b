// SPDX-License-Identifier: MIT

package gateway

import (
	"net"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/airlock-vpn/airlock/internal/metrics"
	"github.com/airlock-vpn/airlock/internal/version"
)

// gatewayMetrics is the gateway's metrics and their listener (nil without
// --metrics).
type gatewayMetrics struct {
	metrics  *metrics.Metrics
	registry *prometheus.Registry
	listener net.Listener
}

// newMetrics registers the gateway's metrics on cfg.Registry (or a fresh
// registry, with the Go runtime and process collectors) and opens the
// listener if one is configured. The metrics exist without a listener so
// that the join counters are always kept.
func (g *gateway) newMetrics() (gatewayMetrics, error) {
	reg := g.cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	src := metrics.Source{
		Jobs:  g.leases.Len,
		Flows: g.flows,
		PortBlocks: func() (int, int) {
			return g.leases.BlocksUsed(), g.egress.pool.Blocks()
		},
		Start:      g.started,
		Backend:    g.backend.Stats,
		Identities: g.identities,
		Issuers:    g.issuers,
	}
	m, err := metrics.New(reg, src)
	if err != nil {
		return gatewayMetrics{}, err
	}
	if err := g.egress.registerCapacityMetrics(reg); err != nil {
		return gatewayMetrics{}, err
	}
	if err := g.admin.registerTLSMetrics(reg); err != nil { // rotate.go
		return gatewayMetrics{}, err
	}
	if err := g.registerUDPMetrics(reg); err != nil { // udpstats.go
		return gatewayMetrics{}, err
	}
	v := version.Get()
	bi := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "airlock_build_info",
		Help:        "Always 1; the labels say which build of airlock the gateway runs.",
		ConstLabels: prometheus.Labels{"version": g.cfg.Version, "commit": v.Commit, "goversion": v.GoVersion},
	})
	bi.Set(1)
	if err := reg.Register(bi); err != nil {
		return gatewayMetrics{}, err
	}
	gm := gatewayMetrics{metrics: m, registry: reg}
	if g.cfg.Metrics != "" {
		if gm.listener, err = metrics.Listen(g.cfg.Metrics, g.cfg.MetricsPublic); err != nil {
			return gatewayMetrics{}, err
		}
		g.log.Info("metrics listening", "addr", gm.listener.Addr().String(), "path", "/metrics")
	}
	return gm, nil
}

// identities counts the live leases by the sources of their uid and batch
// job id (airlock_jobs_identity).
func (g *gateway) identities() map[metrics.JobIdentity]int {
	out := map[metrics.JobIdentity]int{}
	for _, l := range g.leases.Leases() {
		o := l.Owner
		k := metrics.JobIdentity{UID: identity.SourceClaimed, Job: identity.SourceClaimed}
		if a := o.Attested; a != nil {
			k.UID = a.By
			if a.Job != nil {
				k.Job = a.By
			}
		}
		out[k]++
	}
	return out
}

// issuers counts the live leases identified by a bearer token, by the
// configured name of their issuer (airlock_jobs_issuer_verified).
func (g *gateway) issuers() map[string]int {
	st := g.admit.bearer.cur.Load()
	out := map[string]int{}
	if st == nil {
		return out
	}
	for _, l := range g.leases.Leases() {
		o := l.Owner
		if o.Issued == nil {
			continue
		}
		name := "other" // an issuer a reload removed
		if is, ok := st.issuers[o.Issued.Issuer]; ok {
			name = is.Name
		}
		out[name]++
	}
	return out
}
