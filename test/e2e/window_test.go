// SPDX-License-Identifier: MIT

package e2e

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// windowCap is what the outside sender may be offered while the user-mode
// gateway clamps the window: internal/forward/netstack's windowFloor
// (128 KiB on paths this short) with room for the TCP's rounding and
// window scaling.
const windowCap = 512 << 10

// TestOutsideSenderWindow: with every link capped at the same rate, the
// tunnel (which carries the job's bytes plus WireGuard's headers) is the
// bottleneck of a download, so the user-mode gateway's host socket fills.
// The outside sender must then be offered a window near what the job's
// side drains, not the socket's auto-tuned megabytes: a large window is a
// queue on the DMZ's outside link that every other job's traffic waits
// behind (bench/run.sh latency: 9 ms of p99 before the clamp). The test
// reads the window the real outside iperf3 server is offered (ss's
// snd_wnd, in inet) during a download through a real gateway and tunnel.
// That the window is megabytes without the clamp is checked by
// internal/forward/netstack's TestRecvWindowClamp; how much delay it
// saves, by the benchmark.
func TestOutsideSenderWindow(t *testing.T) {
	e := newEnvTopo(t, modeUser, []topology.Option{topology.WithRate("300mbit")})
	port := e.tp.StartIperf3Server(t)
	job := e.start(t, "iperf3", "-c", e.tp.INETAddr.String(), "-p", strconv.Itoa(port), "-R", "-t", "4", "--json", "--connect-timeout", "5000")
	sndWnd := regexp.MustCompile(`snd_wnd:(\d+)`)
	sent := regexp.MustCompile(`bytes_sent:(\d+)`)
	largest, samples := 0, 0
	start := time.Now()
	for time.Since(start) < 4*time.Second {
		time.Sleep(100 * time.Millisecond)
		if ok, _ := job.Exited(); ok {
			break
		}
		if time.Since(start) < 2*time.Second {
			continue // connect, slow start, and the first window running out
		}
		_, out, _ := e.tp.Run(t, 5*time.Second, e.tp.INET, nil, "ss", "-tinH", "sport", "= :"+strconv.Itoa(port))
		// Each socket is two lines: addresses, then its TCP info. The data
		// socket is the one that has sent megabytes (not iperf3's control
		// connection).
		for _, info := range strings.Split(out, "\n") {
			s, w := sent.FindStringSubmatch(info), sndWnd.FindStringSubmatch(info)
			if s == nil || w == nil {
				continue
			}
			if n, _ := strconv.Atoi(s[1]); n < 4<<20 {
				continue
			}
			v, _ := strconv.Atoi(w[1])
			largest = max(largest, v)
			samples++
		}
	}
	code, err := job.Wait(runTimeout)
	bps := parseIperf(t, "download", code, job.Stdout(), job.Stderr(), e.diag(job.Stderr()))
	if err != nil {
		t.Fatalf("job: %v", err)
	}
	t.Logf("download %.0f Mbit/s on 300 Mbit/s links; the outside sender was offered at most %d KiB in %d samples", bps/1e6, largest>>10, samples)
	if samples < 5 {
		t.Fatalf("only %d samples of the outside sender's data socket (ss in inet)", samples)
	}
	if largest > windowCap {
		t.Errorf("the outside sender was offered %d bytes while the tunnel was the bottleneck; want at most %d", largest, windowCap)
	}
}
