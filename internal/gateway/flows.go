// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"path/filepath"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

// FlowLogFile is the flow log's default name inside the state directory.
const FlowLogFile = "flows.log"

// FlowLogOff as FlowsConfig.Log turns the flow log off.
const FlowLogOff = "off"

// FlowsConfig configures the flow table and the flow log. The zero value
// logs to DIR/flows.log with the default rotation and idle timeouts.
type FlowsConfig struct {
	// Log is the flow log's path: "" means DIR/flows.log, FlowLogOff
	// none.
	Log string
	// LogMaxMB is the size at which the log is rotated, LogBackups how
	// many rotated files are kept; 0 means flows.DefaultLogMaxMB and
	// flows.DefaultLogMaxBackups.
	LogMaxMB, LogBackups int
	// Bulk are the known-good bulk destinations: counted per rule, not
	// logged one by one.
	Bulk []flows.BulkRule
	// Idle are the idle timeouts per protocol; a zero field means its
	// default (flows.DefaultTimeouts), a negative one no timeout.
	Idle flows.Timeouts
}

// idle returns the effective idle timeouts.
func (c FlowsConfig) idle() flows.Timeouts {
	d := flows.DefaultTimeouts()
	pick := func(v, def int64) int64 {
		switch {
		case v == 0:
			return def
		case v < 0:
			return 0
		}
		return v
	}
	return flows.Timeouts{
		TCP:  durationOf(pick(int64(c.Idle.TCP), int64(d.TCP))),
		UDP:  durationOf(pick(int64(c.Idle.UDP), int64(d.UDP))),
		ICMP: durationOf(pick(int64(c.Idle.ICMP), int64(d.ICMP))),
	}
}

// openFlows opens the flow log and makes the flow table on job index
// index. The returned close function closes the log.
func openFlows(cfg Config, index *jobs.Index) (*flows.Table, func() error, error) {
	fc := cfg.Flows
	var w flows.RecordWriter
	closeLog := func() error { return nil }
	path := fc.Log
	if path == "" {
		path = filepath.Join(cfg.StateDir, FlowLogFile)
	}
	if path != FlowLogOff {
		l, err := flows.OpenLog(path, fc.LogMaxMB, fc.LogBackups)
		if err != nil {
			return nil, nil, fmt.Errorf("%w (set --flow-log to a writable file, or --flow-log off)", err)
		}
		w, closeLog = l, l.Close
	}
	tb := flows.New(flows.Config{
		Logger: cfg.Logger.With("component", "flows"),
		Log:    w,
		Bulk:   fc.Bulk,
		Idle:   fc.idle(),
		Jobs:   index,
	})
	return tb, closeLog, nil
}
