// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/flows"
)

// flowsDNSPerSec is --job-dns-queries-per-sec for the jobs of token
// limitedToken in TestFlows (with --job-dns-max-inflight 2).
const flowsDNSPerSec = 10

// checkDNSLimits floods the gateway's DNS relay from a job of token
// limited (DNS limits flowsDNSPerSec/s, 2 in flight) for 3 s while a job of
// the env's token (default limits) resolves zoneName: the flooder is
// answered REFUSED beyond its limits, counted in airlock_dns_queries_total,
// and logged at most within its own log budget; the other job's query is
// answered and is in the flow log with its name, type, answer count and
// rcode.
func checkDNSLimits(t *testing.T, e *env, mode, limited string, metricsPort int) {
	if limited == "" {
		limited = e.createToken(t, limitedToken)
	}
	flooder, quiet := "flows-"+mode+"-dnsflood", "flows-"+mode+"-dnsquiet"
	const dur = 3 * time.Second
	p := e.startWith(t, runOpts{token: limited, env: []string{"AIRLOCK_JOB_ID=" + flooder}}, e.peer, "dnsflood", zoneName, dur.String(), "4")
	time.Sleep(dur / 2) // the flood is under way
	code, out, stderr := e.runWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=" + quiet}}, e.peer, "dnsflood", zoneName, "0s", "1")
	if code != 0 || out != "noerror=1 refused=0 other=0 timeout=0\n" {
		t.Errorf("quiet job's query during the flood: exit %d, %q, want noerror=1%s", code, out, e.diag(stderr))
	}
	if _, err := p.Wait(30 * time.Second); err != nil {
		t.Fatalf("flooding job: %v%s", err, e.diag(p.Stderr()))
	}
	var ok, refused, other, timeout int
	if _, err := fmt.Sscanf(p.Stdout(), "noerror=%d refused=%d other=%d timeout=%d", &ok, &refused, &other, &timeout); err != nil {
		t.Fatalf("flooding job's output %q: %v%s", p.Stdout(), err, e.diag(p.Stderr()))
	}
	t.Logf("%s mode: DNS flood at %d/s allowed for %v: noerror=%d refused=%d other=%d timeout=%d", mode, flowsDNSPerSec, dur, ok, refused, other, timeout)
	// The bucket's burst plus the rate over the flood, with slack for
	// the job's start.
	if maxOK := flowsDNSPerSec + flowsDNSPerSec*int(dur/time.Second+2); ok > maxOK || refused < 10*ok {
		t.Errorf("flood: %d answered, %d refused; want at most %d answered and far more refused", ok, refused, maxOK)
	}
	m := e.metrics(t, metricsPort)
	gotRefused := m[fmt.Sprintf(`airlock_dns_queries_total{result="%s"}`, flows.DNSRate)] +
		m[fmt.Sprintf(`airlock_dns_queries_total{result="%s"}`, flows.DNSInflight)]
	if gotRefused < float64(refused) || m[`airlock_dns_queries_total{result="answered"}`] < float64(ok+1) {
		t.Errorf("metrics: %v refused, %v answered; want at least the %d refused and %d answered the jobs saw",
			gotRefused, m[`airlock_dns_queries_total{result="answered"}`], refused, ok+1)
	}
	var floodLogged, quietLogged int
	for _, r := range readRecords(t, filepath.Join(e.state, gatewayFlowLog)) {
		switch {
		case r.JobID == flooder && r.DNS != nil:
			floodLogged++
		case r.JobID == quiet && r.DNS != nil && r.DNS.Name == zoneName+"." && r.DNS.Type == "A" &&
			r.DNS.Answers == 1 && r.DNS.Rcode == "NOERROR" && r.Verdict == flows.Allowed && r.Token == "e2e":
			quietLogged++
		}
	}
	// Per job: 100 answered records in a burst (and 20/s), 50 refusal
	// records (and 10/s): far fewer than the flood's queries.
	if floodLogged == 0 || floodLogged > 100+50+30*int(dur/time.Second+2) {
		t.Errorf("flow log: %d DNS records of the flooding job (%d queries), want some, within its own log budget", floodLogged, ok+refused)
	}
	if quietLogged != 1 {
		t.Errorf("flow log: %d records of the quiet job's query, want 1 (name %s., type A, 1 answer, NOERROR)", quietLogged, zoneName)
	}
	t.Logf("%s mode: flow log holds %d DNS records of the flooder's %s queries", mode, floodLogged, strconv.Itoa(ok+refused))
}
