// SPDX-License-Identifier: MIT

package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestAdminFlowsAndKick runs a job through an in-process gateway and checks
// what the admin API, the flow log and the metrics say about its flow, and
// that a kick ends its lease so that its next renewal learns why.
func TestAdminFlowsAndKick(t *testing.T) {
	const size = 3 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	release := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write(make([]byte, size))
				<-release // hold the flow open until the test has seen it
			}()
		}
	}()
	reg := prometheus.NewRegistry()
	g := startGatewayWith(t, func(c *Config) { c.Registry = reg }, remote{job: "198.51.100.7:80", real: ln.Addr().String()})
	j := joinJob(t, g, newToken(t, g))
	ac, err := admin.Dial(g.state)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c, err := j.net.DialContext(ctx, "tcp", "198.51.100.7:80")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	fl, err := ac.Flows(ctx, "t1", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(fl.Active) != 1 || fl.Active[0].Dst != "198.51.100.7:80" || fl.Active[0].BytesIn != size || fl.Recent != nil {
		t.Fatalf("active flows of job t1: %+v, want one to 198.51.100.7:80 with %d bytes in", fl, size)
	}
	close(release)
	io.Copy(io.Discard, c)
	c.Close()

	// The ended flow reaches the flow log.
	var rec flows.Record
	topology.Poll(5*time.Second, func() bool {
		rec = lastRecord(t, filepath.Join(g.state, FlowLogFile))
		return rec.ID != 0
	})
	if rec.BytesIn != size || rec.JobID != "t1" || rec.Verdict != flows.Allowed || rec.End.IsZero() {
		t.Fatalf("flow log record %+v, want %d bytes in for job t1", rec, size)
	}

	st, err := ac.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode != EgressUser || len(st.Jobs) != 1 || st.Jobs[0].JobID != "t1" || st.Jobs[0].BytesIn != size || st.Totals.BytesIn != size {
		t.Fatalf("status %+v, want one job t1 with %d bytes in", st, size)
	}
	// The first handshake is read every 250 ms.
	var hsCount uint64
	topology.Poll(3*time.Second, func() bool {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "airlock_wireguard_first_handshake_seconds" {
				hsCount = mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
		return hsCount != 0
	})
	if hsCount != 1 {
		t.Errorf("airlock_wireguard_first_handshake_seconds count %d, want 1", hsCount)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		if mf.GetName() != "airlock_bytes_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == "in" {
				found = true
				if v := m.GetCounter().GetValue(); v != size {
					t.Errorf("airlock_bytes_total{direction=in} = %v, want %d", v, size)
				}
			}
		}
	}
	if !found {
		t.Error("no airlock_bytes_total{direction=in}")
	}

	if _, err := ac.Kick(ctx, admin.KickRequest{Job: "nosuchjob"}); !errors.Is(err, admin.ErrNoSuchJob) {
		t.Errorf("kick of an unknown job: got %v, want ErrNoSuchJob", err)
	}
	res, err := ac.Kick(ctx, admin.KickRequest{Job: "t1", Reason: "maintenance"})
	if err != nil || len(res.Kicked) != 1 || res.Kicked[0].Lease != j.lease.ID {
		t.Fatalf("kick t1: %+v, %v", res, err)
	}
	_, err = j.cc.Renew(ctx, control.LeaseRef{ID: j.lease.ID, Secret: j.lease.Secret})
	if !errors.Is(err, control.ErrLeaseEnded) || !strings.Contains(err.Error(), "maintenance") {
		t.Errorf("renew after kick: got %v, want ErrLeaseEnded naming the reason", err)
	}
	if st, _ := ac.Status(ctx); len(st.Jobs) != 0 {
		t.Errorf("jobs after kick: %+v", st.Jobs)
	}
}

// lastRecord returns the last record of the flow log at path (zero if
// none).
func lastRecord(t *testing.T, path string) flows.Record {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var r flows.Record
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("flow log line %q: %v", sc.Text(), err)
		}
	}
	return r
}
