// SPDX-License-Identifier: MIT

package bench

// Theory of operation: TestFleetBench measures what the shared store
// costs a join. Two user-mode gateways run side by side in one dmz, alike
// but for the store: "embedded" keeps its state in its own state directory
// (bbolt), "shared" is a fleet member on a PostgreSQL 15 cluster (test/
// pgtest, on a unix socket in the same machine). Rounds alternate between
// them (ABBA order); each round is a storm of -fleet.n simulated jobs
// (airlock-testpeer jobs, test/loadgen: real TLS joins, WireGuard
// handshakes) started within -fleet.over, held one second and released.
// Per round it records the join latency (p50, p90, p99, max, from the
// clients), the gateway's CPU seconds over the round (utime + stime of its
// process) and, for the shared store, the PostgreSQL server's (every
// process of the cluster), the 1-minute load average before the round,
// and writes everything as a TSV beside the other results.

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
	"github.com/airlock-vpn/airlock/test/pgtest"
	"github.com/airlock-vpn/airlock/test/topology"
)

var (
	flagFleetN      = flag.Int("fleet.n", 200, "jobs per round")
	flagFleetOver   = flag.Duration("fleet.over", 10*time.Second, "a round's jobs start within this long")
	flagFleetRounds = flag.Int("fleet.rounds", 4, "rounds per store (ABBA order)")
)

func TestFleetBench(t *testing.T) {
	if os.Getenv("AIRLOCK_BENCH_FLEET") != "1" {
		t.Skip("fleet benchmark: set AIRLOCK_BENCH_FLEET=1 and run as root under the heavy lock (bench/README.md, \"Fleet\")")
	}
	topology.RequireRoot(t)
	tp := topology.New(t, topology.WithPrefix("fb"))
	u := topology.EnsureUser(t)
	airlock, peer := topology.BuildAirlock(t), topology.BuildPeer(t)
	if code, o, e := tp.Run(t, 10*time.Second, tp.DMZ, nil, "sysctl", "-q", "-w", "net.ipv4.ip_local_port_range=1024 65535"); code != 0 {
		t.Fatalf("sysctl: %s %s", o, e)
	}
	pg := pgtest.Start(t)
	db := pg.CreateDB(t)
	url := pg.URL(pgtest.Superuser, db)
	if code, o, e := tp.Run(t, 30*time.Second, tp.DMZ, u, airlock, "db", "migrate", "--store", url); code != 0 {
		t.Fatalf("db migrate: %s %s", o, e)
	}
	base := topology.TempDir(t)
	if err := os.Chown(base, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	type gw struct {
		name, state, addr, pin, token string
		proc                          *topology.Process
	}
	var gws []*gw
	for i, name := range []string{"embedded", "shared"} {
		g := &gw{name: name, state: filepath.Join(base, name)}
		args := []string{"gateway", "--state", g.state, "--listen", netip.AddrPortFrom(tp.DMZAddrCN, uint16(8443+i)).String(),
			"--block-size", "16", "--flow-log", "off", "--subnet", fmt.Sprintf("100.%d.0.0/16", 64+i), "--log-level", "warn"}
		if name == "shared" {
			args = append(args, "--store", url)
		}
		g.proc = tp.Start(t, tp.DMZ, u, airlock, args...)
		if !topology.PollEvery(60*time.Second, 50*time.Millisecond, func() bool {
			if vals, err := readJoinEnv(filepath.Join(g.state, "join.env")); err == nil && vals["AIRLOCK_PIN"] != "" {
				g.addr, g.pin = vals["AIRLOCK_GATEWAY"], vals["AIRLOCK_PIN"]
				return true
			}
			ok, _ := g.proc.Exited()
			return ok
		}) || g.pin == "" {
			t.Fatalf("gateway %s: %s", name, g.proc.Describe())
		}
		code, o, e := tp.Run(t, 30*time.Second, tp.DMZ, u, airlock, "token", "create", "--state", g.state, "--name", "bench")
		if code != 0 {
			t.Fatalf("token create %s: %s %s", name, o, e)
		}
		g.token = strings.TrimSpace(o)
		gws = append(gws, g)
	}
	out := *flagOut
	if out == "" {
		out = "results"
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	stamp := time.Now().UTC().Format("2006-01-02T150405Z")
	var tsv strings.Builder
	tsv.WriteString("date\tcommit\tstore\tround\tjobs\tok\tjoin_p50_ms\tjoin_p90_ms\tjoin_p99_ms\tjoin_max_ms\tgateway_cpu_s\tdb_cpu_s\tgateway_cpu_ms_per_join\tdb_cpu_ms_per_join\tload1_before\n")
	commit := "unknown"
	if b, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(b))
	}
	for r := 0; r < *flagFleetRounds; r++ {
		order := []*gw{gws[0], gws[1]}
		if r%2 == 1 {
			order = []*gw{gws[1], gws[0]}
		}
		for _, g := range order {
			time.Sleep(2 * time.Second) // the previous round's releases settle
			load := loadAvg()
			cpu0 := procCPU(g.proc.Cmd.Process.Pid)
			db0 := clusterCPU(pg)
			gen := tp.Start(t, tp.CN, nil, peer, "jobs", "-gateway", g.addr, "-pin", g.pin, "-token", g.token,
				"-n", strconv.Itoa(*flagFleetN), "-over", flagFleetOver.String(), "-hold", "1s", "-timeout", "20s",
				"-prefix", fmt.Sprintf("%s-%d", g.name, r))
			rep, ok := genReport(gen, "start", 3*time.Minute)
			if !ok {
				t.Fatalf("round %d %s: no report: %s", r, g.name, gen.Describe())
			}
			if _, err := gen.Wait(2 * time.Minute); err != nil {
				t.Fatalf("round %d %s: %v", r, g.name, err)
			}
			cpu := procCPU(g.proc.Cmd.Process.Pid) - cpu0
			dbc := 0.0
			if g.name == "shared" {
				dbc = clusterCPU(pg) - db0
			}
			n := max(rep.OK, 1)
			fmt.Fprintf(&tsv, "%s\t%s\t%s\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\n",
				stamp, commit, g.name, r, *flagFleetN, rep.OK, rep.Join.P50, rep.Join.P90, rep.Join.P99, rep.Join.Max,
				cpu, dbc, 1000*cpu/float64(n), 1000*dbc/float64(n), load)
			if rep.OK != *flagFleetN {
				t.Errorf("round %d %s: %d of %d jobs joined: %v", r, g.name, rep.OK, *flagFleetN, rep.Errors)
			}
		}
	}
	path := filepath.Join(out, "fleet-"+stamp+".tsv")
	if err := os.WriteFile(path, []byte(tsv.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s:\n%s", path, tsv.String())
	for _, g := range gws {
		g.proc.Signal(syscall.SIGTERM)
		g.proc.Wait(30 * time.Second)
	}
}

// readJoinEnv parses join.env's KEY=VALUE lines.
func readJoinEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	vals := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), "="); ok {
			vals[k] = v
		}
	}
	return vals, sc.Err()
}

// clusterCPU returns the CPU seconds of every process of the cluster: the
// postmaster and its children (backends, writers), live or reaped.
func clusterCPU(pg *pgtest.Cluster) float64 {
	pid := pg.Pid()
	total := procCPU(pid)
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+2:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			total += procCPU(p) - childCPU(p)
		}
	}
	return total
}

// childCPU returns the reaped children's part of procCPU(pid), so that it
// is not counted twice.
func childCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 15 {
		return 0
	}
	a, _ := strconv.ParseFloat(f[13], 64)
	c, _ := strconv.ParseFloat(f[14], 64)
	return (a + c) / clockTicks
}

var flagFleetSizing = flag.Int("fleet.sizing", 100000, "leases written for the sizing measurement (0: none)")

// TestFleetBenchSizing measures what the shared history costs in the
// database: -fleet.sizing lease records (with their attribution rows), as
// gateways write them, spread over 400 days, 3 gateways, 2,500 blocks of
// 16 ports each; then the bytes per lease (tables and indexes) and the
// latency of whois lookups at random addresses, ports and times.
func TestFleetBenchSizing(t *testing.T) {
	if os.Getenv("AIRLOCK_BENCH_FLEET") != "1" || *flagFleetSizing == 0 {
		t.Skip("fleet sizing: set AIRLOCK_BENCH_FLEET=1 (bench/README.md, \"Fleet\")")
	}
	pg := pgtest.Start(t)
	db := pg.CreateDB(t)
	cfg := pgstore.Config{URL: pg.URL(pgtest.Superuser, db), Timeout: time.Minute}
	if _, _, err := pgstore.Migrate(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	st, err := pgstore.Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n := *flagFleetSizing
	t0 := time.Now().Add(-400 * 24 * time.Hour)
	span := 400 * 24 * time.Hour / time.Duration(n)
	pubs := []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("203.0.114.1"), netip.MustParseAddr("203.0.115.1")}
	rec := func(i int) store.LeaseRecord {
		start := t0.Add(time.Duration(i) * span)
		blk := i % 2500
		return store.LeaseRecord{ID: fmt.Sprintf("%024x", i), JobID: strconv.Itoa(4000000 + i), BatchSystem: "slurm",
			User: fmt.Sprintf("user%03d", i%300), UID: 10000 + i%300, Host: fmt.Sprintf("node%04d.cluster.example.org", i%2000),
			Command: "/usr/bin/python3", Token: "cms-pilots", Remote: fmt.Sprintf("10.1.%d.%d:%d", i%200, i%250, 40000+i%20000),
			Gateway: "gw1.example.org:8443", TunnelAddrs: []netip.Addr{netip.AddrFrom4([4]byte{100, 64, byte(blk / 250), byte(blk%250 + 2)})},
			Egress: []store.Attribution{{Addr: pubs[i%3], PortLo: uint16(20000 + 16*blk), PortHi: uint16(20000 + 16*blk + 15)}},
			Start:  start, End: start.Add(6 * time.Hour), EndReason: "released"}
	}
	w0 := time.Now()
	const batch = 1000
	for i := 0; i < n; i += batch {
		recs := make([]store.LeaseRecord, 0, batch)
		for j := i; j < min(i+batch, n); j++ {
			recs = append(recs, rec(j))
		}
		if err := st.PutLeases(recs); err != nil {
			t.Fatal(err)
		}
	}
	write := time.Since(w0)
	pg.Exec(t, db, "vacuum analyze")
	h, err := st.HistoryStats()
	if err != nil {
		t.Fatal(err)
	}
	var lat []time.Duration
	found := 0
	for k := 0; k < 500; k++ {
		i := (k * 7919) % n
		r := rec(i)
		q0 := time.Now()
		got, err := st.Whois(r.Egress[0].Addr, r.Egress[0].PortLo+uint16(k%16), r.Start.Add(time.Hour))
		lat = append(lat, time.Since(q0))
		if err != nil {
			t.Fatal(err)
		}
		for _, g := range got {
			if g.ID == r.ID {
				found++
			}
		}
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	out := *flagOut
	if out == "" {
		out = "results"
	}
	stamp := time.Now().UTC().Format("2006-01-02T150405Z")
	row := fmt.Sprintf("date\tleases\tbytes\tbytes_per_lease\twrite_s\twhois_p50_ms\twhois_p99_ms\twhois_found\tload1\n%s\t%d\t%d\t%.0f\t%.1f\t%.2f\t%.2f\t%d/500\t%.2f\n",
		stamp, h.Leases, h.Bytes, float64(h.Bytes)/float64(max(h.Leases, 1)), write.Seconds(),
		ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), found, loadAvg())
	if err := os.WriteFile(filepath.Join(out, "fleet-sizing-"+stamp+".tsv"), []byte(row), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("sizing:\n%s", row)
	if found != 500 {
		t.Errorf("whois found %d of 500 leases", found)
	}
}
