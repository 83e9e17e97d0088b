// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/metrics"
)

// flowFlags are the gateway's flow table, flow log and metrics flags.
type flowFlags struct {
	bulk                 bulkList
	idleTCP, idleUDP     time.Duration
	idleICMP             time.Duration
	metrics              string
	metricsPublic        bool
	log                  string
	logMaxMB, logBackups int
}

// bulkList is the repeatable --bulk flag.
type bulkList []string

func (b *bulkList) String() string { return strings.Join(*b, ",") }
func (b *bulkList) Type() string   { return "CIDR[:PORTS]" }
func (b *bulkList) Set(s string) error {
	if _, err := flows.ParseBulkRules(s); err != nil {
		return err
	}
	*b = append(*b, s)
	return nil
}

func addFlowFlags(fs *pflag.FlagSet) *flowFlags {
	f := &flowFlags{}
	fs.StringVar(&f.log, "flow-log", "", "flow log, JSON lines, one record per ended or refused flow (default STATE/flows.log; off: none)")
	fs.IntVar(&f.logMaxMB, "flow-log-max-mb", flows.DefaultLogMaxMB, "rotate the flow log when it reaches this many megabytes")
	fs.IntVar(&f.logBackups, "flow-log-backups", flows.DefaultLogMaxBackups, "rotated flow logs to keep")
	fs.Var(&f.bulk, "bulk", "known-good bulk destination CIDR[:PORT[-PORT]], e.g. 192.0.2.0/24:1094 (repeatable or comma-separated): its flows are counted per rule, not logged")
	fs.DurationVar(&f.idleTCP, "flow-idle-tcp", flows.DefaultTCPIdle, "end TCP flows idle this long (0: never)")
	fs.DurationVar(&f.idleUDP, "flow-idle-udp", flows.DefaultUDPIdle, "end UDP flows idle this long (0: never)")
	fs.DurationVar(&f.idleICMP, "flow-idle-icmp", flows.DefaultICMPIdle, "end ICMP echo flows idle this long (0: never)")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics on HOST:PORT/metrics, e.g. "+metrics.ExampleAddr+" (default off; loopback only unless --metrics-public)")
	fs.BoolVar(&f.metricsPublic, "metrics-public", false, "allow --metrics on a non-loopback address")
	return f
}

// parse fills in c's flow and metrics settings.
func (f *flowFlags) parse(c *gateway.Config) error {
	for _, s := range f.bulk {
		rs, err := flows.ParseBulkRules(s)
		if err != nil {
			return fmt.Errorf("--bulk: %w", err)
		}
		c.Flows.Bulk = append(c.Flows.Bulk, rs...)
	}
	if f.logMaxMB < 1 || f.logBackups < 1 {
		return fmt.Errorf("--flow-log-max-mb and --flow-log-backups: want at least 1")
	}
	c.Flows.Log, c.Flows.LogMaxMB, c.Flows.LogBackups = f.log, f.logMaxMB, f.logBackups
	idle := func(flag string, d time.Duration) (time.Duration, error) {
		switch {
		case d < 0:
			return 0, fmt.Errorf("%s %v: want 0 (never) or a positive duration", flag, d)
		case d == 0:
			return -1, nil // gateway.FlowsConfig: negative is no timeout
		}
		return d, nil
	}
	var err error
	if c.Flows.Idle.TCP, err = idle("--flow-idle-tcp", f.idleTCP); err != nil {
		return err
	}
	if c.Flows.Idle.UDP, err = idle("--flow-idle-udp", f.idleUDP); err != nil {
		return err
	}
	if c.Flows.Idle.ICMP, err = idle("--flow-idle-icmp", f.idleICMP); err != nil {
		return err
	}
	c.Metrics, c.MetricsPublic = f.metrics, f.metricsPublic
	return nil
}
