package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/test/topology"
)

// zoneName6 has only an AAAA record: inet's IPv6 address (env_test.go).
const zoneName6 = "v6." + zoneName

// checkIPv6Kernel runs the kernel-mode IPv6 checks on the shared
// environment (TestAirlock/kernel): jobs get an IPv6 address and reach
// inet's IPv6 address by name and by address (HTTP, iperf3 both ways, UDP
// echo, ping), a packet too big from the gateway reaches the job, the
// floor and the built-in protections refuse at once, a job's IPv6 flows
// leave from the gateway's IPv6 egress address and a port of its block
// (whois names the job), are in the flow table, and its exposed ports
// answer at the gateway's IPv6 address too.
func checkIPv6Kernel(t *testing.T, e *env) {
	job := "v6-kernel"
	opts := runOpts{env: []string{"AIRLOCK_JOB_ID=" + job}}

	t.Run("JobAddress", func(t *testing.T) {
		out := e.mustRun(t, "sh", "-c", "ip -6 -o addr show dev tun0 scope global; echo ==; ip -6 route show default")
		parts := strings.Split(out, "==\n")
		m := regexp.MustCompile(`inet6 (fd[0-9a-f:]+)/`).FindStringSubmatch(parts[0])
		if m == nil {
			t.Fatalf("tun0 has no unique-local IPv6 address: %q", out)
		}
		if len(parts) != 2 || !strings.Contains(parts[1], "dev tun0") {
			t.Errorf("IPv6 default route: %q, want dev tun0", out)
		}
	})

	t.Run("HTTPByName", func(t *testing.T) {
		url := fmt.Sprintf("http://%s:%d/small", zoneName6, e.httpPort)
		out := e.mustRunOpts(t, opts, "bash", "-c", "set -o pipefail; curl -sS --max-time 30 -o /dev/stdout -w '\\n%{remote_ip}\\n' "+url+" | tail -n 1; curl -sS --max-time 30 "+url+" | sha256sum")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 || lines[0] != topology.INETAddr6.String() || !strings.HasPrefix(lines[1], e.sha["small"]) {
			t.Errorf("curl %s: %q, want remote %v and sha256 %s", url, out, topology.INETAddr6, e.sha["small"])
		}
	})

	t.Run("Iperf3BothWays", func(t *testing.T) {
		port := e.tp.StartIperf3Server(t)
		for _, rev := range []bool{false, true} {
			args := []string{"iperf3", "-6", "-c", topology.INETAddr6.String(), "-p", strconv.Itoa(port), "-t", "1", "--json", "--connect-timeout", "5000"}
			if rev {
				args = append(args, "-R")
			}
			out := e.mustRunOpts(t, opts, args...)
			var r struct {
				End struct {
					SumReceived struct {
						BitsPerSecond float64 `json:"bits_per_second"`
					} `json:"sum_received"`
				} `json:"end"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil || r.End.SumReceived.BitsPerSecond < 10e6 {
				t.Errorf("iperf3 over IPv6 (reverse %v): %.0f Mbit/s, %v", rev, r.End.SumReceived.BitsPerSecond/1e6, err)
				continue
			}
			t.Logf("iperf3 -t 1 over IPv6, reverse %v: %.0f Mbit/s", rev, r.End.SumReceived.BitsPerSecond/1e6)
			time.Sleep(200 * time.Millisecond) // the server takes a moment between tests
		}
	})

	t.Run("UDPEcho", func(t *testing.T) {
		ap := netip.AddrPortFrom(topology.INETAddr6, uint16(e.udpPort)).String()
		if code, out, stderr := e.run(t, e.peer, "udpclient", ap, "200"); code != 0 || strings.TrimSpace(out) != "ok 200" {
			t.Errorf("udpclient %s 200: exit %d, %q%s", ap, code, out, e.diag(stderr))
		}
	})

	t.Run("Ping6", func(t *testing.T) {
		if code, out, stderr := e.run(t, "ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", topology.INETAddr6.String()); code != 0 {
			t.Errorf("ping -6 %v: exit %d, %q%s", topology.INETAddr6, code, out, e.diag(stderr))
		}
	})

	t.Run("PacketTooBig", func(t *testing.T) {
		// dmz's link to inet narrowed to the IPv6 minimum: the gateway
		// answers a larger packet from a job with packet too big, which
		// the job's kernel takes as its path MTU.
		for _, l := range [][2]string{{e.tp.DMZ, topology.IfDMZToINET}, {e.tp.INET, topology.IfINETToDMZ}} {
			if code, _, stderr := e.tp.Run(t, 10*time.Second, l[0], nil, "ip", "link", "set", l[1], "mtu", "1280"); code != 0 {
				t.Fatalf("mtu 1280 on %s: %s", l[1], stderr)
			}
			t.Cleanup(func() { e.tp.Run(t, 10*time.Second, l[0], nil, "ip", "link", "set", l[1], "mtu", "1500") })
		}
		a := topology.INETAddr6.String()
		code, out, stderr := e.run(t, "sh", "-c", "ping -6 -c 3 -i 0.3 -W 1 -M do -s 1300 "+a+"; ip -6 route get "+a+"; ping -6 -c 1 -W 2 -M do -s 1200 "+a)
		if !regexp.MustCompile(`mtu 1280`).MatchString(out) {
			t.Errorf("after a 1348-byte ping over a 1280 link, the job's route to %s has no mtu 1280 (exit %d): %q%s", a, code, out, e.diag(stderr))
		}
		if !strings.Contains(out, "1 received") {
			t.Errorf("a ping that fits the path MTU got no answer: %q", out)
		}
	})

	t.Run("FloorAndProtected", func(t *testing.T) {
		// Each refused at once with a reset (curl: 7, could not connect),
		// not by a timeout.
		for _, dst := range []string{
			"[64:ff9b::7f00:1]:80", // NAT64 of loopback: floor
			netip.AddrPortFrom(topology.DMZAddrINET6, gatewayPort).String(), // the gateway host
			"[fd00:dead::1]:80",       // unique-local: builtin-private
			"[64:ff9b::a9fe:a9fe]:80", // NAT64 of the metadata endpoint
		} {
			start := time.Now()
			code, _, stderr := e.run(t, "curl", "-sS", "--max-time", "5", "http://"+dst+"/")
			if d := time.Since(start); code != 7 || d > 4*time.Second {
				t.Errorf("curl %s: exit %d after %v, want 7 (refused) at once%s", dst, code, d.Round(time.Millisecond), e.diag(stderr))
			}
		}
	})

	t.Run("PortBlockWhoisFlows", func(t *testing.T) {
		port := e.tp.StartTCPSrcPort(t)
		ap := netip.AddrPortFrom(topology.INETAddr6, uint16(port)).String()
		at := time.Now()
		out := strings.TrimSpace(e.mustRunOpts(t, opts, e.peer, "tcpget", ap))
		seen, err := netip.ParseAddrPort(out)
		if err != nil || seen.Addr() != topology.DMZAddrINET6 {
			t.Fatalf("inet saw the job's IPv6 connection from %q (%v), want the gateway's IPv6 address %v", out, err, topology.DMZAddrINET6)
		}
		recs := e.whois(t, seen, at.Add(100*time.Millisecond))
		if len(recs) != 1 || recs[0].JobID != job {
			t.Errorf("whois %v: %+v, want job %s", seen, recs, job)
		} else if seen.Port() < recs[0].PortLo || seen.Port() > recs[0].PortHi {
			t.Errorf("source port %d outside the job's block %d-%d", seen.Port(), recs[0].PortLo, recs[0].PortHi)
		}
		var found *flows.Record
		deadline := time.Now().Add(5 * time.Second)
		for found == nil && time.Now().Before(deadline) {
			fl := e.flows(t, job)
			for _, r := range append(fl.Active, fl.Recent...) {
				if r.Dst == ap && r.BytesIn > 0 && r.BytesOut > 0 {
					r := r
					found = &r
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		if found == nil {
			t.Errorf("flow table has no flow of job %s to %s with bytes both ways: %+v", job, ap, e.flows(t, job))
		}
	})

	t.Run("Expose", func(t *testing.T) {
		a := e.startExposed(t, "v6", "--expose", "8080", "--expose", "8080/udp")
		defer func() {
			a.p.Signal(syscall.SIGTERM)
			a.p.Wait(15 * time.Second)
		}()
		for _, x := range []struct {
			how string
			ap  netip.AddrPort
		}{{"tcpget", a.tcp}, {"udpget", a.udp}} {
			ap6 := netip.AddrPortFrom(topology.DMZAddrINET6, x.ap.Port())
			if code, out, _ := e.inetGet(t, x.how, ap6); code != 0 || out != "hello from v6\n" {
				t.Errorf("%s to the job's public port at the gateway's IPv6 address %v: exit %d, %q%s", x.how, ap6, code, out, e.diag(a.p.Stderr()))
			}
		}
	})
}
