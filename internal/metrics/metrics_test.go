// SPDX-License-Identifier: MIT

package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
)

func TestMetrics(t *testing.T) {
	tb := flows.New(flows.Config{})
	job := netip.MustParseAddr("100.64.0.2")
	if err := tb.Index().Add("L", job); err != nil {
		t.Fatal(err)
	}
	tb.AddJob("L", jobs.Ref{})
	f := tb.Open(flows.Key{Proto: flows.ProtoTCP, Src: netip.AddrPortFrom(job, 4000), Dst: netip.MustParseAddrPort("192.0.2.1:80")}, flows.Egress)
	f.AddOut(100, 2)
	f.AddIn(5000, 4)
	tb.Refuse(flows.Key{Proto: flows.ProtoTCP, Src: netip.AddrPortFrom(job, 4001), Dst: netip.MustParseAddrPort("192.0.2.1:80")}, flows.Egress, flows.FlowLimit)
	for _, v := range []string{flows.Allowed, flows.DNSRate, flows.DNSRate} {
		tb.DNS(flows.DNSQuery{Proto: flows.ProtoUDP, Src: netip.AddrPortFrom(job, 5353), Verdict: v, Info: flows.DNSInfo{Rcode: "NOERROR"}})
	}

	reg := prometheus.NewRegistry()
	backendCalls := 0
	m, err := New(reg, Source{
		Jobs:  func() int { return 1 },
		Flows: tb,
		Backend: func() (forward.Stats, error) {
			backendCalls++
			return forward.Stats{Limits: limits.Stats{FlowsRefused: 1, Dropped: 7}, PolicyDrops: map[string]uint64{"1:deny tcp 25": 3, "default": 9}}, nil
		},
		PortBlocks: func() (int, int) { return 1, 156 },
		Start:      time.Unix(1700000000, 0),
	})
	if err != nil {
		t.Fatal(err)
	}
	m.ObserveJoin("", 3*time.Millisecond)
	m.ObserveJoin("bad_token", time.Millisecond)

	srv := httptest.NewServer(Handler(reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	if backendCalls != 1 {
		t.Errorf("one scrape read the backend's counters %d times, want once", backendCalls)
	}
	for _, want := range []string{
		"airlock_jobs 1",
		"airlock_joins_total 1",
		`airlock_join_failures_total{reason="bad_token"} 1`,
		`airlock_join_failures_total{reason="no_address"} 0`,
		"airlock_join_duration_seconds_count 2",
		`airlock_bytes_total{direction="out"} 100`,
		`airlock_bytes_total{direction="in"} 5000`,
		`airlock_packets_total{direction="in"} 4`,
		"airlock_flows_active 1",
		`airlock_flows_total{verdict="allowed"} 1`,
		`airlock_flows_total{verdict="refused:flow-limit"} 1`,
		`airlock_limit_drops_total{limit="bandwidth"} 7`,
		`airlock_policy_drops_total{rule="1:deny tcp 25"} 3`,
		`airlock_policy_drops_total{rule="default"} 9`,
		"airlock_port_blocks 156",
		"airlock_port_blocks_used 1",
		"airlock_start_time_seconds 1.7e+09",
		`airlock_dns_queries_total{result="answered"} 1`,
		`airlock_dns_queries_total{result="refused:dns-rate"} 2`,
		`airlock_dns_queries_total{result="refused:dns-inflight"} 0`,
		"airlock_dns_log_suppressed_total 0",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
	// A second registry works too: nothing global.
	if _, err := New(prometheus.NewRegistry(), Source{}); err != nil {
		t.Errorf("second registry: %v", err)
	}
}

func TestListenLoopbackOnly(t *testing.T) {
	for _, c := range []struct {
		addr   string
		public bool
		ok     bool
	}{
		{"127.0.0.1:0", false, true},
		{"[::1]:0", false, true},
		{"localhost:0", false, true},
		{"0.0.0.0:0", false, false},
		{":0", false, false},
		{"0.0.0.0:0", true, true},
		{"nonsense", false, false},
	} {
		l, err := Listen(c.addr, c.public)
		if (err == nil) != c.ok {
			t.Errorf("Listen(%q, %v): err %v, want ok %v", c.addr, c.public, err, c.ok)
		}
		if l != nil {
			l.Close()
		}
	}
}

// TestLabelConventions scrapes every series of the package with every
// source set and checks Prometheus's conventions: no label the scrape
// adds itself (job, instance; ours would be renamed exported_job), no
// label whose name says it holds something else (uid, job_id hold ids,
// not where they came from), no negative value standing for "unknown".
func TestLabelConventions(t *testing.T) {
	tb := flows.New(flows.Config{})
	reg := prometheus.NewRegistry()
	_, err := New(reg, Source{
		Jobs:       func() int { return 1 },
		Flows:      tb,
		Backend:    func() (forward.Stats, error) { return forward.Stats{PolicyDrops: map[string]uint64{"default": 1}}, nil },
		PortBlocks: func() (int, int) { return 1, 2 },
		Start:      time.Unix(1700000000, 0),
		Identities: func() map[JobIdentity]int { return map[JobIdentity]int{{UID: "munge", Job: "claimed"}: 1} },
	})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	reserved := map[string]string{"job": "the scrape's own", "instance": "the scrape's own", "uid": "a uid", "job_id": "a batch job id"}
	seen := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				seen[l.GetName()] = true
				if why, bad := reserved[l.GetName()]; bad || strings.HasPrefix(l.GetName(), "exported_") {
					t.Errorf("%s has a label %q (%s)", mf.GetName(), l.GetName(), why)
				}
			}
			for _, v := range []float64{m.GetGauge().GetValue(), m.GetCounter().GetValue()} {
				if v < 0 {
					t.Errorf("%s%v = %v: a negative sentinel", mf.GetName(), m.GetLabel(), v)
				}
			}
		}
	}
	if !seen["uid_source"] || !seen["job_id_source"] {
		t.Errorf("labels seen %v: want airlock_jobs_identity's uid_source and job_id_source", seen)
	}
	if _, port, _ := strings.Cut(ExampleAddr, ":"); port >= "9090" && port <= "9999" && len(port) == 4 {
		t.Errorf("ExampleAddr %s: port in Prometheus's and its exporters' allocated range", ExampleAddr)
	}
}
