// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestPathMTU runs user-mode jobs over a node–gateway link of 9000-byte
// frames (dmz's link to the outside keeps 1500): the gateway offers a
// tunnel MTU derived from that path, the client proves it with a probe
// and its job's TUN takes it. Then a middlebox on the link starts to drop
// UDP frames over 1500 bytes without a word (no ICMP): the probe fails,
// the job keeps 1420, and no flow hangs, either way. Without the probe
// (a client that took the offer blindly) the second job's transfers
// would stall on packets that never arrive.
//
// Both user-mode TCP stacks: the kernel's in the private namespace (its
// TUN takes the larger MTU) and the netstack's (its link keeps 1420: the
// job's TCP follows the netstack's MSS, the job's big UDP datagrams still
// arrive whole).
func TestPathMTU(t *testing.T) {
	for _, mode := range []string{modeUser, modeUserNetstack} {
		t.Run(mode, func(t *testing.T) { testPathMTU(t, mode) })
	}
}

func testPathMTU(t *testing.T, mode string) {
	e := newEnvTopo(t, mode, []topology.Option{topology.WithLinkMTU(9000)})
	port := e.tp.StartIperf3Server(t)
	// The job's mount namespace shows the host's /sys: ip asks the
	// kernel of its network namespace.
	const mtuOf = `ip -o link show tun0 | sed -E 's/.* mtu ([0-9]+) .*/\1/'`
	job := fmt.Sprintf(mtuOf+`
curl -sS --max-time 30 -o /dev/null -w 'get %%{http_code} %%{size_download}\n' http://%[1]s:%[2]d/big
for r in "" -R; do
  # The server may still be finishing the last test ("busy"): retry.
  for try in 1 2 3; do
    iperf3 -c %[1]s -p %[3]d -t 2 --connect-timeout 5000 $r >/dev/null 2>&1 && { echo "iperf3$r ok"; break; }
    sleep 1
  done
done
python3 -c '
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
m = bytes(range(256)) * 16
s.sendto(m, ("%[1]s", %[4]d))
d, _ = s.recvfrom(65536)
print("udp %%d %%s" %% (len(d), "ok" if d == m else "bad"))
'`, e.tp.INETAddr, e.httpPort, port, e.udpPort)
	check := func(t *testing.T, wantMTU int) string {
		t.Helper()
		start := time.Now()
		code, out, stderr := e.runWith(t, runOpts{flags: []string{"--log-level", "info"}, timeout: 60 * time.Second}, "bash", "-c", job)
		t.Logf("job took %v:\n%s", time.Since(start).Round(time.Millisecond), out)
		if code != 0 {
			t.Fatalf("job: exit %d%s", code, e.diag(stderr))
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 5 {
			t.Fatalf("job printed %d lines, want 5 (mtu, get, two iperf3 runs, udp echo):\n%s%s", len(lines), out, e.diag(stderr))
		}
		if mtu, _ := strconv.Atoi(lines[0]); mtu != wantMTU {
			t.Errorf("job's tun0 mtu %s, want %d%s", lines[0], wantMTU, e.diag(stderr))
		}
		if want := fmt.Sprintf("get 200 %d", bigSize); lines[1] != want {
			t.Errorf("download: %q, want %q", lines[1], want)
		}
		if lines[2] != "iperf3 ok" || lines[3] != "iperf3-R ok" {
			t.Errorf("iperf3 both ways: %q %q, want ok both", lines[2], lines[3])
		}
		// A 4096-byte datagram each way: one packet into the tunnel, IP
		// fragments on the outside and back into the job.
		if lines[4] != "udp 4096 ok" {
			t.Errorf("udp echo of 4096 bytes: %q, want \"udp 4096 ok\"", lines[4])
		}
		return stderr
	}
	// The gateway's offer: dmz's cn0 (9000) less IPv4 and WireGuard's 60.
	const offered = 9000 - 60
	if log := e.gw.Stderr(); !regexp.MustCompile(`max_mtu=` + strconv.Itoa(offered)).MatchString(log) {
		t.Errorf("gateway log does not offer max_mtu=%d%s", offered, e.diag(""))
	}

	t.Run("Follows", func(t *testing.T) {
		stderr := check(t, offered)
		if !strings.Contains(stderr, "tunnel mtu follows the path") {
			t.Errorf("client did not log the mtu it took:\n%s", stderr)
		}
	})

	e.dropBigUDP(t, 1500)

	t.Run("DroppedFallsBack", func(t *testing.T) {
		stderr := check(t, 1420)
		if !strings.Contains(stderr, "big datagrams are dropped on the path") {
			t.Errorf("client did not log why it kept 1420:\n%s", stderr)
		}
	})

	t.Run("TCPTransportNoProbe", func(t *testing.T) {
		code, out, stderr := e.runWith(t, runOpts{flags: []string{"--transport", "tcp"}}, "bash", "-c", mtuOf)
		if code != 0 || strings.TrimSpace(out) != "1420" {
			t.Errorf("--transport tcp: exit %d, mtu %q, want 1420%s", code, out, e.diag(stderr))
		}
	})
}

// dropBigUDP makes the cn–dmz link a middlebox that drops UDP frames
// longer than limit bytes in both directions, silently: offloads off on
// both ends (each packet the hooks see is one frame on the wire) and an
// nftables rule on the input hook of each side. TCP (the control channel)
// passes at any size, as through a box that clamps or fragments only TCP.
func (e *env) dropBigUDP(t *testing.T, limit int) {
	t.Helper()
	for _, side := range []struct{ ns, dev string }{{e.tp.CN, topology.IfCNToDMZ}, {e.tp.DMZ, topology.IfDMZToCN}} {
		if code, out, stderr := e.tp.Run(t, 10*time.Second, side.ns, nil, e.peer, "offloads-off", side.dev); code != 0 {
			t.Fatalf("offloads-off %s in %s: exit %d %s %s", side.dev, side.ns, code, out, stderr)
		}
		for _, args := range [][]string{
			{"add", "table", "inet", "airlockmtu"},
			{"add", "chain", "inet", "airlockmtu", "in", "{", "type", "filter", "hook", "input", "priority", "0", ";", "}"},
			{"add", "rule", "inet", "airlockmtu", "in", "iifname", side.dev, "meta", "l4proto", "udp", "meta", "length", ">", strconv.Itoa(limit), "counter", "drop"},
		} {
			if code, out, stderr := e.tp.Run(t, 10*time.Second, side.ns, nil, "nft", args...); code != 0 {
				t.Fatalf("nft %s in %s: exit %d %s %s", strings.Join(args, " "), side.ns, code, out, stderr)
			}
		}
	}
}
