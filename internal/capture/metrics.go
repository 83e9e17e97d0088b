// SPDX-License-Identifier: MIT

package capture

import "github.com/prometheus/client_golang/prometheus"

// collector exports a Device's Stats as Prometheus series.
type collector struct {
	d                        *Device
	packets, bytes, drops, n *prometheus.Desc
}

// NewCollector returns a Prometheus collector of d's capture counts
// (docs/metrics.md: airlock_capture_*).
func NewCollector(d *Device) prometheus.Collector {
	l := []string{"capture"}
	return &collector{
		d:       d,
		packets: prometheus.NewDesc("airlock_capture_packets_total", "Packets queued for a capture's sink.", l, nil),
		bytes:   prometheus.NewDesc("airlock_capture_bytes_total", "Bytes (captured lengths) queued for a capture's sink.", l, nil),
		drops:   prometheus.NewDesc("airlock_capture_dropped_packets_total", "Packets a capture selected but dropped because its buffer was full (the reader is slower than the jobs).", l, nil),
		n:       prometheus.NewDesc("airlock_capture_attached", "Captures of the name attached now (a named-pipe feed is attached while a reader has the pipe open).", l, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.packets
	ch <- c.bytes
	ch <- c.drops
	ch <- c.n
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.d.Stats() {
		ch <- prometheus.MustNewConstMetric(c.packets, prometheus.CounterValue, float64(s.Packets), s.Name)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.CounterValue, float64(s.Bytes), s.Name)
		ch <- prometheus.MustNewConstMetric(c.drops, prometheus.CounterValue, float64(s.Drops), s.Name)
		ch <- prometheus.MustNewConstMetric(c.n, prometheus.GaugeValue, float64(s.Attached), s.Name)
	}
}
