// SPDX-License-Identifier: MIT

package bench

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestManyJobs measures a user-mode gateway's aggregate throughput with
// many jobs at once, at several GOMAXPROCS of the gateway and for several
// airlock binaries (A/B), the rest held equal: one topology per
// (binary, GOMAXPROCS) configuration, each with -bench.manyjobs.n jobs
// (`airlock run -- sleep`) and an iperf3 server per job in inet. A point
// is every job's iperf3 (one stream, -bench.duration s) at once, upload
// or download; configurations are interleaved within each repetition
// (their order reversed every other repetition), so a busy machine's
// drift falls on all of them. Each row has the aggregate, the gateway
// tree's CPU seconds, the 1-minute load before and after and the busy
// cores before the point (the load gate is not applied: the figures are
// marked as measured under load). Rows go to results/STAMP-manyjobs.tsv.
//
//	AIRLOCK_BENCH=1 go test ./bench -run TestManyJobs -timeout 2h \
//	  -bench.manyjobs.bins new=/tmp/airlock-new,old=/tmp/airlock-main \
//	  -bench.manyjobs.procs 1,2 -bench.manyjobs.n 8 -bench.duration 8 -bench.reps 3
func TestManyJobs(t *testing.T) {
	if os.Getenv("AIRLOCK_BENCH") != "1" {
		t.Skip("benchmark: set AIRLOCK_BENCH=1 (and run as root)")
	}
	topology.RequireRoot(t)
	procs, err := parseInts(*flagMJProcs)
	if err != nil {
		t.Fatal(err)
	}
	type config struct {
		name, bin string
		procs     int
		tp        *topology.Topology
		gw        *daemon
		jobs      []int // each job's sleep pid
		ports     []int // each job's iperf3 server
	}
	var cfgs []*config
	for _, nb := range splitList(*flagMJBins) {
		name, path, ok := strings.Cut(nb, "=")
		if !ok {
			t.Fatalf("-bench.manyjobs.bins %q: want NAME=PATH", nb)
		}
		for _, p := range procs {
			cfgs = append(cfgs, &config{name: fmt.Sprintf("%s@GOMAXPROCS=%d", name, p), bin: path, procs: p})
		}
	}
	if len(cfgs) == 0 {
		t.Fatal("no configurations: set -bench.manyjobs.bins")
	}
	stamp := time.Now().UTC().Format("2006-01-02T150405Z")
	logs := logDir(filepath.Join("results", stamp+"-manyjobs"))
	u := topology.EnsureUser(t)
	n := *flagMJN
	for _, c := range cfgs {
		c.tp = topology.New(t)
		gw, gateway, pin, token, err := airlockGatewayEnv(t, c.tp, logs, c.bin, "user", []string{"GOMAXPROCS=" + strconv.Itoa(c.procs)})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		c.gw = gw
		for j := 0; j < n; j++ {
			c.ports = append(c.ports, c.tp.StartIperf3Server(t))
			p := startDaemon(t, c.tp, logs, fmt.Sprintf("%s-run-%d", sanitize(c.name), j), c.tp.CN, u, "", c.bin,
				"run", "--gateway", gateway, "--pin", pin, "--token", token, "--", "sleep", "100000")
			var pid int
			if err := waitUntil(60*time.Second, p, func() bool {
				pid = findDescendant(p.pid(), "sleep")
				return pid != 0 && tcpCheckIn(t, c.tp, nsJobPeer(t, pid))
			}); err != nil {
				t.Fatalf("%s job %d: %v: %s", c.name, j, err, p.describe())
			}
			c.jobs = append(c.jobs, pid)
		}
	}
	tsv := filepath.Join("results", stamp+"-manyjobs.tsv")
	f, err := os.Create(tsv)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintln(f, "date\tconfig\tgomaxprocs\tjobs\tdirection\trep\tduration_s\taggregate_mbps\tjobs_ok\tgateway_cpu_s\tload1_before\tload1_after\tbusy_cores_before\tnote")
	for rep := 1; rep <= *flagReps; rep++ {
		order := append([]*config(nil), cfgs...)
		if rep%2 == 0 {
			for i, j := 0, len(order)-1; i < j; i, j = i+1, j-1 {
				order[i], order[j] = order[j], order[i]
			}
		}
		for _, dir := range []string{"up", "down"} {
			for _, c := range order {
				busy := busyCores(2 * time.Second)
				l0 := loadAvg1()
				cpu0 := treesCPU([]int{c.gw.pid()})
				agg, ok := manyIperf(t, c.tp, u, c.jobs, c.ports, dir, *flagDuration)
				cpu1 := treesCPU([]int{c.gw.pid()})
				l1 := loadAvg1()
				note := "under load: other sessions' work on this machine"
				row := fmt.Sprintf("%s\t%s\t%d\t%d\t%s\t%d\t%d\t%.0f\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t%s",
					now(), c.name, c.procs, n, dir, rep, *flagDuration, agg/1e6, ok, cpu1-cpu0, l0, l1, busy, note)
				fmt.Fprintln(f, row)
				t.Log(row)
			}
		}
	}
}

var (
	flagMJBins  = flag.String("bench.manyjobs.bins", "", "TestManyJobs: airlock binaries NAME=PATH, comma-separated (A/B)")
	flagMJProcs = flag.String("bench.manyjobs.procs", "1,2", "TestManyJobs: the gateway's GOMAXPROCS values")
	flagMJN     = flag.Int("bench.manyjobs.n", 8, "TestManyJobs: jobs at once")
)

// manyIperf runs one iperf3 per job at once (upload, or download with
// "down") and returns the sum of the received rates and how many
// succeeded.
func manyIperf(t *testing.T, tp *topology.Topology, u *topology.User, jobs, ports []int, dir string, secs int) (float64, int) {
	var mu sync.Mutex
	var sum float64
	ok := 0
	var wg sync.WaitGroup
	for i := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			args := []string{"iperf3", "-c", tp.INETAddr.String(), "-p", strconv.Itoa(ports[i]), "-t", strconv.Itoa(secs), "--json", "--connect-timeout", "10000"}
			if dir == "down" {
				args = append(args, "-R")
			}
			argv := nsJob(jobs[i], args...)
			code, out, stderr := tp.Run(t, time.Duration(secs+60)*time.Second, tp.CN, u, argv[0], argv[1:]...)
			var r struct {
				End struct {
					SumReceived struct {
						BitsPerSecond float64 `json:"bits_per_second"`
					} `json:"sum_received"`
				} `json:"end"`
				Error string `json:"error"`
			}
			if err := json.Unmarshal([]byte(out), &r); err != nil || code != 0 || r.Error != "" {
				t.Logf("job %d iperf3: exit %d, %q %v: %.300s", i, code, r.Error, err, stderr)
				return
			}
			mu.Lock()
			sum += r.End.SumReceived.BitsPerSecond
			ok++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return sum, ok
}
