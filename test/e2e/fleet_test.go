// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/loadgen"
	"github.com/airlock-vpn/airlock/test/pgtest"
	"github.com/airlock-vpn/airlock/test/topology"
)

// fleetGW is one gateway of the fleet test: A in dmz (the env's own), B in
// dmz2, C in dmz3.
type fleetGW struct {
	name, ns, state, addr, pin string
	egress                     netip.Addr
	args                       []string
	proc                       *topology.Process
}

// fleetEnv is three gateways sharing one PostgreSQL database.
type fleetEnv struct {
	*env
	pg *pgtest.Cluster
	db string
	// ownerURL is the schema owner's connection (migrations); adminURL
	// the admin host's (a role of airlock_fleet_admin); each gateway has
	// a login role of its own in airlock_fleet_gateway (fleetGW.role).
	ownerURL, adminURL string
	// key is the fleet key file every gateway is given (--fleet-key).
	key string
	gws []*fleetGW
	// t is the test's, which owns the gateways' processes (a subtest's
	// cleanup would stop one it restarted).
	t *testing.T
}

// fleetAdminRole is the admin host's login role; gateway X's is gw_x.
const fleetAdminRole = "airlock_ops"

// fleetArgs are every fleet gateway's extra flags: its own database role,
// the fleet key, and 312 blocks of 128 ports, so that one gateway holds
// the failover's 300 jobs and a job's request a second to one server does
// not run out of ports (each connection's TIME_WAIT holds its port for a
// minute).
func (f *fleetEnv) fleetArgs(name string) []string {
	return []string{"--store", f.pg.URL("gw_"+strings.ToLower(name), f.db), "--fleet-key", f.key,
		"--egress-ports", "20000-59999", "--block-size", "128", "--renew-interval", "5s"}
}

func newFleetEnv(t *testing.T) *fleetEnv {
	f := &fleetEnv{t: t}
	f.env = newEnvHook(t, modeUser, []topology.Option{topology.WithThirdDMZ()}, func(e *env) []string {
		f.pg = pgtest.Start(t)
		f.db = f.pg.CreateDB(t)
		f.ownerURL = f.pg.URL(pgtest.Superuser, f.db)
		f.adminURL = f.pg.URL(fleetAdminRole, f.db)
		e.tokenStore = f.adminURL
		// As the docs say: the owner migrates and makes the roles, one
		// per gateway and one for the admin host; no hand-written GRANT.
		code, out, stderr := e.tp.Run(t, 30*time.Second, e.tp.DMZ, nil, e.airlock, "db", "migrate", "--store", f.ownerURL,
			"--gateway-role", "gw_a,gw_b,gw_c", "--admin-role", fleetAdminRole)
		if code != 0 || !strings.Contains(out+stderr, "schema version") {
			t.Fatalf("airlock db migrate: exit %d %s %s", code, out, stderr)
		}
		f.key = filepath.Join(filepath.Dir(e.state), "fleet.key")
		if code, out, stderr := e.tp.Run(t, 30*time.Second, e.tp.DMZ, e.gwUser, e.airlock, "db", "fleet-key", f.key); code != 0 {
			t.Fatalf("airlock db fleet-key: exit %d %s %s", code, out, stderr)
		}
		return append(f.fleetArgs("A"), "--subnet", "100.64.0.0/16")
	})
	a := &fleetGW{name: "A", ns: f.tp.DMZ, state: f.state, addr: f.gateway, pin: f.pin, egress: topology.DMZAddrINET, args: f.gwArgs, proc: f.gw}
	f.gws = []*fleetGW{a}
	for _, h := range []struct {
		ns         string
		cn, inet   netip.Addr
		subnet     string
		name, dirn string
		extra      []string
	}{
		{f.tp.DMZ2, topology.DMZ2AddrCN, topology.DMZ2AddrINET, "100.65.0.0/16", "B", "state-b", nil},
		// C is fail-closed (DatabaseDown60s): it refuses joins once its
		// copy of the tokens and bans is 20 s old.
		{f.tp.DMZ3, topology.DMZ3AddrCN, topology.DMZ3AddrINET, "100.66.0.0/16", "C", "state-c", []string{"--store-fail-closed", "--store-stale", fleetStale.String()}},
	} {
		f.tp.SetResolvConf(h.ns, f.dnsAddr)
		g := &fleetGW{name: h.name, ns: h.ns, state: filepath.Join(filepath.Dir(f.state), h.dirn), egress: h.inet}
		g.args = append([]string{"gateway", "--state", g.state, "--listen", netip.AddrPortFrom(h.cn, gatewayPort).String(),
			"--subnet", h.subnet, "--egress-addr", h.inet.String(), "--expose-ports", "8080"}, f.fleetArgs(h.name)...)
		g.args = append(g.args, h.extra...)
		f.startFleetGW(t, g)
		f.gws = append(f.gws, g)
	}
	f.linkGateways(t)
	// Every gateway registered, and every one has read the others'
	// records (they do every 2 s).
	var alive int
	var out string
	if !topology.PollEvery(30*time.Second, 200*time.Millisecond, func() bool {
		var code int
		code, out, _ = f.adminHost(t, "status", "--fleet", "--store", f.adminURL, "--json")
		var st fleet.Status
		alive = 0
		if code == 0 && json.Unmarshal([]byte(out), &st) == nil {
			for _, m := range st.Members {
				if m.Alive {
					alive++
				}
			}
		}
		return alive == 3
	}) {
		t.Fatalf("%d of 3 gateways registered in the fleet after 30 s: %s", alive, out)
	}
	time.Sleep(2500 * time.Millisecond)
	return f
}

// fleetStale is gateway C's --store-stale (fail-closed).
const fleetStale = 20 * time.Second

// gatewayTable is inet's routing table for the gateways' traffic to one
// another (linkGateways).
const gatewayTable = "127"

// linkGateways lets the gateway hosts reach one another's control ports,
// as a site's DMZ hosts do: inet forwards between them (table
// gatewayTable, used for packets that come in from a gateway host), while
// inet itself, the test's admin host, still reaches only the database
// (adminHostReachesGateways changes that).
func (f *fleetEnv) linkGateways(t *testing.T) {
	t.Helper()
	ip := func(args ...string) {
		t.Helper()
		if code, out, stderr := f.tp.Run(t, 10*time.Second, f.tp.INET, nil, "ip", args...); code != 0 {
			t.Fatalf("ip %s in inet: exit %d %s %s", strings.Join(args, " "), code, out, stderr)
		}
	}
	if code, out, stderr := f.tp.Run(t, 10*time.Second, f.tp.INET, nil, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"); code != 0 {
		t.Fatalf("sysctl in inet: exit %d %s %s", code, out, stderr)
	}
	for _, h := range []struct {
		ifname   string
		cn, inet netip.Addr
	}{
		{topology.IfINETToDMZ, f.tp.DMZAddrCN, f.tp.DMZAddrINET},
		{topology.IfINETToDMZ2, topology.DMZ2AddrCN, topology.DMZ2AddrINET},
		{topology.IfINETToDMZ3, topology.DMZ3AddrCN, topology.DMZ3AddrINET},
	} {
		ip("route", "add", netip.PrefixFrom(h.cn, 24).Masked().String(), "via", h.inet.String(), "table", gatewayTable)
		ip("rule", "add", "iif", h.ifname, "lookup", gatewayTable)
	}
}

// adminHostReachesGateways gives the admin host (inet) routes to the
// gateways' control ports until the test ends.
func (f *fleetEnv) adminHostReachesGateways(t *testing.T) {
	t.Helper()
	rule := []string{"rule", "add", "iif", "lo", "lookup", gatewayTable}
	if code, out, stderr := f.tp.Run(t, 10*time.Second, f.tp.INET, nil, "ip", rule...); code != 0 {
		t.Fatalf("ip %s in inet: exit %d %s %s", strings.Join(rule, " "), code, out, stderr)
	}
	t.Cleanup(func() {
		rule[1] = "del"
		f.tp.Run(t, 10*time.Second, f.tp.INET, nil, "ip", rule...)
	})
}

// startFleetGW starts g (again) and waits for its join.env.
func (f *fleetEnv) startFleetGW(t *testing.T, g *fleetGW) {
	t.Helper()
	os.Remove(filepath.Join(g.state, "join.env"))
	g.proc = f.tp.Start(f.t, g.ns, f.gwUser, f.airlock, g.args...)
	vals := waitJoinEnv(t, g.proc, g.state, 30*time.Second)
	g.addr, g.pin = vals["AIRLOCK_GATEWAY"], vals["AIRLOCK_PIN"]
}

// adminHost runs an airlock admin command on an "admin host" that reaches
// only the database (its unix socket): inet, which runs no gateway.
func (f *fleetEnv) adminHost(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return f.tp.Run(t, 30*time.Second, f.tp.INET, f.gwUser, f.airlock, args...)
}

// on runs opts for gateway g only.
func (f *fleetEnv) on(g *fleetGW, extra ...string) runOpts {
	return runOpts{gateway: g.addr, pin: g.pin, env: extra, flags: []string{"--log-level", "info"}}
}

// waitStderr waits until p's stderr contains s and returns when.
func waitStderr(t *testing.T, p *topology.Process, s string, timeout time.Duration) time.Time {
	t.Helper()
	if !topology.Poll(timeout, func() bool { return strings.Contains(p.Stderr(), s) }) {
		t.Fatalf("%q not in stderr within %v: %s", s, timeout, p.Describe())
	}
	return time.Now()
}

// TestFleet runs three gateways (dmz, dmz2, dmz3) on one PostgreSQL 15
// database (test/pgtest, as an unprivileged user), the gateways as the
// least-privilege role of docs/fleet.md, with real clients in cn:
// a token made on one gateway admits jobs on the others, and a job given
// one gateway learns the fleet; a revocation from an admin host that
// reaches only the database ends the token's jobs on every gateway within
// 1 s; a kick with a ban on one gateway ends a job held by another and the
// ban holds on a third; whois answers for every gateway's address from any
// gateway and from the admin host, also for a gateway that no longer
// exists; with the database stopped for 60 s jobs keep flowing, joins go
// on, and every attribution record reaches the database when it is back,
// also those of a gateway killed with SIGKILL meanwhile; and the 300 jobs
// of a gateway killed with SIGKILL fail over to the other two in
// proportion to their free capacity.
func TestFleet(t *testing.T) {
	f := newFleetEnv(t)
	a, b, c := f.gws[0], f.gws[1], f.gws[2]

	t.Run("OneAddressLearnsTheFleet", func(t *testing.T) {
		// The env's token was made on the admin host (into the
		// database); B admits it. The job knows only B.
		code, out, stderr := f.runWith(t, f.on(b), "sh", "-c", `cat "$AIRLOCK_EGRESS_FILE"`)
		if code != 0 {
			t.Fatalf("job on B with A's token: exit %d%s", code, f.diag(stderr))
		}
		if !strings.Contains(out, "AIRLOCK_EGRESS_ADDR="+b.egress.String()) || !strings.Contains(out, "AIRLOCK_GATEWAY="+b.addr) {
			t.Errorf("AIRLOCK_EGRESS_FILE: %q, want B's egress address and gateway", out)
		}
		m := regexp.MustCompile(`learned the fleet's gateways.* added=(\d+)`).FindStringSubmatch(stderr)
		if m == nil || m[1] != "2" {
			t.Errorf("client given B did not learn the 2 other gateways from its lease:\n%s", stderr)
		}
	})

	t.Run("RevokeEverywhereWithin1s", func(t *testing.T) {
		code, out, stderr := f.adminHost(t, "token", "create", "--store", f.adminURL, "--name", "revokeme")
		tok := strings.TrimSpace(out)
		if code != 0 || tok == "" {
			t.Fatalf("token create --store (admin host): exit %d %s %s", code, out, stderr)
		}
		var jobs []*topology.Process
		for _, g := range f.gws {
			o := f.on(g)
			o.token = tok
			jobs = append(jobs, f.startWith(t, o, "sleep", "60"))
		}
		for i := range f.gws {
			waitStderr(t, jobs[i], "transport: ", 30*time.Second)
		}
		start := time.Now()
		code, out, stderr = f.adminHost(t, "token", "revoke", "--store", f.adminURL, "revokeme")
		done := time.Now()
		if code != 0 {
			t.Fatalf("token revoke --store: exit %d %s %s", code, out, stderr)
		}
		for i, g := range f.gws {
			at := waitStderr(t, jobs[i], "THE GATEWAY ENDED THIS JOB'S LEASE", 5*time.Second)
			t.Logf("gateway %s ended the job %v after the revoke command returned (%v after it started)", g.name,
				at.Sub(done).Round(time.Millisecond), at.Sub(start).Round(time.Millisecond))
			if at.Sub(done) > time.Second {
				t.Errorf("gateway %s ended the revoked token's job %v after the revocation, want within 1 s", g.name, at.Sub(done))
			}
		}
		o := f.on(c)
		o.token = tok
		if code, _, stderr := f.runWith(t, o, "true"); code == 0 || !strings.Contains(stderr, "token") {
			t.Errorf("join with the revoked token on C: exit %d, want a refusal: %s", code, stderr)
		}
		for _, j := range jobs {
			j.Kill()
		}
	})

	t.Run("KickAndBanAcrossGateways", func(t *testing.T) {
		job := f.startWith(t, f.on(a, "AIRLOCK_JOB_ID=fleet-kick-1"), "sleep", "60")
		defer job.Kill()
		waitStderr(t, job, "transport: ", 30*time.Second)
		// Asked on B, which does not hold it.
		code, out, stderr := f.tp.Run(t, 30*time.Second, b.ns, f.gwUser, f.airlock, "kick", "--state", b.state, "--ban", "1h", "--reason", "abuse", "fleet-kick-1")
		if code != 0 || !strings.Contains(out+stderr, a.addr) {
			t.Fatalf("kick on B of a job on A: exit %d %s %s (want the lease ended, naming gateway A)", code, out, stderr)
		}
		waitStderr(t, job, "THE GATEWAY ENDED THIS JOB'S LEASE", 5*time.Second)
		// The ban (token and host) holds on C within a second.
		time.Sleep(time.Second)
		code, _, stderr = f.runWith(t, f.on(c), "true")
		if code == 0 || !strings.Contains(stderr, "banned") {
			t.Errorf("job from the banned host on C: exit %d, want refused as banned: %s", code, stderr)
		}
	})

	// The later subtests need joins from cn again: the ban above is
	// for the token e2e from cn; they use a token of their own.
	code, out, stderr := f.adminHost(t, "token", "create", "--store", f.adminURL, "--name", "fleet")
	if code != 0 {
		t.Fatalf("token create --store: exit %d %s %s", code, out, stderr)
	}
	tok := strings.TrimSpace(out)
	on := func(g *fleetGW, env ...string) runOpts {
		o := f.on(g, env...)
		o.token = tok
		return o
	}

	var whoisAt time.Time
	var whoisAP netip.AddrPort
	t.Run("WhoisFromAnywhere", func(t *testing.T) {
		port := f.tp.StartTCPSrcPort(t)
		srv := netip.AddrPortFrom(f.tp.INETAddr, uint16(port)).String()
		// The job prints where its connection came from, then the time
		// (its lease is live then).
		code, out, stderr := f.runWith(t, on(c, "AIRLOCK_JOB_ID=fleet-whois"), "sh", "-c", f.peer+" tcpsrcclient "+srv+" 1 && date +%s.%N && sleep 1")
		lines := strings.Fields(out)
		if code != 0 || len(lines) != 2 {
			t.Fatalf("job on C: exit %d, stdout %q%s", code, out, f.diag(stderr))
		}
		ap, err := netip.ParseAddrPort(lines[0])
		if err != nil || ap.Addr() != c.egress {
			t.Fatalf("job on C connected from %q, want C's egress address %v", lines[0], c.egress)
		}
		secs, err := strconv.ParseFloat(lines[1], 64)
		if err != nil {
			t.Fatalf("job's time %q: %v", lines[1], err)
		}
		whoisAt, whoisAP = time.Unix(0, int64(secs*1e9)), ap
		time.Sleep(500 * time.Millisecond) // the shipper's round
		for _, w := range []struct {
			where string
			args  []string
			ns    string
		}{
			{"gateway A", []string{"whois", "--state", a.state}, a.ns},
			{"gateway B", []string{"whois", "--state", b.state}, b.ns},
			{"the admin host", []string{"whois", "--store", f.adminURL}, f.tp.INET},
		} {
			args := append(w.args, "--json", "--at", whoisAt.UTC().Format(time.RFC3339Nano), ap.String())
			code, out, stderr := f.tp.Run(t, 30*time.Second, w.ns, f.gwUser, f.airlock, args...)
			var recs []store.LeaseRecord
			if code != 0 || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 1 || recs[0].JobID != "fleet-whois" || recs[0].Gateway != c.addr {
				t.Errorf("whois %v from %s: exit %d %s %s; want job fleet-whois on gateway %s", ap, w.where, code, out, stderr, c.addr)
			}
		}
	})

	t.Run("CaptureAcrossTheFleet", func(t *testing.T) {
		// A job on A makes a request every half second; airlock capture
		// asked on B, and on the admin host, is relayed from A. Each asks
		// for 100 bytes of /small (a range): the whole 1 MiB is hundreds
		// of packets, and a capture of 20 that began in the middle of
		// one held no request.
		dir := topology.TempDir(t)
		if err := os.Chown(dir, f.gwUser.UID, f.gwUser.GID); err != nil {
			t.Fatal(err)
		}
		url := fmt.Sprintf("http://%s:%d/small", f.tp.INETAddr, f.httpPort)
		job := f.startWith(t, on(a, "AIRLOCK_JOB_ID=fleet-capture"), "sh", "-c",
			"ip -o -4 addr show dev tun0; for i in $(seq 60); do curl -sS --max-time 5 -r 0-99 -o /dev/null "+url+"; sleep 0.5; done")
		defer job.Kill()
		waitStderr(t, job, "transport: ", 30*time.Second)
		// The job's first line may follow the transport's log line.
		var src netip.Addr
		if !topology.Poll(10*time.Second, func() bool {
			var ok bool
			src, ok = tunAddr(job.Stdout())
			return ok
		}) {
			t.Fatalf("job's tunnel address not in its output: %s", job.Describe())
		}
		filter := []string{"tcp", "port", strconv.Itoa(f.httpPort)}
		// capture runs airlock capture -c 20 in ns and checks the file
		// holds the job's requests.
		capture := func(where, ns string, args ...string) {
			t.Helper()
			file := filepath.Join(dir, strings.ReplaceAll(where, " ", "-")+".pcap")
			args = append(append([]string{"capture"}, args...), append([]string{"-c", "20", "-w", file, "fleet-capture"}, filter...)...)
			var code int
			var stderr string
			// Until A's shipper has written the lease.
			topology.PollEvery(10*time.Second, 200*time.Millisecond, func() bool {
				code, _, stderr = f.tp.Run(t, 30*time.Second, ns, f.gwUser, f.airlock, args...)
				return code == 0 || !strings.Contains(stderr, "no live lease")
			})
			if code != 0 || !strings.Contains(stderr, "20 packets captured") {
				t.Fatalf("airlock %s (%s) of a job on A: exit %d: %s", strings.Join(args, " "), where, code, stderr)
			}
			code, out, tsErr := f.tp.Run(t, 60*time.Second, f.tp.DMZ, nil, "tshark", "-r", file, "-n", "-d", fmt.Sprintf("tcp.port==%d,http", f.httpPort),
				"-Y", "http.request", "-T", "fields", "-e", "ip.src", "-e", "http.request.uri")
			if code != 0 || !strings.Contains(out, src.String()+"\t/small") {
				t.Errorf("capture %s: tshark -r: exit %d %q %s; want GET /small from the job's %s", where, code, out, tsErr, src)
			}
			t.Logf("capture of a job on A %s: %s", where, strings.TrimSpace(stderr))
		}
		// Asked on gateway B: a capture ticket is a wiretap of any job,
		// which a gateway's database role may not write: the refusal
		// says where to run it.
		code, _, stderr := f.tp.Run(t, 30*time.Second, b.ns, f.gwUser, f.airlock, append([]string{"capture", "--state", b.state, "-c", "5", "-w",
			filepath.Join(dir, "on-b.pcap"), "fleet-capture"}, filter...)...)
		if code == 0 || !strings.Contains(stderr, "admin host") || !strings.Contains(stderr, "airlock_fleet_admin") {
			t.Errorf("capture on gateway B of a job on A: exit %d %q; want a refusal naming the admin host and airlock_fleet_admin", code, stderr)
		}
		// An admin host that reaches only the database: the honest
		// error, no file.
		file := filepath.Join(dir, "unreachable.pcap")
		code, _, stderr = f.adminHost(t, append([]string{"capture", "--store", f.adminURL, "-c", "5", "-w", file, "fleet-capture"}, filter...)...)
		if code == 0 || !strings.Contains(stderr, "cannot reach the gateway") || !strings.Contains(stderr, a.addr) || !strings.Contains(stderr, "--state") {
			t.Errorf("capture --store from a host that reaches only the database: exit %d %q; want a refusal naming gateway %s and --state", code, stderr, a.addr)
		}
		if _, err := os.Stat(file); err == nil {
			t.Errorf("a refused capture left %s", file)
		}
		f.adminHostReachesGateways(t)
		capture("from the admin host", f.tp.INET, "--store", f.adminURL)
	})

	t.Run("DatabaseDown60s", func(t *testing.T) {
		// A job on A makes a request every second across the outage.
		loop := f.startWith(t, on(a), f.requestLoop(70)...)
		waitStderr(t, loop, "transport: ", 30*time.Second)
		// A change just before the outage: every gateway's copy of the
		// tokens and bans is fresh when it starts (C, fail-closed, then
		// admits for fleetStale).
		if code, out, stderr := f.adminHost(t, "token", "create", "--store", f.adminURL, "--name", "outage"); code != 0 {
			t.Fatalf("token create --store: exit %d %s %s", code, out, stderr)
		}
		time.Sleep(500 * time.Millisecond)
		f.pg.Stop(t)
		down := time.Now()
		// Joins go on, with the cached token, on every gateway (C's
		// first, while its copy is younger than fleetStale); each job's
		// lease starts and ends while the database is down.
		joined := map[string]bool{}
		leaseRE := regexp.MustCompile(`msg="job joined" lease=(\S+)`)
		before := map[*fleetGW]int{}
		for _, g := range f.gws {
			before[g] = len(leaseRE.FindAllStringSubmatch(g.proc.Stderr(), -1))
		}
		for i := 0; i < 6; i++ {
			g := f.gws[2-i%3]
			if code, _, stderr := f.runWith(t, on(g), "true"); code != 0 {
				t.Errorf("join on %s while the database is down: exit %d%s", g.name, code, f.diag(stderr))
			}
		}
		// A job on B, then B is killed (-9) while the database is down:
		// the records it acknowledged are in its journal only.
		hold := f.startWith(t, on(b), "sleep", "120")
		defer hold.Kill()
		waitStderr(t, hold, "transport: ", 30*time.Second)
		for _, g := range f.gws {
			for _, m := range leaseRE.FindAllStringSubmatch(g.proc.Stderr(), -1)[before[g]:] {
				joined[m[1]] = true
			}
		}
		if err := b.proc.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		b.proc.Wait(10 * time.Second)
		f.startFleetGW(t, b)
		if len(joined) != 7 {
			t.Fatalf("gateways logged %d joins during the outage, want 7", len(joined))
		}
		// C is fail-closed: once its copy is older than fleetStale it
		// refuses joins, with the reason, while A (and B) go on.
		time.Sleep(time.Until(down.Add(fleetStale + 5*time.Second)))
		// The refusal clears with time (Retry-After): airlock run would
		// wait it out for --join-timeout, here 2 s.
		oc := on(c)
		oc.flags = append(oc.flags, "--join-timeout", "2s")
		code, _, stderr := f.runWith(t, oc, "true")
		if code == 0 || !strings.Contains(stderr, "fail-closed") || !strings.Contains(stderr, "store_unavailable") {
			t.Errorf("join on fail-closed C %v into the outage: exit %d, want refused as fail-closed (store_unavailable)%s", time.Since(down).Round(time.Second), code, f.diag(stderr))
		}
		if code, _, stderr := f.runWith(t, on(a), "true"); code != 0 {
			t.Errorf("join on fail-open A %v into the outage: exit %d%s", time.Since(down).Round(time.Second), code, f.diag(stderr))
		}
		time.Sleep(time.Until(down.Add(60 * time.Second)))
		f.pg.Restart(t)
		up := time.Now()
		t.Logf("database down for %v", time.Since(down).Round(time.Second))
		// C admits again at its first reload once the database is back.
		if !topology.PollEvery(20*time.Second, 500*time.Millisecond, func() bool {
			code, _, stderr = f.runWith(t, on(c), "true")
			return code == 0
		}) {
			t.Fatalf("fail-closed C still refuses joins 20 s after the database is back: exit %d%s", code, f.diag(stderr))
		}
		t.Logf("fail-closed C admits again %v after the database is back", time.Since(up).Round(100*time.Millisecond))
		if _, err := loop.Wait(40 * time.Second); err != nil {
			t.Fatal(err)
		}
		stderr = loop.Stderr()
		var fails, oks int
		for _, r := range parseLoop(t, loop.Stdout()) {
			if r.ok {
				oks++
			} else {
				fails++
			}
		}
		if fails != 0 || oks < 60 {
			t.Errorf("job on A across the outage: %d requests ok, %d failed; want none failed%s", oks, fails, f.diag(stderr))
		}
		// Every lease of the outage is in the database, with its end
		// (the six short jobs) or live (the one on B).
		var missing []string
		if !topology.PollEvery(15*time.Second, 200*time.Millisecond, func() bool {
			missing = f.missingLeases(t, joined)
			return len(missing) == 0
		}) {
			t.Fatalf("%d of %d leases of the outage not in the database 15 s after it came back: %v", len(missing), len(joined), missing)
		}
		t.Logf("all %d leases joined during the outage (one on a gateway killed -9 meanwhile) reached the database", len(joined))
	})

	t.Run("StatusFleet", func(t *testing.T) {
		code, out, stderr := f.adminHost(t, "status", "--fleet", "--store", f.adminURL, "--json")
		var st fleet.Status
		if code != 0 || json.Unmarshal([]byte(out), &st) != nil {
			t.Fatalf("status --fleet --json: exit %d %s %s", code, out, stderr)
		}
		alive := 0
		for _, m := range st.Members {
			if m.Alive {
				alive++
			}
		}
		if alive != 3 || st.History.Leases == 0 {
			t.Errorf("status --fleet: %d live members, %d leases in the history; want 3 and some: %s", alive, st.History.Leases, out)
		}
		code, out, stderr = f.tp.Run(t, 30*time.Second, a.ns, f.gwUser, f.airlock, "status", "--fleet", "--state", a.state)
		for _, g := range f.gws {
			if code != 0 || !strings.Contains(out, g.addr) {
				t.Errorf("status --fleet on A: exit %d, lacks gateway %s:\n%s %s", code, g.addr, out, stderr)
			}
		}
	})

	// A host of the attacker's that answers as a gateway and admits the
	// fleet's token (an attacker's own server would admit anything), and
	// a member record for it written with gateway B's database password
	// alone: a huge free capacity and a heartbeat an hour ahead. The
	// gateways sign their records with the fleet key; this one is not
	// signed, so no job is told of it: FailoverSpreads's jobs fail over
	// only to B and C (on a main without enrolment, they learn it from
	// A's leases and many land on it).
	rogue := &fleetGW{name: "rogue", ns: b.ns, state: filepath.Join(filepath.Dir(f.state), "state-rogue"), egress: topology.DMZ2AddrINET}
	rogue.args = []string{"gateway", "--state", rogue.state, "--listen", netip.AddrPortFrom(topology.DMZ2AddrCN, gatewayPort+1).String(),
		"--subnet", "100.67.0.0/16", "--egress-addr", topology.DMZ2AddrINET.String(), "--egress-ports", "20000-59999", "--block-size", "16"}
	f.startFleetGW(t, rogue)
	if code, out, stderr := f.tp.Run(t, 30*time.Second, rogue.ns, f.gwUser, "sh", "-c",
		"printf %s \"$1\" | "+f.airlock+" token create --import --name fleet --state "+rogue.state, "sh", tok); code != 0 {
		t.Fatalf("token import on the rogue gateway: exit %d %s %s", code, out, stderr)
	}
	conn := f.pg.Connect(t, f.db)
	if _, err := conn.Exec(t.Context(), "set role gw_b"); err != nil {
		t.Fatal(err)
	}
	planted := fmt.Sprintf(`{"id":"planted","advertise":%q,"pin":%q,"capacity":1000000,"jobs":0}`, rogue.addr, rogue.pin)
	if _, err := conn.Exec(t.Context(), "insert into airlock_gateways (id, heartbeat, record) values ('planted', now() + interval '1 hour', $1)", planted); err != nil {
		t.Fatalf("plant a member record with gateway B's role: %v", err)
	}
	// A reads it at its next heartbeat, and says it does not follow it.
	waitStderr(t, a.proc, "not enrolled by the fleet key", 10*time.Second)

	t.Run("FailoverSpreads", func(t *testing.T) {
		// All 300 jobs on A (B and C drain while they join), then A is
		// killed: the jobs land on B and C in proportion to their free
		// capacity (equal here: 312 blocks each, both empty).
		for _, g := range []*fleetGW{b, c} {
			if code, out, stderr := f.tp.Run(t, 10*time.Second, g.ns, f.gwUser, f.airlock, "gateway", "drain", "--state", g.state); code != 0 {
				t.Fatalf("drain %s: exit %d %s %s", g.name, code, out, stderr)
			}
		}
		const n = 300
		gen := f.tp.Start(t, f.tp.CN, nil, f.peer, "jobs", "-gateway", a.addr+","+b.addr+","+c.addr, "-pin", a.pin+","+b.pin+","+c.pin,
			"-token", tok, "-n", strconv.Itoa(n), "-over", "10s", "-hold", "5m", "-failover-after", "2s", "-timeout", "20s")
		first := waitReport(t, gen, "start", 120*time.Second)
		if first.OK != n || first.Gateways[a.addr] != n {
			t.Fatalf("%d of %d jobs started (%v), spread %v; want all on A%s", first.OK, n, first.Errors, first.Gateways, f.diag(""))
		}
		for _, g := range []*fleetGW{b, c} {
			if code, out, stderr := f.tp.Run(t, 10*time.Second, g.ns, f.gwUser, f.airlock, "gateway", "drain", "--undo", "--state", g.state); code != 0 {
				t.Fatalf("undrain %s: exit %d %s %s", g.name, code, out, stderr)
			}
		}
		time.Sleep(time.Second) // the next health reports say so
		if err := a.proc.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		var s loadgen.Report
		topology.PollEvery(90*time.Second, 2*time.Second, func() bool {
			s = snapshotReport(t, gen)
			return s.Gateways[b.addr]+s.Gateways[c.addr] == n
		})
		nb, nc := s.Gateways[b.addr], s.Gateways[c.addr]
		t.Logf("300 jobs of A after its kill -9: %d on B, %d on C after %v (%d failovers)", nb, nc, time.Since(killed).Round(time.Second), s.Failovers)
		if n := s.Gateways[rogue.addr]; n > 0 || strings.Contains(rogue.proc.Stderr(), "job joined") {
			t.Errorf("%d jobs failed over to the planted member %s, which the site never enrolled", n, rogue.addr)
		}
		if nb+nc != n {
			t.Fatalf("after 90 s: %d on B, %d on C, want all %d moved (errors %v)", nb, nc, n, s.Errors)
		}
		for _, x := range []int{nb, nc} {
			if x < n/2*8/10 || x > n/2*12/10 {
				t.Errorf("spread %d/%d, want each within ±20%% of %d (equal free capacity)", nb, nc, n/2)
			}
		}
		gen.Signal(syscall.SIGTERM)
		waitReport(t, gen, "end", 60*time.Second)
	})

	t.Run("WhoisOfAGatewayThatIsGone", func(t *testing.T) {
		// C is stopped and its state directory deleted, as when its host
		// is reinstalled: whois still answers for its address.
		c.proc.Signal(syscall.SIGTERM)
		c.proc.Wait(30 * time.Second)
		if err := os.RemoveAll(c.state); err != nil {
			t.Fatal(err)
		}
		code, out, stderr := f.tp.Run(t, 30*time.Second, b.ns, f.gwUser, f.airlock, "whois", "--state", b.state, "--json", "--at", whoisAt.UTC().Format(time.RFC3339Nano), whoisAP.String())
		var recs []store.LeaseRecord
		if code != 0 || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 1 || recs[0].JobID != "fleet-whois" {
			t.Errorf("whois %v of removed gateway C from B: exit %d %s %s", whoisAP, code, out, stderr)
		}
	})
}

// missingLeases returns the lease ids of ids that the database lacks.
func (f *fleetEnv) missingLeases(t *testing.T, ids map[string]bool) []string {
	t.Helper()
	var list []string
	for id := range ids {
		list = append(list, "'"+id+"'")
	}
	q := fmt.Sprintf("select id from airlock_leases where id in (%s)", strings.Join(list, ","))
	conn := f.pg.Connect(t, f.db)
	rows, err := conn.Query(t.Context(), q)
	if err != nil {
		return []string{err.Error()}
	}
	have := map[string]bool{}
	for rows.Next() {
		var id string
		if rows.Scan(&id) == nil {
			have[id] = true
		}
	}
	rows.Close()
	var missing []string
	for id := range ids {
		if !have[id] {
			missing = append(missing, id)
		}
	}
	return missing
}

// snapshotReport asks the load generator for a snapshot (SIGUSR2) and
// returns it.
func snapshotReport(t *testing.T, gen *topology.Process) loadgen.Report {
	t.Helper()
	count := func() (int, loadgen.Report) {
		n, last := 0, loadgen.Report{}
		for _, l := range strings.Split(gen.Stdout(), "\n") {
			var r loadgen.Report
			if json.Unmarshal([]byte(l), &r) == nil && r.Phase == "snapshot" {
				n, last = n+1, r
			}
		}
		return n, last
	}
	before, _ := count()
	if err := gen.Signal(syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	var r loadgen.Report
	got := false
	if !topology.Poll(30*time.Second, func() bool {
		var n int
		n, r = count()
		got = n > before
		ok, _ := gen.Exited()
		return got || ok
	}) || !got {
		t.Fatalf("load generator: no snapshot: %s", gen.Describe())
	}
	return r
}
