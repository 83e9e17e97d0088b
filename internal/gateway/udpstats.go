// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// Dropped packets are counted, not guessed: the WireGuard UDP sockets'
// buffers are read back once the device is up (an unprivileged gateway
// asks for tunnel.SocketBufferSize and gets net.core.rmem_max), a warning
// names the sysctl when they are small, and the kernel's count of
// datagrams dropped at those sockets (a full receive queue, the counter
// SO_RXQ_OVFL reports) is a metric and a line of airlock status.

// udpStats returns the WireGuard sockets' buffers and drops, and the path
// MTU probes answered and refused.
func (g *gateway) udpStats() admin.UDPStats {
	var st admin.UDPStats
	if g.udp != nil {
		if s, err := g.udp.Stats(); err == nil {
			st = admin.UDPStats{Sockets: s.Sockets, ReceiveBuffer: s.RcvBuf / 2, SendBuffer: s.SndBuf / 2, ReceiveDrops: s.Drops}
		}
	}
	if g.tr != nil {
		st.ProbesAnswered, st.ProbesRefused = g.tr.bind.ProbeCounts()
	}
	return st
}

// checkUDPBuffers logs the WireGuard sockets' buffers once they are open,
// and warns with the fix when the kernel granted less than was asked for.
func checkUDPBuffers(log *slog.Logger, w *tunnel.SocketWatch) {
	s, err := w.Stats()
	if err != nil || s.Sockets == 0 {
		log.Debug("cannot read the wireguard sockets' buffers", "err", err)
		return
	}
	rcv, snd := s.RcvBuf/2, s.SndBuf/2 // getsockopt reports twice what was granted
	if rcv >= tunnel.SocketBufferSize && snd >= tunnel.SocketBufferSize {
		log.Info("wireguard udp socket buffers", "receive", rcv, "send", snd)
		return
	}
	log.Warn("the wireguard udp sockets got smaller buffers than they asked for: bursts beyond them are dropped (airlock_udp_receive_drops_total, airlock status) and jobs' TCP sees loss",
		"receive", rcv, "send", snd, "asked", tunnel.SocketBufferSize,
		"fix", fmt.Sprintf("sysctl -w net.core.rmem_max=%d net.core.wmem_max=%d (persist in /etc/sysctl.d/), then restart the gateway", tunnel.SocketBufferSize, tunnel.SocketBufferSize))
}

// registerUDPMetrics registers the WireGuard sockets' series.
func (g *gateway) registerUDPMetrics(reg prometheus.Registerer) error {
	cs := []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "airlock_udp_receive_drops_total",
			Help: "Datagrams the kernel dropped at the gateway's WireGuard UDP sockets, mostly because their receive buffer was full (the counter SO_RXQ_OVFL reports).",
		}, func() float64 { return float64(g.udpStats().ReceiveDrops) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "airlock_udp_receive_buffer_bytes",
			Help: "Receive buffer the kernel granted the gateway's WireGuard UDP sockets (it asks for 7 MiB; net.core.rmem_max bounds an unprivileged gateway).",
		}, func() float64 { return float64(g.udpStats().ReceiveBuffer) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "airlock_udp_send_buffer_bytes",
			Help: "Send buffer the kernel granted the gateway's WireGuard UDP sockets (net.core.wmem_max bounds an unprivileged gateway).",
		}, func() float64 { return float64(g.udpStats().SendBuffer) }),
	}
	probes := prometheus.NewDesc("airlock_mtu_probes_total", "Path MTU probes from clients, by result: answered, or refused (bad or expired token, over the rate).", []string{"result"}, nil)
	cs = append(cs, collectorFunc{desc: probes, collect: func(ch chan<- prometheus.Metric) {
		st := g.udpStats()
		ch <- prometheus.MustNewConstMetric(probes, prometheus.CounterValue, float64(st.ProbesAnswered), "answered")
		ch <- prometheus.MustNewConstMetric(probes, prometheus.CounterValue, float64(st.ProbesRefused), "refused")
	}})
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("register udp metrics: %w", err)
		}
	}
	return nil
}

// collectorFunc is a prometheus.Collector of one description.
type collectorFunc struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }
func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
