// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestMultiQueueGateway runs a gateway with 4 UDP sockets on its WireGuard
// port (SO_REUSEPORT) and a 4-queue egress TUN (user mode: the private
// namespace's, with the kernel's TCP; kernel mode: its own), and 8 jobs at
// once, each an iperf3 transfer (half upload, half download) to a server
// of its own in inet: every job's transfer completes with data, the
// gateway says it runs 4 sockets and 4 queues, and the dmz's kernel shows
// 4 UDP sockets per family on the port.
func TestMultiQueueGateway(t *testing.T) {
	for _, mode := range []string{modeUser, modeKernel} {
		t.Run(mode, func(t *testing.T) { testMultiQueue(t, mode) })
	}
}

func testMultiQueue(t *testing.T, mode string) {
	const jobs, queues = 8, 4
	e := newEnvMode(t, mode, "--udp-sockets", strconv.Itoa(queues), "--tun-queues", strconv.Itoa(queues))
	if log := e.gw.Stderr(); !strings.Contains(log, fmt.Sprintf("udp_sockets=%d tun_queues=%d", queues, queues)) {
		t.Fatalf("gateway log does not say it runs %d udp sockets and %d tun queues:\n%s", queues, queues, log)
	}
	gwAddr, err := netip.ParseAddrPort(e.gateway)
	if err != nil {
		t.Fatalf("gateway address %q: %v", e.gateway, err)
	}
	code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.DMZ, nil, "ss", "-H", "-u", "-a", "-n", "sport", "=", ":"+strconv.Itoa(int(gwAddr.Port())))
	if code != 0 {
		t.Fatalf("ss: exit %d: %s", code, stderr)
	}
	if n := strings.Count(strings.TrimSpace(out), "\n") + 1; n < queues {
		t.Errorf("udp sockets on port %d in dmz: %d, want at least %d:\n%s", gwAddr.Port(), n, queues, out)
	}

	ports := make([]int, jobs)
	for i := range ports {
		ports[i] = e.tp.StartIperf3Server(t)
	}
	procs := make([]*topology.Process, jobs)
	for i := range procs {
		args := []string{"iperf3", "-c", e.tp.INETAddr.String(), "-p", strconv.Itoa(ports[i]), "-t", "3", "--json", "--connect-timeout", "10000"}
		if i%2 == 1 {
			args = append(args, "-R")
		}
		procs[i] = e.startWith(t, runOpts{timeout: 90 * time.Second}, args...)
	}
	var total float64
	for i, p := range procs {
		code, err := p.Wait(90 * time.Second)
		if err != nil {
			t.Errorf("job %d: %v%s", i, err, e.diag(p.Stderr()))
			continue
		}
		var r iperfResult
		if jerr := json.Unmarshal([]byte(p.Stdout()), &r); jerr != nil || code != 0 || r.Error != "" || r.End.SumReceived.Bytes <= 0 {
			t.Errorf("job %d: exit %d, iperf3 error %q, received %d bytes (%v)%s", i, code, r.Error, r.End.SumReceived.Bytes, jerr, e.diag(p.Stderr()))
			continue
		}
		total += r.End.SumReceived.BitsPerSecond
	}
	t.Logf("%s gateway, %d udp sockets, %d tun queues: %d jobs at once, %.2f Gbit/s in all (no speed asserted)", mode, queues, queues, jobs, total/1e9)
}
