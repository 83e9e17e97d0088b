// SPDX-License-Identifier: MIT

package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/airlock-vpn/airlock/internal/gateway"
)

func TestFlowFlags(t *testing.T) {
	for _, c := range []struct {
		args    []string
		ok      bool
		bulk    int
		idleUDP time.Duration
		metrics string
	}{
		{nil, true, 0, time.Minute, ""},
		{[]string{"--bulk", "192.0.2.0/24:1094", "--bulk", "198.51.100.1,198.51.100.2:80-81"}, true, 3, time.Minute, ""},
		{[]string{"--flow-idle-udp", "0", "--metrics", "127.0.0.1:8446"}, true, 0, -1, "127.0.0.1:8446"},
		{[]string{"--flow-idle-udp", "10s"}, true, 0, 10 * time.Second, ""},
		{[]string{"--bulk", "nonsense"}, false, 0, 0, ""},
		{[]string{"--flow-idle-tcp", "-1s"}, false, 0, 0, ""},
		{[]string{"--flow-log-max-mb", "0"}, false, 0, 0, ""},
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		ff := addFlowFlags(fs)
		var cfg gateway.Config
		err := fs.Parse(c.args)
		if err == nil {
			err = ff.parse(&cfg)
		}
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok %v", c.args, err, c.ok)
			continue
		}
		if !c.ok {
			continue
		}
		if len(cfg.Flows.Bulk) != c.bulk || cfg.Flows.Idle.UDP != c.idleUDP || cfg.Metrics != c.metrics {
			t.Errorf("%q: bulk %d idle udp %v metrics %q, want %d %v %q", c.args, len(cfg.Flows.Bulk), cfg.Flows.Idle.UDP, cfg.Metrics, c.bulk, c.idleUDP, c.metrics)
		}
	}
}
