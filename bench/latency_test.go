// SPDX-License-Identifier: MIT

package bench

// The latency test: round trips through a configuration while the job is
// otherwise idle, and while a second job on the same client host runs a
// bulk iperf3 transfer (download, then upload) through the same gateway —
// the bufferbloat case: a bulk transfer in one job must not delay another
// job's interactive traffic. Two probes run side by side for the test's
// duration: bench/rr (TCP request/response of 64 bytes every 20 ms on one
// connection, as the test user in the job's network) and ping (ICMP echo
// every 20 ms, as root in the job's network namespace). Each is repeated
// at once on the native topology (with its own bulk transfer when there is
// one), so every row carries its native baseline; "added" is the
// difference.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	osexec "os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/bench/record"
	"github.com/airlock-vpn/airlock/test/topology"
)

const probeInterval = 20 * time.Millisecond

var flagBreakdown = flag.Bool("bench.breakdown", false, "under bulk, also ping inet from dmz (the queue on the outside link) and the job's resolver from the job (the queue between gateway and job), and log both: where a latency run's added delay sits")

// probeResult is one probe's round trips.
type probeResult struct {
	n        int
	p50, p99 float64 // ms
	err      error
}

// latency measures tg (and native after it) idle and under a bulk
// download and upload in a second job, and writes a row per probe.
func (b *bencher) latency(t *testing.T, tg, native *target, u *topology.User, link string, rep int) {
	if tg.st.netnsPID() < 0 {
		b.latRow(record.Latency{Config: tg.name, Link: link, Rep: rep, Probe: "tcp-rr", Bulk: "idle",
			Note: "not measured: the job has no network namespace of its own"})
		return
	}
	if tg.second == nil {
		second, err := tg.st.second(t, logDir(string(b.out)+"/logs/"+sanitize(link)+"/"+tg.name))
		if err != nil {
			t.Errorf("%s %s: latency: %v", tg.name, link, err)
			b.latRow(record.Latency{Config: tg.name, Link: link, Rep: rep, Probe: "tcp-rr", Bulk: "down", Note: "not measured: " + err.Error()})
			return
		}
		tg.second = second
	}
	if native.second == nil {
		native.second = native.st.job
	}
	for _, bulk := range []string{"idle", "down", "up"} {
		what := fmt.Sprintf("latency %s %s %s rep %d", tg.name, link, bulk, rep)
		load1, busy, _, retries, gaveUp := b.gate(t, tg, what)
		note := ""
		if gaveUp {
			note = fmt.Sprintf("LOAD GATE GAVE UP: %.2f busy cores before; ", busy)
		}
		rr, ping, mbps, err := b.probe(t, tg, u, bulk)
		nrr, nping, _, nerr := b.probe(t, native, u, bulk)
		for _, p := range []struct {
			name   string
			r, nat probeResult
		}{{"tcp-rr", rr, nrr}, {"ping", ping, nping}} {
			l := record.Latency{Config: tg.name, Link: link, Probe: p.name, Bulk: bulk, Rep: rep, Retries: retries, Kept: true,
				N: p.r.n, P50: p.r.p50, P99: p.r.p99, NativeP50: p.nat.p50, NativeP99: p.nat.p99, BulkMbps: mbps,
				LoadBefore: load1, BusyBefore: busy, Note: note}
			for _, e := range []struct {
				pre string
				err error
			}{{"bulk: ", err}, {"", p.r.err}, {"native: ", nerr}, {"native: ", p.nat.err}} {
				if e.err != nil {
					l.Note += e.pre + e.err.Error() + "; "
					l.Kept = false
				}
			}
			if !l.Kept {
				t.Logf("%s %s: %s", what, p.name, l.Note)
			}
			t.Logf("%-40s %-6s n %4d  p50 %7.3f ms p99 %7.3f ms  native %7.3f / %7.3f  bulk %8.1f Mbit/s",
				what, p.name, l.N, l.P50, l.P99, l.NativeP50, l.NativeP99, mbps)
			b.latRow(l)
		}
	}
}

func (b *bencher) latRow(l record.Latency) {
	l.Date, l.Mode, l.Commit = now(), b.mode, b.commit
	_ = b.lat.Latency(l)
}

// probe runs both probes through tg for the test's duration, with a bulk
// iperf3 transfer in tg's second job if bulk is "down" or "up", and
// returns the probes' results and the bulk throughput.
func (b *bencher) probe(t *testing.T, tg *target, u *topology.User, bulk string) (rr, ping probeResult, mbps float64, err error) {
	tp := tg.st.tp()
	secs := *flagDuration
	var wg sync.WaitGroup
	var bulkRes iperfRes
	var bulkErr error
	if bulk != "idle" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bulkRes, _, bulkErr = runIperf(t, tp, u, tg.second(iperfArgs(tg, 1, bulk, secs+3)...), secs+3)
		}()
		time.Sleep(2 * time.Second) // past slow start
	}
	count := int(time.Duration(secs) * time.Second / probeInterval)
	wg.Add(2)
	go func() {
		defer wg.Done()
		argv := tg.st.job(b.rr, "client", "-addr", fmt.Sprintf("%s:%d", tp.INETAddr, tg.rrPort), "-count", strconv.Itoa(count),
			"-interval", probeInterval.String(), "-size", "64", "-timeout", fmt.Sprintf("%ds", secs+30))
		code, out, stderr := tp.Run(t, time.Duration(secs+40)*time.Second, tp.CN, u, argv[0], argv[1:]...)
		var r struct {
			N     int     `json:"n"`
			P50ms float64 `json:"p50_ms"`
			P99ms float64 `json:"p99_ms"`
		}
		if err := json.Unmarshal([]byte(out), &r); code != 0 || err != nil {
			rr.err = fmt.Errorf("rr exit %d: %.300s", code, stderr)
			return
		}
		rr = probeResult{n: r.N, p50: r.P50ms, p99: r.P99ms}
	}()
	go func() {
		defer wg.Done()
		ping = runPing(t, tp, tg.st.netnsPID(), count, secs)
	}()
	if *flagBreakdown && bulk != "idle" {
		wg.Add(2)
		go func() {
			defer wg.Done()
			r := runPingTo(t, tp, tp.DMZ, 0, count, secs, tp.INETAddr.String())
			t.Logf("breakdown %s %s: dmz -> inet ping p50 %.3f ms p99 %.3f ms (n %d, err %v)", tg.name, bulk, r.p50, r.p99, r.n, r.err)
		}()
		go func() {
			defer wg.Done()
			pid := tg.st.netnsPID()
			if pid <= 0 {
				return
			}
			out, _ := osexec.Command("nsenter", "-t", strconv.Itoa(pid), "-n", "-m", "cat", "/etc/resolv.conf").Output()
			gw := ""
			for _, l := range strings.Split(string(out), "\n") {
				if f := strings.Fields(l); len(f) == 2 && f[0] == "nameserver" && !strings.Contains(f[1], ":") {
					gw = f[1]
					break
				}
			}
			r := runPingTo(t, tp, tp.CN, pid, count, secs, gw)
			t.Logf("breakdown %s %s: job -> its resolver %s ping p50 %.3f ms p99 %.3f ms (n %d, err %v)", tg.name, bulk, gw, r.p50, r.p99, r.n, r.err)
		}()
	}
	wg.Wait()
	if bulk != "idle" {
		if bulkErr != nil {
			return rr, ping, 0, bulkErr
		}
		mbps = bulkRes.bps / 1e6
	}
	return rr, ping, mbps, nil
}

// runPing pings inet count times every probeInterval as root, in cn or in
// the network namespace of pid, and returns the percentiles of the
// replies' times.
func runPing(t *testing.T, tp *topology.Topology, pid, count, secs int) probeResult {
	return runPingTo(t, tp, tp.CN, pid, count, secs, tp.INETAddr.String())
}

func runPingTo(t *testing.T, tp *topology.Topology, ns string, pid, count, secs int, dst string) probeResult {
	argv := []string{"ping", "-n", "-c", strconv.Itoa(count), "-i", fmt.Sprintf("%.3f", probeInterval.Seconds()), "-W", "2", dst}
	if pid > 0 {
		argv = append([]string{"nsenter", "-t", strconv.Itoa(pid), "-n", "--"}, argv...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs+30)*time.Second)
	defer cancel()
	cmd := tp.Command(ctx, ns, nil, argv[0], argv[1:]...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	_ = cmd.Run()
	times := parsePing(o.String())
	if len(times) < count/2 {
		return probeResult{err: fmt.Errorf("ping: %d of %d replies: %.200s", len(times), count, e.String()+lastLine(o.String()))}
	}
	return probeResult{n: len(times), p50: record.Percentile(times, 50), p99: record.Percentile(times, 99)}
}

// parsePing returns the "time=X ms" values of ping's reply lines.
func parsePing(out string) []float64 {
	var times []float64
	for _, l := range strings.Split(out, "\n") {
		i := strings.Index(l, " time=")
		if i < 0 {
			continue
		}
		f := strings.Fields(l[i+len(" time="):])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			times = append(times, v)
		}
	}
	return times
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
