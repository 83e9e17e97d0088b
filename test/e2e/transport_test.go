// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// blockUDP drops UDP from cn to dmz's port (a firewall rule in cn), as at
// sites that let only TCP out of the compute network.
func (e *env) blockUDP(t *testing.T, port int) {
	t.Helper()
	for _, args := range [][]string{
		{"add", "table", "inet", "airlocktest"},
		{"add", "chain", "inet", "airlocktest", "out", "{", "type", "filter", "hook", "output", "priority", "0", ";", "}"},
		{"add", "rule", "inet", "airlocktest", "out", "ip", "daddr", e.tp.DMZAddrCN.String(), "udp", "dport", strconv.Itoa(port), "drop"},
	} {
		if code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.CN, nil, "nft", args...); code != 0 {
			t.Fatalf("nft %s in cn: exit %d %s %s", strings.Join(args, " "), code, out, stderr)
		}
	}
}

// requestLoop is a job that makes one HTTP request per second, n times,
// and prints "ok UNIXTIME" or "fail UNIXTIME" for each.
func (e *env) requestLoop(n int) []string {
	url := fmt.Sprintf("http://%s:%d/small", e.tp.INETAddr, e.httpPort)
	script := fmt.Sprintf(`for i in $(seq %d); do
  if curl -sf -o /dev/null --connect-timeout 1 --max-time 2 %s; then echo "ok $(date +%%s.%%N)"; else echo "fail $(date +%%s.%%N)"; fi
  sleep 1
done`, n, url)
	return []string{"bash", "-c", script}
}

// result is one line of a requestLoop.
type result struct {
	ok bool
	at time.Time
}

func parseLoop(t *testing.T, out string) []result {
	t.Helper()
	var rs []result
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		sec, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			t.Fatalf("bad loop line %q", line)
		}
		rs = append(rs, result{ok: f[0] == "ok", at: time.Unix(0, int64(sec*1e9))})
	}
	return rs
}

// TestTransport runs jobs over the TCP/TLS transport: chosen
// automatically when UDP to the gateway is blocked in cn, and forced with
// --transport tcp; it reports iperf3 throughput over it (no rate
// assertion) and checks that garbage on the gateway's TCP port disturbs no
// job.
func TestTransport(t *testing.T) {
	e := newEnv(t)
	url := fmt.Sprintf("http://%s:%d/small", e.tp.INETAddr, e.httpPort)
	get := []string{"curl", "-sS", "--max-time", "30", "-o", "/dev/null", "-w", "%{http_code}", url}

	t.Run("AutoPicksUDP", func(t *testing.T) {
		// The job outlives the client's look at the handshake: a job
		// done in a few milliseconds may end before the choice is
		// logged.
		job := []string{"sh", "-c", strings.Join(get[:len(get)-2], " ") + " '%{http_code}' " + url + "; sleep 1"}
		code, out, stderr := e.runWith(t, runOpts{flags: []string{"--log-level", "info"}}, job...)
		if code != 0 || out != "200" {
			t.Fatalf("curl: exit %d, %q%s", code, out, e.diag(stderr))
		}
		if !strings.Contains(stderr, "transport: udp") {
			t.Errorf("airlock run did not log that it chose UDP:\n%s", stderr)
		}
	})

	e.blockUDP(t, gatewayPort)

	t.Run("AutoFallsBackToTCP", func(t *testing.T) {
		// curl starts at once, while the client still tries UDP: its
		// connection must survive the switch.
		start := time.Now()
		code, out, stderr := e.runWith(t, runOpts{flags: []string{"--log-level", "info", "--transport-timeout", "2s"}}, get...)
		if code != 0 || out != "200" {
			t.Fatalf("curl with UDP blocked: exit %d, %q%s", code, out, e.diag(stderr))
		}
		if !strings.Contains(stderr, "transport: tcp") || !strings.Contains(stderr, "no WireGuard handshake over UDP") {
			t.Errorf("airlock run did not log that it switched to TCP and why:\n%s", stderr)
		}
		t.Logf("request with UDP blocked done after %v (transport timeout 2s)", time.Since(start).Round(time.Millisecond))
	})

	t.Run("FallbackModeOverTCP", func(t *testing.T) {
		// A node without namespaces and without UDP: the proxy mode's
		// user-space stack rides the same session, so it switches too.
		code, out, stderr := e.runWith(t, runOpts{flags: []string{"--mode", "proxy", "--log-level", "info", "--transport-timeout", "2s"}}, get...)
		if code != 0 || out != "200" {
			t.Fatalf("curl in proxy mode with UDP blocked: exit %d, %q%s", code, out, e.diag(stderr))
		}
		if !strings.Contains(stderr, "transport: tcp") {
			t.Errorf("proxy mode did not switch to TCP:\n%s", stderr)
		}
	})

	t.Run("ForcedTCPIperf3", func(t *testing.T) {
		port := e.tp.StartIperf3Server(t)
		for _, reverse := range []bool{false, true} {
			args := []string{"iperf3", "-c", e.tp.INETAddr.String(), "-p", strconv.Itoa(port), "-t", "3", "--json", "--connect-timeout", "5000"}
			name := "job → outside"
			if reverse {
				args, name = append(args, "-R"), "outside → job"
			}
			code, out, stderr := e.runWith(t, runOpts{flags: []string{"--transport", "tcp"}, timeout: 40 * time.Second}, args...)
			bps := parseIperf(t, "airlock --transport tcp", code, out, stderr, e.diag(stderr))
			t.Logf("iperf3 -t 3 over the TCP transport, %s: %.2f Gbit/s (uncapped veth, 2 cores; no assertion)", name, bps/1e9)
		}
	})

	t.Run("GarbageOnTCPPort", func(t *testing.T) {
		job := e.startWith(t, runOpts{flags: []string{"--transport", "tcp"}}, e.requestLoop(8)...)
		time.Sleep(1500 * time.Millisecond)
		gw := netip.AddrPortFrom(e.tp.DMZAddrCN, gatewayPort)
		// Raw bytes (not TLS), a TLS connection with a bogus tunnel
		// upgrade, and one with a bogus lease.
		garbage := []string{
			fmt.Sprintf("head -c 200000 /dev/urandom > /dev/tcp/%s/%d", gw.Addr(), gw.Port()),
			fmt.Sprintf("curl -sk --max-time 3 -H 'Connection: Upgrade' -H 'Upgrade: airlock-wireguard/1' -H 'Airlock-Lease-Id: x' -H 'Airlock-Lease-Secret: y' https://%s/v1/tunnel", gw),
			fmt.Sprintf("head -c 100000 /dev/urandom | curl -sk --max-time 3 --data-binary @- https://%s/v1/tunnel", gw),
		}
		for _, g := range garbage {
			e.tp.Run(t, 10*time.Second, e.tp.CN, nil, "bash", "-c", g)
		}
		if _, err := job.Wait(40 * time.Second); err != nil {
			t.Fatalf("job: %v%s", err, e.diag(job.Stderr()))
		}
		rs := parseLoop(t, job.Stdout())
		if len(rs) != 8 {
			t.Fatalf("job printed %d results, want 8:\n%s%s", len(rs), job.Stdout(), e.diag(job.Stderr()))
		}
		for i, r := range rs {
			if !r.ok {
				t.Errorf("request %d failed while garbage hit the gateway's TCP port%s", i, e.diag(job.Stderr()))
			}
		}
		if ok, _ := e.gw.Exited(); ok {
			t.Fatalf("gateway exited%s", e.diag(""))
		}
	})
}

// TestGatewayRestart stops the gateway in the middle of a job that makes
// one HTTP request per second and starts it again: the job keeps running,
// its requests fail only while the gateway is down, succeed again within
// 5 s of the gateway being back, and the job keeps its lease (tunnel
// address and port block). Both transports in user mode, UDP in kernel
// mode (whose restore re-creates the job's nftables state).
func TestGatewayRestart(t *testing.T) {
	for _, mode := range []string{modeUser, modeKernel} {
		t.Run(mode, func(t *testing.T) { testGatewayRestart(t, mode) })
	}
}

func testGatewayRestart(t *testing.T, mode string) {
	e := newEnvMode(t, mode, "--renew-interval", "2s")
	top := t // the restarted gateway outlives each subtest
	transports := []string{"udp", "tcp"}
	if mode == modeKernel {
		transports = transports[:1]
	}
	for _, transport := range transports {
		t.Run(transport, func(t *testing.T) {
			job := e.startWith(t, runOpts{flags: []string{"--transport", transport, "--log-level", "info"}}, e.requestLoop(14)...)
			time.Sleep(3 * time.Second)
			stopped := time.Now()
			if err := e.gw.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if _, err := e.gw.Wait(15 * time.Second); err != nil {
				t.Fatalf("gateway did not stop: %v", err)
			}
			oldLog := e.gw.Stderr()
			time.Sleep(3 * time.Second)
			e.startGateway(top)
			back := time.Now()
			if _, err := job.Wait(60 * time.Second); err != nil {
				t.Fatalf("job: %v%s", err, e.diag(job.Stderr()))
			}
			if ok, code := job.Exited(); !ok || code != 0 {
				t.Errorf("job exit %d, want 0%s", code, e.diag(job.Stderr()))
			}
			rs := parseLoop(t, job.Stdout())
			var firstOK time.Time
			for i, r := range rs {
				switch {
				case !r.ok && (r.at.Before(stopped) || r.at.After(back.Add(5*time.Second))):
					t.Errorf("request %d failed at %s, outside the outage %s – %s + 5 s", i, r.at.Format("15:04:05.000"), stopped.Format("15:04:05.000"), back.Format("15:04:05.000"))
				case r.ok && r.at.After(back) && firstOK.IsZero():
					firstOK = r.at
				}
			}
			if firstOK.IsZero() {
				t.Fatalf("no request succeeded after the gateway came back:\n%s%s", job.Stdout(), e.diag(job.Stderr()))
			}
			t.Logf("%s: first success %v after the gateway was back (down %v)", transport, firstOK.Sub(back).Round(time.Millisecond), back.Sub(stopped).Round(time.Millisecond))
			if firstOK.Sub(back) > 5*time.Second {
				t.Errorf("first success %v after the gateway was back, want within 5 s", firstOK.Sub(back))
			}
			// The lease survived: the restarted gateway restored the
			// address the first run had given the job.
			m := regexp.MustCompile(`job joined.* addrs="?\[([^ \]]+)`).FindAllStringSubmatch(oldLog, -1)
			if m == nil {
				t.Fatalf("no join in the first gateway run's log")
			}
			addr := m[len(m)-1][1]
			if !regexp.MustCompile(`lease restored.* addrs="?\[` + regexp.QuoteMeta(addr) + `[ \]]`).MatchString(e.gw.Stderr()) {
				t.Errorf("restarted gateway did not restore the job's lease with address %s%s", addr, e.diag(job.Stderr()))
			}
			if strings.Contains(job.Stderr(), "joined again") {
				t.Errorf("client had to join again: lease not kept%s", e.diag(job.Stderr()))
			}
		})
	}
}

// TestLeaseExpiry checks that a lease whose client stopped renewing (the
// client was killed) expires.
func TestLeaseExpiry(t *testing.T) {
	e := newEnvMode(t, modeUser, "--renew-interval", "1s", "--lease-ttl", "3s")
	job := e.start(t, "sleep", "60")
	if !topology.Poll(15*time.Second, func() bool { return strings.Contains(e.gw.Stderr(), "job joined") }) {
		t.Fatalf("job did not join%s", e.diag(job.Stderr()))
	}
	job.Signal(syscall.SIGKILL) // the client dies, nothing releases the lease
	killed := time.Now()
	if !topology.Poll(15*time.Second, func() bool { return strings.Contains(e.gw.Stderr(), "lease expired: client stopped renewing") }) {
		t.Fatalf("lease did not expire within 15 s of the client dying (ttl 3s)%s", e.diag(""))
	}
	t.Logf("lease expired %v after the client died (ttl 3 s)", time.Since(killed).Round(100*time.Millisecond))
}

// gatewayB is a second gateway on the second gateway host (dmz2) with its
// own state directory and subnet, and the first gateway's token imported.
type gatewayB struct {
	state, addr, pin string
	proc             *topology.Process
	args             []string
}

func (e *env) startGatewayB(t *testing.T, subnet string) *gatewayB {
	t.Helper()
	if e.tp.DMZ2 == "" {
		t.Fatal("startGatewayB needs a topology WithSecondDMZ")
	}
	e.tp.SetResolvConf(e.tp.DMZ2, e.dnsAddr)
	if code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.DMZ2, nil, "sysctl", "-q", "-w", `net.ipv4.ping_group_range=0 2147483647`); code != 0 {
		t.Fatalf("sysctl in dmz2: exit %d %s %s", code, out, stderr)
	}
	g := &gatewayB{state: filepath.Join(filepath.Dir(e.state), "state-b")}
	listen := netip.AddrPortFrom(topology.DMZ2AddrCN, gatewayPort).String()
	g.args = []string{"gateway", "--state", g.state, "--listen", listen, "--subnet", subnet, "--egress-addr", topology.DMZ2AddrINET.String()}
	g.proc = e.tp.Start(t, e.tp.DMZ2, e.gwUser, e.airlock, g.args...)
	vals := waitJoinEnv(t, g.proc, g.state, 30*time.Second)
	g.addr, g.pin = vals["AIRLOCK_GATEWAY"], vals["AIRLOCK_PIN"]
	code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.DMZ2, e.gwUser, "bash", "-c",
		fmt.Sprintf("printf %%s %q | %s token create --state %s --name e2e --import", e.token, e.airlock, g.state))
	if code != 0 {
		t.Fatalf("token create --import on the second gateway: exit %d %s %s", code, out, stderr)
	}
	return g
}

// TestGateways runs two gateways on two hosts (dmz and dmz2): a new job
// joins the less loaded one,
// a draining gateway takes no new jobs while its running job is
// undisturbed, and a job whose gateway dies moves to the other within the
// failover threshold.
func TestGateways(t *testing.T) {
	e := newEnvTopo(t, modeUser, []topology.Option{topology.WithSecondDMZ()})
	b := e.startGatewayB(t, "100.65.0.0/16")
	both := runOpts{gateway: e.gateway + "," + b.addr, pin: e.pin + "," + b.pin,
		flags: []string{"--log-level", "info", "--failover-after", "3s"}}
	onB := regexp.MustCompile(`inet 100\.65\.`)
	addrCmd := []string{"ip", "-4", "-o", "addr", "show", "tun0"}

	// Gateway A gets a job; a new job given both joins B.
	jobA := e.startWith(t, runOpts{flags: []string{"--log-level", "info"}}, e.requestLoop(20)...)
	waitLog(t, e.gw, "job joined", 15*time.Second)
	t.Run("LeastLoaded", func(t *testing.T) {
		code, out, stderr := e.runWith(t, both, addrCmd...)
		if code != 0 || !onB.MatchString(out) {
			t.Fatalf("job given both gateways (A has a job, B none): exit %d, tun0 %q, want an address of B's 100.65.0.0/16%s", code, out, e.diag(stderr))
		}
	})

	t.Run("Drain", func(t *testing.T) {
		// B now has more jobs than A, but A drains: new jobs go to B.
		holdB := e.startWith(t, runOpts{gateway: b.addr, pin: b.pin}, "sleep", "30")
		holdB2 := e.startWith(t, runOpts{gateway: b.addr, pin: b.pin}, "sleep", "30")
		defer func() {
			// Ended cleanly (SIGTERM is forwarded to the job), so that
			// their leases are released and B is empty again.
			for _, p := range []*topology.Process{holdB, holdB2} {
				p.Signal(syscall.SIGTERM)
				p.Wait(10 * time.Second)
			}
		}()
		waitLog(t, b.proc, "job joined", 15*time.Second)
		if code, out, stderr := e.admin(t, "gateway", "drain", "--state", e.state); code != 0 || !strings.Contains(stderr, "draining") {
			t.Fatalf("airlock gateway drain: exit %d %s %s", code, out, stderr)
		}
		code, out, stderr := e.runWith(t, both, addrCmd...)
		if code != 0 || !onB.MatchString(out) {
			t.Errorf("new job while A drains: exit %d, tun0 %q, want B's subnet%s", code, out, e.diag(stderr))
		}
		code, out, stderr = e.runWith(t, runOpts{flags: []string{"--join-timeout", "3s"}}, "true")
		if code == 0 || !strings.Contains(stderr, "draining") {
			t.Errorf("job given only the draining gateway: exit %d, want a failure that says it drains: %s", code, stderr)
		}
		if _, err := jobA.Wait(40 * time.Second); err != nil {
			t.Fatalf("job on A: %v", err)
		}
		for i, r := range parseLoop(t, jobA.Stdout()) {
			if !r.ok {
				t.Errorf("request %d of the job running on A failed (drain must not disturb it)%s", i, e.diag(jobA.Stderr()))
			}
		}
		if code, out, stderr := e.admin(t, "gateway", "drain", "--state", e.state, "--undo"); code != 0 {
			t.Fatalf("airlock gateway drain --undo: exit %d %s %s", code, out, stderr)
		}
	})

	t.Run("FailoverSilent", func(t *testing.T) {
		// B becomes unreachable without a word (a firewall in cn drops
		// everything to its host, as when the host dies): the client
		// notices from the missing heartbeats (3 × 5 s) and, that silence
		// being longer than the threshold, moves to A at once.
		holdA := e.startWith(t, runOpts{}, "sleep", "60")
		defer holdA.Kill()
		waitLogCount(t, e.gw, "job joined", 2, 15*time.Second)
		loop := e.requestLoop(24)
		job := e.startWith(t, both, "bash", "-c", "ip -4 -o addr show tun0; "+loop[2])
		time.Sleep(3 * time.Second)
		for _, args := range [][]string{
			{"add", "table", "inet", "airlockpart"},
			{"add", "chain", "inet", "airlockpart", "out", "{", "type", "filter", "hook", "output", "priority", "0", ";", "}"},
			{"add", "rule", "inet", "airlockpart", "out", "ip", "daddr", topology.DMZ2AddrCN.String(), "drop"},
		} {
			if code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.CN, nil, "nft", args...); code != 0 {
				t.Fatalf("nft %s: exit %d %s %s", strings.Join(args, " "), code, out, stderr)
			}
		}
		cut := time.Now()
		defer e.tp.Run(t, 10*time.Second, e.tp.CN, nil, "nft", "delete", "table", "inet", "airlockpart")
		if _, err := job.Wait(90 * time.Second); err != nil {
			t.Fatalf("job: %v%s", err, e.diag(job.Stderr()))
		}
		out := job.Stdout()
		if !onB.MatchString(out) {
			t.Fatalf("job did not start on B: %q%s", out, e.diag(job.Stderr()))
		}
		if !strings.Contains(job.Stderr(), "failed over to another gateway") {
			t.Fatalf("client did not fail over%s", e.diag(job.Stderr()))
		}
		var firstOK time.Time
		for _, r := range parseLoop(t, out) {
			if r.ok && r.at.After(cut.Add(time.Second)) {
				firstOK = r.at
				break
			}
		}
		if firstOK.IsZero() {
			t.Fatalf("no request succeeded after B went silent:\n%s%s", out, e.diag(job.Stderr()))
		}
		t.Logf("first success through A %v after B went silent (3 missed 5 s heartbeats, threshold 3 s)", firstOK.Sub(cut).Round(time.Millisecond))
		if firstOK.Sub(cut) > 25*time.Second {
			t.Errorf("first success %v after B went silent, want within 15 s of silence plus 10 s", firstOK.Sub(cut))
		}
	})

	t.Run("Failover", func(t *testing.T) {
		// A job on B (B has fewer jobs: A gets two, B keeps at most the
		// one the last subtest left behind) loses B: its requests go
		// through A after the failover threshold.
		holdA := e.startWith(t, runOpts{}, "sleep", "40")
		holdA2 := e.startWith(t, runOpts{}, "sleep", "40")
		defer holdA.Kill()
		defer holdA2.Kill()
		waitLogCount(t, e.gw, "job joined", 5, 15*time.Second)
		loop := e.requestLoop(14)
		o := both
		o.flags = append(append([]string(nil), both.flags...), "--transport-timeout", "1s")
		job := e.startWith(t, o, "bash", "-c", "ip -4 -o addr show tun0; "+loop[2])
		time.Sleep(3 * time.Second)
		// UDP to A is blocked: the job, on UDP to B so far, must find the
		// TCP transport to A by itself.
		e.blockUDP(t, gatewayPort)
		b.proc.Signal(syscall.SIGKILL)
		killed := time.Now()
		if _, err := job.Wait(60 * time.Second); err != nil {
			t.Fatalf("job: %v%s", err, e.diag(job.Stderr()))
		}
		out := job.Stdout()
		if !onB.MatchString(out) {
			t.Fatalf("job did not start on B: %q%s", out, e.diag(job.Stderr()))
		}
		if !strings.Contains(job.Stderr(), "failed over to another gateway") {
			t.Errorf("client did not log the failover%s", e.diag(job.Stderr()))
		}
		var firstOK time.Time
		for _, r := range parseLoop(t, out) {
			if r.ok && r.at.After(killed) {
				firstOK = r.at
				break
			}
		}
		if firstOK.IsZero() {
			t.Fatalf("no request succeeded after B died:\n%s%s", out, e.diag(job.Stderr()))
		}
		if !regexp.MustCompile(`failed over[^\n]*transport=tcp`).MatchString(job.Stderr()) {
			t.Errorf("client did not switch to TCP on A, where UDP is blocked%s", e.diag(job.Stderr()))
		}
		// Threshold 3 s, plus at most one backoff step (2 s), the join,
		// the UDP attempt (1 s) and the request loop's own second.
		t.Logf("first success through A (over TCP) %v after B was killed (failover threshold 3 s)", firstOK.Sub(killed).Round(time.Millisecond))
		if firstOK.Sub(killed) > 10*time.Second {
			t.Errorf("first success %v after B died, want within the threshold (3 s) plus 7 s", firstOK.Sub(killed))
		}
		if !strings.Contains(job.Stderr(), "to="+e.gateway) {
			t.Errorf("failover log does not name A (%s) as the new gateway%s", e.gateway, e.diag(job.Stderr()))
		}
	})
}

// waitLog waits until p's stderr contains s.
func waitLog(t *testing.T, p *topology.Process, s string, timeout time.Duration) {
	t.Helper()
	waitLogCount(t, p, s, 1, timeout)
}

func waitLogCount(t *testing.T, p *topology.Process, s string, n int, timeout time.Duration) {
	t.Helper()
	if !topology.Poll(timeout, func() bool { return strings.Count(p.Stderr(), s) >= n }) {
		t.Fatalf("%q did not appear %d times within %v: %s", s, n, timeout, p.Describe())
	}
}
