// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// udpDropsMetricsPort is TestUDPDrops' metrics listener in dmz.
const udpDropsMetricsPort = 9473

// TestUDPDrops checks that dropped packets are counted, not guessed: an
// unprivileged gateway reads its WireGuard sockets' buffers back and warns
// with the sysctl when the kernel granted less than it asked for, both
// preflights say the same, and datagrams the kernel drops at a full
// receive queue (the gateway stopped with SIGSTOP while a burst arrives)
// show in airlock status and in airlock_udp_receive_drops_total.
func TestUDPDrops(t *testing.T) {
	e := newEnvMode(t, modeUser, "--metrics", fmt.Sprintf("127.0.0.1:%d", udpDropsMetricsPort))
	// net.core.rmem_max and wmem_max belong to the host, not to a
	// namespace: the test reads what this machine has.
	small := false
	for _, f := range []string{"/proc/sys/net/core/rmem_max", "/proc/sys/net/core/wmem_max"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := strconv.Atoi(strings.TrimSpace(string(b))); v < tunnel.SocketBufferSize {
			small = true
		}
	}
	t.Logf("net.core.rmem_max or wmem_max below %d: %v", tunnel.SocketBufferSize, small)

	t.Run("Warnings", func(t *testing.T) {
		const warn = "the wireguard udp sockets got smaller buffers than they asked for"
		if got := strings.Contains(e.gw.Stderr(), warn); got != small {
			t.Errorf("gateway log has %q: %v, want %v%s", warn, got, small, e.diag(""))
		}
		wantLine := "ok      net.core.rmem_max, wmem_max:"
		if small {
			wantLine = "warn    net.core.rmem_max, wmem_max:"
		}
		_, out, _ := e.tp.Run(t, 30*time.Second, e.tp.CN, e.u, e.airlock, "run", "--check", "--gateway", e.gateway, "--pin", e.pin, "--token", e.token)
		if !strings.Contains(out, wantLine) {
			t.Errorf("airlock run --check: no line %q\n%s", wantLine, out)
		}
		_, out, _ = e.admin(t, "gateway", "--check", "--state", e.state, "--listen", "127.0.0.1:0")
		if !strings.Contains(out, wantLine) {
			t.Errorf("airlock gateway --check: no line %q\n%s", wantLine, out)
		}
		if small && !strings.Contains(out, fmt.Sprintf("net.core.rmem_max=%d net.core.wmem_max=%d", tunnel.SocketBufferSize, tunnel.SocketBufferSize)) {
			t.Errorf("airlock gateway --check does not name the sysctl to set:\n%s", out)
		}
	})

	t.Run("DropsCounted", func(t *testing.T) {
		st := e.status(t)
		if st.UDP.Sockets == 0 || st.UDP.ReceiveBuffer == 0 {
			t.Fatalf("status udp %+v: want the sockets and their buffers", st.UDP)
		}
		before := st.UDP.ReceiveDrops
		// More than the granted buffer arrives while nobody reads it.
		n := 3 * st.UDP.ReceiveBuffer / 1400
		if err := e.gw.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		flood := fmt.Sprintf(`import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(%d):
    s.sendto(b"\xff" * 1400, ("%s", %d))`, n, e.tp.DMZAddrCN, gatewayPort)
		code, _, stderr := e.tp.Run(t, 60*time.Second, e.tp.CN, nil, "python3", "-c", flood)
		if err := e.gw.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if code != 0 {
			t.Fatalf("flood: exit %d %s", code, stderr)
		}
		st = e.status(t)
		t.Logf("%d datagrams of 1400 bytes to a stopped gateway (receive buffer %d): drops %d → %d", n, st.UDP.ReceiveBuffer, before, st.UDP.ReceiveDrops)
		if st.UDP.ReceiveDrops <= before {
			t.Errorf("status udp receive_drops %d → %d, want more", before, st.UDP.ReceiveDrops)
		}
		m := e.metrics(t, udpDropsMetricsPort)
		if got := m["airlock_udp_receive_drops_total"]; got < float64(st.UDP.ReceiveDrops) {
			t.Errorf("airlock_udp_receive_drops_total %v, want at least %d", got, st.UDP.ReceiveDrops)
		}
		_, out, _ := e.admin(t, "status", "--state", e.state)
		if !strings.Contains(out, "udp:        ") || !strings.Contains(out, "receive drops") {
			t.Errorf("airlock status has no udp line:\n%s", out)
		}
		// The gateway still serves jobs.
		e.mustRun(t, "true")
	})
}
