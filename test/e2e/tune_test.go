// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTune is an opt-in tuning harness for the user-mode data path, not a
// check: it compares environment settings of the gateway and the client
// (GOMAXPROCS, or variables a temporary patch reads) in interleaved iperf3
// runs, 1 and 10 streams both directions, and logs received Gbit/s, gateway
// CPU seconds per Gbit (/proc/PID/stat) and the machine's busy cores.
//
//	AIRLOCK_TUNE_REPS=2 AIRLOCK_TUNE_GW=,GOMAXPROCS=1 AIRLOCK_TUNE_CL=,GOMAXPROCS=1 \
//	  go test -count=1 -v -run TestTune ./test/e2e
//
// AIRLOCK_TUNE_GW and AIRLOCK_TUNE_CL are comma-separated settings, each a
// '+'-separated list of NAME=VALUE ("" is the default environment); every
// repetition runs every gateway setting (the gateway is restarted with it)
// times every client setting. AIRLOCK_TUNE_T is iperf3's -t (default 3).
// AIRLOCK_TUNE_PERF=FILE records the gateway with perf during the 1-stream
// download runs.
func TestTune(t *testing.T) {
	reps, _ := strconv.Atoi(os.Getenv("AIRLOCK_TUNE_REPS"))
	if reps <= 0 {
		t.Skip("set AIRLOCK_TUNE_REPS to run the tuning harness")
	}
	e := newEnv(t)
	port := e.tp.StartIperf3Server(t)
	gws := strings.Split(os.Getenv("AIRLOCK_TUNE_GW"), ",")
	cls := strings.Split(os.Getenv("AIRLOCK_TUNE_CL"), ",")
	dur := os.Getenv("AIRLOCK_TUNE_T")
	if dur == "" {
		dur = "3"
	}
	sec, err := strconv.ParseFloat(dur, 64)
	if err != nil || sec <= 0 {
		t.Fatalf("AIRLOCK_TUNE_T=%q: want seconds", dur)
	}
	res := map[string][]string{}
	var keys []string
	for range reps {
		for _, g := range gws {
			e.restartGatewayEnv(t, envList(g))
			time.Sleep(500 * time.Millisecond)
			for _, c := range cls {
				for _, streams := range []int{1, 10} {
					for _, rev := range []bool{false, true} {
						args := []string{"iperf3", "-c", e.tp.INETAddr.String(), "-t", dur, "-P", strconv.Itoa(streams),
							"--json", "--connect-timeout", "5000", "-p", strconv.Itoa(port)}
						name := fmt.Sprintf("gw=%q cl=%q P%d", g, c, streams)
						if rev {
							args = append(args, "-R")
							name += "-R"
						}
						pid := e.gw.Cmd.Process.Pid
						var perf *exec.Cmd
						if f := os.Getenv("AIRLOCK_TUNE_PERF"); f != "" && rev && streams == 1 {
							perf = exec.Command("perf", "record", "-F", "999", "-g", "-p", strconv.Itoa(pid), "-o", f,
								"--", "sleep", strconv.Itoa(max(1, int(sec)-2)))
							if err := perf.Start(); err != nil {
								t.Logf("perf: %v", err)
								perf = nil
							}
						}
						c0 := procCPU(pid)
						b0, t0 := machineCPU()
						code, out, stderr := e.runWith(t, runOpts{timeout: 40 * time.Second, env: envList(c)}, args...)
						c1 := procCPU(pid)
						b1, t1 := machineCPU()
						if perf != nil {
							perf.Wait()
						}
						gbit := parseIperf(t, name, code, out, stderr, e.diag(stderr)) / 1e9
						busy := 0.0
						if t1 > t0 {
							busy = float64(ncpu()) * (b1 - b0) / (t1 - t0)
						}
						perGbit := 0.0
						if gbit > 0 {
							perGbit = (c1 - c0) / (gbit * sec)
						}
						if _, ok := res[name]; !ok {
							keys = append(keys, name)
						}
						res[name] = append(res[name], fmt.Sprintf("%5.2f (%.2f, %.2f)", gbit, perGbit, busy))
						t.Logf("%s: %.2f Gbit/s, gateway %.2f core-s/Gbit, machine %.2f cores busy", name, gbit, perGbit, busy)
					}
				}
			}
		}
	}
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%-40s %s\n", k, strings.Join(res[k], "  "))
	}
	t.Logf("Gbit/s (gateway core-s/Gbit, machine cores busy), one column per repetition:\n%s", b.String())
}

// envList splits a '+'-separated NAME=VALUE list.
func envList(s string) []string {
	var l []string
	for _, kv := range strings.Split(s, "+") {
		if kv != "" {
			l = append(l, kv)
		}
	}
	return l
}

// restartGatewayEnv stops the gateway and starts it again on the same state
// directory with the extra environment vars.
func (e *env) restartGatewayEnv(t *testing.T, vars []string) {
	t.Helper()
	e.gw.Kill()
	joinEnv := filepath.Join(e.state, "join.env")
	if err := os.Remove(joinEnv); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	args := append(append(vars, e.airlock), e.gwArgs...)
	e.gw = e.tp.Start(t, e.tp.DMZ, e.gwUser, "env", args...)
	v := waitJoinEnv(t, e.gw, e.state, 30*time.Second)
	e.gateway, e.pin = v["AIRLOCK_GATEWAY"], v["AIRLOCK_PIN"]
}

// procCPU returns the user+system CPU seconds of process pid (0 if gone).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndex(s, ")")
	if i < 0 || i+2 > len(s) {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100 // USER_HZ
}

// machineCPU returns the busy and total jiffies of all CPUs (/proc/stat).
func machineCPU() (busy, total float64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, x := range f[1:] {
		v, _ := strconv.ParseFloat(x, 64)
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total
}

// ncpu is the number of CPUs the machine has.
func ncpu() int {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 1
	}
	n := 0
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "cpu") && len(l) > 3 && l[3] >= '0' && l[3] <= '9' {
			n++
		}
	}
	return max(n, 1)
}
