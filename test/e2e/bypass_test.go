// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/test/topology"
)

// bypassMetricsPort is TestBypass's metrics listener in dmz.
const bypassMetricsPort = 9111

// bypassConfig is TestBypass's gateway config: the site network is
// allowed by the policy (withAllow), squid's and the origin's ports on
// the site address are bypassed (withBypass), and names under site.test
// are resolved by the site's resolver.
func bypassConfig(withAllow, withBypass bool, squidPort, httpPort int) string {
	s := "version = 1\n"
	if withAllow {
		s += fmt.Sprintf("\n[[policy.rule]]\nname = \"site\"\naction = \"allow\"\nto = [\"%s\"]\n", topology.SitePrefix)
	}
	if withBypass {
		s += fmt.Sprintf("\n[[bypass]]\nname = \"squid\"\nto = [\"%s\"]\nproto = \"tcp\"\nports = [%d, %d]\n", topology.SiteAddr, squidPort, httpPort)
		s += fmt.Sprintf("\n[[bypass]]\nname = \"site-ping\"\nto = [\"%s\"]\nproto = \"icmp\"\n", topology.SiteAddr)
	}
	s += fmt.Sprintf("\n[dns]\nlocal_domains = [\"site.test\"]\nresolvers = [\"%s\"]\n", topology.SiteAddr)
	return s
}

// TestBypass checks site-local bypass on a topology with a site network
// that cn reaches directly and the gateway cannot, in netns mode and in
// the seccomp and preload fallbacks:
//   - a job downloads a file from squid on the site network, naming the
//     proxy by a local domain name: the bytes never reach the gateway (its
//     flow counters do not move), the client reports the flow and its bytes
//     (status, metrics, a flow log row marked bypass);
//   - DNS over TCP: a local name is answered by the site's resolver,
//     another by the gateway's;
//   - netns mode: a ping of the site address is answered through the
//     node's ping socket and counted under its entry;
//   - a destination outside the bypass still goes through the gateway;
//   - a local name that resolves outside the entries (rebinding) is not
//     bypassed: it goes through the gateway;
//   - the site address on a port the entry excludes, and another site
//     address, cannot be reached;
//   - a reload that removes the entry (and the policy's allow) makes a
//     running job's next connection go through the gateway, which refuses
//     it (builtin-private).
func TestBypass(t *testing.T) {
	topology.RequireRoot(t)
	u := topology.EnsureUser(t)
	dir := topology.TempDir(t)
	if err := os.Chown(dir, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "gateway.toml")
	var squidPort, originPort int
	var originSHA map[string]string
	var closedPort int
	write := func(allow, byp bool) {
		t.Helper()
		if err := os.WriteFile(file, []byte(bypassConfig(allow, byp, squidPort, originPort)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e := newEnvHook(t, modeUser, []topology.Option{topology.WithSite()}, func(e *env) []string {
		tp := e.tp
		originPort, originSHA = tp.StartHTTPIn(t, tp.Site, topology.SiteAddr, map[string]int64{"small": smallSize})
		squidPort = tp.StartSquid(t)
		closedPort = tp.Port()
		tp.StartTCPListener(t, tp.Site, netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(closedPort)))
		tp.StartDNSIn(t, tp.Site, topology.SiteAddr, map[string]netip.Addr{
			"squid.site.test.": topology.SiteAddr,
			"other.site.test.": topology.SiteAddr2,
			"far.site.test.":   tp.INETAddr, // a local name pointing outside
		})
		write(true, true)
		return []string{"--config", file, "--metrics", fmt.Sprintf("127.0.0.1:%d", bypassMetricsPort)}
	})
	topology.BuildPreload(t) // next to the airlock binary, where airlock run finds it
	tp := e.tp
	// The client's ping sockets in cn (netns mode's ICMP bypass).
	if code, out, stderr := tp.Run(t, 10*time.Second, tp.CN, nil, "sysctl", "-q", "-w", `net.ipv4.ping_group_range=0 2147483647`); code != 0 {
		t.Fatalf("sysctl ping_group_range in cn: exit %d %s %s", code, out, stderr)
	}
	if !tp.TCPCheck(t, tp.CN, nil, netip.AddrPortFrom(topology.SiteAddr, uint16(closedPort))) {
		t.Fatal("the site's listener does not answer from cn")
	}
	if tp.TCPCheck(t, tp.DMZ, nil, netip.AddrPortFrom(topology.SiteAddr, uint16(closedPort))) {
		t.Fatal("the site network answers from dmz: the test would prove nothing")
	}
	// reload puts a new config in force; new jobs get it at join, running
	// ones through their lease watch, which carries it at once: wait
	// gives that a moment on a loaded machine.
	reload := func(t *testing.T, allow, byp bool, wait time.Duration) {
		t.Helper()
		write(allow, byp)
		if code, out, stderr := e.admin(t, "gateway", "reload", "--state", e.state); code != 0 {
			t.Fatalf("airlock gateway reload: exit %d %s %s", code, out, stderr)
		}
		time.Sleep(wait)
	}
	viaSquid := fmt.Sprintf("http://%s:%d/small", topology.SiteAddr, originPort)
	squid := fmt.Sprintf("http://squid.site.test:%d", squidPort)
	curl := func(args ...string) []string {
		return append([]string{"curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code} %{size_download}\n"}, args...)
	}

	for _, mode := range []string{"netns", "seccomp", "preload"} {
		t.Run(mode, func(t *testing.T) {
			reload(t, true, true, 0)
			o := runOpts{flags: []string{"--mode", mode}}
			m0 := e.metrics(t, bypassMetricsPort)
			st0 := e.status(t)

			// The download through squid, named by a local domain.
			code, out, stderr := e.runWith(t, o, "sh", "-c",
				fmt.Sprintf("curl -sS --max-time 20 -x %s %s | sha256sum", squid, viaSquid))
			if code != 0 || !strings.HasPrefix(out, originSHA["small"]) {
				t.Fatalf("download through squid.site.test: exit %d, %q, want sha256 %s%s", code, out, originSHA["small"], e.diag(stderr))
			}
			st1 := e.status(t)
			if st1.Totals.Flows != st0.Totals.Flows || st1.Totals.BytesIn != st0.Totals.BytesIn || st1.Totals.BytesOut != st0.Totals.BytesOut {
				t.Errorf("gateway totals moved during the bypassed download: flows %d → %d, in %d → %d, out %d → %d",
					st0.Totals.Flows, st1.Totals.Flows, st0.Totals.BytesIn, st1.Totals.BytesIn, st0.Totals.BytesOut, st1.Totals.BytesOut)
			}
			m1 := e.metrics(t, bypassMetricsPort)
			flowsKey, inKey := `airlock_bypass_flows_total{rule="squid"}`, `airlock_bypass_bytes_total{direction="in",rule="squid"}`
			dFlows, dIn := m1[flowsKey]-m0[flowsKey], m1[inKey]-m0[inKey]
			t.Logf("%s: bypass reported %v flows, %v bytes in (file %d bytes)", mode, dFlows, dIn, smallSize)
			if dFlows != 1 || dIn < smallSize || dIn > smallSize+16<<10 {
				t.Errorf("bypass metrics grew by %v flows and %v bytes in, want 1 flow and %d bytes plus headers", dFlows, dIn, smallSize)
			}
			var bst *flows.BypassStats
			for i := range st1.Totals.Bypass {
				if st1.Totals.Bypass[i].Rule == "squid" {
					bst = &st1.Totals.Bypass[i]
				}
			}
			if bst == nil || float64(bst.BytesIn) != m1[inKey] {
				t.Errorf("status bypass totals %+v, want rule squid with %v bytes in as the metrics", st1.Totals.Bypass, m1[inKey])
			}
			rows := waitRecords(t, filepath.Join(e.state, gatewayFlowLog), 2*time.Second, func(r flows.Record) bool {
				return r.Bypass == "squid" && r.Verdict == flows.Bypassed
			})
			var logged uint64
			for _, r := range rows {
				logged += r.BytesIn
			}
			if float64(logged) != m1[inKey] {
				t.Errorf("flow log rows marked bypass sum to %d bytes in, metrics say %v", logged, m1[inKey])
			}

			// DNS over TCP to the job's resolver: a local name from the
			// site resolver, another from the gateway's (netns mode: the
			// connection is terminated in the client, the rest asked
			// through the tunnel; the fallbacks split per query).
			for name, want := range map[string]string{"squid.site.test": topology.SiteAddr.String(), zoneName: tp.INETAddr.String()} {
				code, out, stderr := e.runWith(t, o, "dig", "+short", "+tcp", "+time=3", "+tries=2", name)
				if code != 0 || strings.TrimSpace(out) != want {
					t.Errorf("dig +tcp %s: exit %d, %q, want %s%s", name, code, out, want, e.diag(stderr))
				}
			}

			// Outside the bypass: through the gateway.
			out = e.mustRunOpts(t, o, curl(fmt.Sprintf("http://%s:%d/small", tp.INETAddr, e.httpPort))...)
			if !strings.HasPrefix(out, "200 ") {
				t.Errorf("download from inet: %q", out)
			}
			st2 := e.status(t)
			if st2.Totals.BytesIn < st1.Totals.BytesIn+smallSize {
				t.Errorf("gateway bytes in %d → %d for a %d-byte download from inet: not through the gateway", st1.Totals.BytesIn, st2.Totals.BytesIn, smallSize)
			}
			// A local name pointing outside: through the gateway, not
			// bypassed.
			out = e.mustRunOpts(t, o, curl(fmt.Sprintf("http://far.site.test:%d/small", e.httpPort))...)
			if !strings.HasPrefix(out, "200 ") {
				t.Errorf("download from far.site.test (inet): %q", out)
			}
			if st3 := e.status(t); st3.Totals.BytesIn < st2.Totals.BytesIn+smallSize {
				t.Errorf("far.site.test (inet) was not carried by the gateway: bytes in %d → %d", st2.Totals.BytesIn, st3.Totals.BytesIn)
			}
			// Excluded port and another site address: unreachable (curl:
			// 7 could not connect, 28 timed out; the greeting server
			// would make it fail otherwise).
			for _, a := range []string{
				netip.AddrPortFrom(topology.SiteAddr, uint16(closedPort)).String(),
				netip.AddrPortFrom(topology.SiteAddr2, uint16(squidPort)).String(),
			} {
				code, out, stderr := e.runWith(t, o, "curl", "-sS", "--noproxy", "*", "--max-time", "5", "http://"+a+"/")
				if code != 7 && code != 28 {
					t.Errorf("curl %s (outside the bypass entry): exit %d, %q, want 7 (could not connect)%s", a, code, out, e.diag(stderr))
				}
			}
			if mode == "netns" {
				pingKey := `airlock_bypass_flows_total{rule="site-ping"}`
				p0 := e.metrics(t, bypassMetricsPort)[pingKey]
				code, out, stderr := e.runWith(t, o, "ping", "-n", "-c", "1", "-W", "3", topology.SiteAddr.String())
				if code != 0 {
					t.Errorf("ping %s (icmp bypass entry): exit %d, %q%s", topology.SiteAddr, code, out, e.diag(stderr))
				}
				if p1 := e.metrics(t, bypassMetricsPort)[pingKey]; p1 != p0+1 {
					t.Errorf("bypass flows of site-ping %v → %v, want one more", p0, p1)
				}
			}
			m2 := e.metrics(t, bypassMetricsPort)
			if m2[flowsKey] != m1[flowsKey] {
				t.Errorf("bypass flows %v → %v: a non-bypass destination was bypassed", m1[flowsKey], m2[flowsKey])
			}

			// A reload removes the entry and the allow while a job runs.
			marker := filepath.Join(topology.TempDir(t), "go")
			if err := os.Chmod(filepath.Dir(marker), 0o755); err != nil {
				t.Fatal(err)
			}
			get := fmt.Sprintf(`curl -sS --max-time 10 -o /dev/null -w '%%{http_code} %%{size_download}\n' -x %s %s`, squid, viaSquid)
			script := fmt.Sprintf(`%s; echo first=$?; i=0; while [ ! -e %s ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; %s; echo second=$?`,
				get, marker, get)
			p := e.startWith(t, o, "sh", "-c", script)
			topology.Poll(30*time.Second, func() bool { return strings.Contains(p.Stdout(), "first=") })
			if !strings.Contains(p.Stdout(), "200 ") {
				t.Fatalf("first download of the running job: %q%s", p.Stdout(), e.diag(p.Stderr()))
			}
			drops0 := e.metrics(t, bypassMetricsPort)[`airlock_policy_drops_total{rule="builtin-private"}`]
			reload(t, false, false, time.Second)
			if err := os.WriteFile(marker, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Wait(30 * time.Second); err != nil {
				t.Errorf("running job: %v", err)
			}
			outp := p.Stdout()
			if !strings.Contains(outp, "second=") || strings.Count(outp, "200 ") != 1 {
				t.Errorf("after the reload the job's download still worked: %q", outp)
			}
			drops1 := e.metrics(t, bypassMetricsPort)[`airlock_policy_drops_total{rule="builtin-private"}`]
			if drops1 <= drops0 {
				t.Errorf("builtin-private drops %v → %v: the job's connection after the reload did not reach the gateway's policy", drops0, drops1)
			}
		})
	}
}

// mustRunOpts is mustRun with options.
func (e *env) mustRunOpts(t testing.TB, o runOpts, args ...string) string {
	t.Helper()
	code, out, stderr := e.runWith(t, o, args...)
	if code != 0 {
		t.Fatalf("airlock run -- %s: exit %d, want 0; stdout %q%s", strings.Join(args, " "), code, out, e.diag(stderr))
	}
	return out
}
