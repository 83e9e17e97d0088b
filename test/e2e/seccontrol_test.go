// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/topology"
)

// secTTL is the lease TTL of TestSecurityControl's first gateway run: the
// neighbour floods bad joins for three of them.
const secTTL = 3 * time.Second

// TestSecurityControl checks the control plane against a hostile
// neighbour and a hostile job on the compute node, on one user-mode
// gateway (the control plane is the same in every egress mode):
//   - NeighbourFlood: a job keeps its lease and its traffic while another
//     process on cn floods bad-token joins for 3 × the lease TTL (the
//     flood's source address is rate-limited, the job's renewals are not);
//   - BadJobFields: a join whose batch job id holds a terminal escape is
//     refused with 400 naming the field;
//   - KeyHijack: a join with a running job's WireGuard public key and a
//     valid token, but no proof of the job's lease, is refused (409) and
//     the job's traffic flows on;
//
// then, on the gateway restarted with a 30 s renew interval:
//   - TokenQuota: a token with max_leases = 3 gets a refusal naming the
//     quota on its 4th job while another token's job joins;
//   - KickAmbiguousBan: a kick of a batch job id two jobs claim is refused
//     with both listed; a kick by lease id with --ban reaches the job's
//     stderr within ~1 s (not at its renewal, 30 s away), and a job of
//     the same token from cn is refused, naming the time left;
//   - RevokeEnds: airlock token revoke ends a running job's lease, and its
//     airlock run says so at once.
func TestSecurityControl(t *testing.T) {
	var conf string
	e := newEnvHook(t, modeUser, nil, func(e *env) []string {
		conf = filepath.Join(topology.TempDir(t), "gateway.toml")
		doc := "version = 1\n[quota.token.q3]\nmax_leases = 3\n"
		if err := os.WriteFile(conf, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return []string{"--config", conf, "--renew-interval", (secTTL / 3).String(), "--lease-ttl", secTTL.String()}
	})
	top := t
	gw := netip.AddrPortFrom(e.tp.DMZAddrCN, gatewayPort)
	// postJoin sends one join from cn (not through airlock run) and
	// returns the HTTP status and body.
	postJoin := func(t *testing.T, body string) (int, string) {
		t.Helper()
		code, out, stderr := e.tp.Run(t, 10*time.Second, e.tp.CN, e.u, "curl", "-sk", "--max-time", "5",
			"-H", "Content-Type: application/json", "--data-binary", body, "-w", "\n%{http_code}", "https://"+gw.String()+"/v1/join")
		if code != 0 {
			t.Fatalf("curl join: exit %d: %s", code, stderr)
		}
		i := strings.LastIndex(out, "\n")
		status, _ := strconv.Atoi(strings.TrimSpace(out[i+1:]))
		return status, out[:i]
	}
	checkLoop := func(t *testing.T, what string, p *topology.Process, n int) {
		t.Helper()
		if code, err := p.Wait(60 * time.Second); err != nil || code != 0 {
			t.Fatalf("%s: exit %d (%v)%s", what, code, err, e.diag(p.Stderr()))
		}
		rs := parseLoop(t, p.Stdout())
		fails := 0
		for _, r := range rs {
			if !r.ok {
				fails++
			}
		}
		if len(rs) != n || fails > 0 {
			t.Errorf("%s: %d of %d requests failed, want all %d ok:\n%s%s", what, fails, len(rs), n, p.Stdout(), e.diag(p.Stderr()))
		}
		if strings.Contains(p.Stderr(), "joined again") || strings.Contains(p.Stderr(), "lost the gateway") {
			t.Errorf("%s: the job lost its lease or gateway%s", what, e.diag(p.Stderr()))
		}
	}

	t.Run("NeighbourFlood", func(t *testing.T) {
		flood := 3 * secTTL
		n := int((flood+secTTL)/time.Second) + 1
		job := e.startWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=flooded"}}, e.requestLoop(n)...)
		time.Sleep(1500 * time.Millisecond)
		script := fmt.Sprintf(`end=$(( $(date +%%s) + %d ))
while [ $(date +%%s) -lt $end ]; do
  curl -sk -o /dev/null -w '%%{http_code}\n' --max-time 2 -H 'Content-Type: application/json' \
    --data-binary '{"token":"alk1_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","public_key":"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="}' https://%s/v1/join
done`, int(flood/time.Second), gw)
		code, out, stderr := e.tp.Run(t, flood+20*time.Second, e.tp.CN, e.u, "bash", "-c", script)
		if code != 0 {
			t.Fatalf("flood: exit %d: %s", code, stderr)
		}
		limited := strings.Count(out, "429")
		t.Logf("flood: %d bad joins in %v, %d answered 429", strings.Count(out, "\n"), flood, limited)
		if limited == 0 {
			t.Fatalf("the flood was never rate-limited: %q", out)
		}
		checkLoop(t, "job during the flood", job, n)
	})

	t.Run("BadJobFields", func(t *testing.T) {
		status, body := postJoin(t, `{"token":"`+e.token+`","public_key":"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=","job":{"batch_job_id":"42\u001b[2J"}}`)
		if status != 400 || !strings.Contains(body, "job.batch_job_id") {
			t.Errorf("join with a terminal escape in the batch job id: %d %s, want 400 naming job.batch_job_id", status, body)
		}
	})

	t.Run("KeyHijack", func(t *testing.T) {
		const n = 5
		job := e.startWith(t, runOpts{env: []string{"AIRLOCK_JOB_ID=victim"}}, e.requestLoop(n)...)
		var key string
		deadline := time.Now().Add(10 * time.Second)
		for key == "" && time.Now().Before(deadline) {
			time.Sleep(300 * time.Millisecond)
			for _, j := range e.status(t).Jobs {
				if j.JobID != "victim" || j.Ports == "" {
					continue
				}
				lo, _, _ := strings.Cut(j.Ports, "-")
				// The job's public key, as a neighbour might learn it.
				code, out, stderr := e.admin(t, "whois", "--state", e.state, "--json", e.tp.DMZAddrINET.String()+":"+lo)
				var recs []store.LeaseRecord
				if code != 0 || json.Unmarshal([]byte(out), &recs) != nil || len(recs) == 0 || recs[0].Resume == nil {
					t.Fatalf("whois of the victim's block: exit %d %q %s", code, out, stderr)
				}
				key = recs[0].Resume.PublicKey
			}
		}
		if key == "" {
			t.Fatalf("victim job not in status within 10 s%s", e.diag(job.Stderr()))
		}
		status, body := postJoin(t, `{"token":"`+e.token+`","public_key":"`+key+`","job":{"batch_job_id":"thief"}}`)
		if status != 409 || !strings.Contains(body, "key_in_use") {
			t.Errorf("join with the victim's public key: %d %s, want 409 key_in_use", status, body)
		}
		checkLoop(t, "victim job", job, n)
	})

	// The rest runs with a renew interval far beyond what the tests wait.
	if err := e.gw.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := e.gw.Wait(15 * time.Second); err != nil {
		t.Fatalf("gateway did not stop: %v", err)
	}
	for i, a := range e.gwArgs {
		switch a {
		case "--renew-interval":
			e.gwArgs[i+1] = "30s"
		case "--lease-ttl":
			e.gwArgs[i+1] = "90s"
		}
	}
	e.startGateway(top)

	// sleeper starts a job of token tok that waits to be ended.
	sleeper := func(t *testing.T, tok, jobID string) *topology.Process {
		t.Helper()
		p := e.startWith(t, runOpts{token: tok, env: []string{"AIRLOCK_JOB_ID=" + jobID}}, "sleep", "60")
		t.Cleanup(func() { p.Signal(syscall.SIGTERM); p.Wait(20 * time.Second) })
		return p
	}
	waitJobs := func(t *testing.T, token string, n int) {
		t.Helper()
		got := 0
		if !topology.PollEvery(15*time.Second, 200*time.Millisecond, func() bool {
			got = 0
			for _, j := range e.status(t).Jobs {
				if j.Token == token {
					got++
				}
			}
			return got == n
		}) {
			t.Fatalf("%d jobs of token %s in status after 15 s, want %d%s", got, token, n, e.diag(""))
		}
	}
	// waitStderr waits up to d for want on p's stderr.
	waitStderr := func(t *testing.T, p *topology.Process, want string, d time.Duration) {
		t.Helper()
		if !topology.Poll(d, func() bool { return strings.Contains(p.Stderr(), want) }) {
			t.Fatalf("no %q on the job's stderr within %v%s", want, d, e.diag(p.Stderr()))
		}
	}

	t.Run("TokenQuota", func(t *testing.T) {
		q3 := e.createToken(t, "q3")
		for i := 0; i < 3; i++ {
			sleeper(t, q3, fmt.Sprintf("q3-%d", i))
		}
		waitJobs(t, "q3", 3)
		// A quota of jobs at once clears when one ends: the 4th job
		// waits for it (here at most 3 s), saying so, then gives up.
		code, _, stderr := e.runWith(t, runOpts{token: q3, flags: []string{"--join-timeout", "3s"}}, "true")
		if code != 125 || !strings.Contains(stderr, "max_leases = 3") || !strings.Contains(stderr, "quota.token.q3.max_leases") ||
			!strings.Contains(stderr, "waiting for it") {
			t.Errorf("4th job of token q3: exit %d, stderr %q; want 125 and a refusal naming the quota and what to do, after waiting", code, stderr)
		} else {
			t.Logf("4th job of token q3 refused: %s", strings.TrimSpace(stderr))
		}
		if code, _, stderr := e.runWith(t, runOpts{}, "true"); code != 0 {
			t.Errorf("job of another token while q3 is at its quota: exit %d%s", code, e.diag(stderr))
		}
	})

	t.Run("KickAmbiguousBan", func(t *testing.T) {
		ban := e.createToken(t, "banme")
		a := sleeper(t, ban, "dup")
		waitJobs(t, "banme", 1)
		var lease string
		for _, j := range e.status(t).Jobs {
			if j.Token == "banme" {
				lease = string(j.Lease)
			}
		}
		sleeper(t, ban, "dup")
		waitJobs(t, "banme", 2)
		code, _, stderr := e.admin(t, "kick", "--state", e.state, "dup")
		if code == 0 || !strings.Contains(stderr, `2 live leases claim batch job id "dup"`) || !strings.Contains(stderr, lease) {
			t.Fatalf("kick of a batch job id two jobs claim: exit %d, %q; want a refusal listing both", code, stderr)
		}
		if n := e.jobsOf(t, "banme"); n != 2 {
			t.Fatalf("%d jobs of token banme after the refused kick, want 2", n)
		}
		// Let the job's watch open (right after the join).
		time.Sleep(500 * time.Millisecond)
		t0 := time.Now()
		code, out, stderr := e.admin(t, "kick", "--state", e.state, "--reason", "e2e ban", "--ban", "1h", lease)
		if code != 0 || !strings.Contains(out, `joins of token "banme" from host name`) || !strings.Contains(out, "or from network "+e.tp.CNAddr.String()+"/32") {
			t.Fatalf("kick --ban: exit %d, %q %s", code, out, stderr)
		}
		waitStderr(t, a, "THE GATEWAY ENDED THIS JOB'S LEASE", 5*time.Second)
		took := time.Since(t0)
		t.Logf("kicked job told after %v (renew interval 30 s)", took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Errorf("kicked job told after %v, want about 1 s", took)
		}
		if !strings.Contains(a.Stderr(), "e2e ban") {
			t.Errorf("the kicked job's stderr does not give the reason: %q", a.Stderr())
		}
		code, _, stderr = e.runWith(t, runOpts{token: ban}, "true")
		if code != 125 || !strings.Contains(stderr, "banned") || !strings.Contains(stderr, "from now") || !strings.Contains(stderr, "e2e ban") {
			t.Errorf("job of the banned token from cn: exit %d, %q; want 125 and a refusal with the time left", code, stderr)
		} else {
			t.Logf("banned re-join refused: %s", strings.TrimSpace(stderr))
		}
	})

	t.Run("RevokeEnds", func(t *testing.T) {
		tok := e.createToken(t, "revokeme")
		p := sleeper(t, tok, "revoked-job")
		waitJobs(t, "revokeme", 1)
		// Let the job's watch open (right after the join).
		time.Sleep(500 * time.Millisecond)
		t0 := time.Now()
		code, out, stderr := e.admin(t, "token", "revoke", "--state", e.state, "revokeme")
		if code != 0 || !strings.Contains(out, "ended lease") {
			t.Fatalf("token revoke: exit %d, %q %s", code, out, stderr)
		}
		waitStderr(t, p, "THE GATEWAY ENDED THIS JOB'S LEASE", 5*time.Second)
		took := time.Since(t0)
		if !strings.Contains(p.Stderr(), "token revokeme revoked") {
			t.Errorf("the job's stderr does not say why: %q", p.Stderr())
		}
		t.Logf("revoked job told after %v (renew interval 30 s)", took.Round(time.Millisecond))
		if took > 2*time.Second {
			t.Errorf("revoked job told after %v, want about 1 s", took)
		}
	})
}

// jobsOf returns the number of live jobs of token in status.
func (e *env) jobsOf(t *testing.T, token string) int {
	t.Helper()
	n := 0
	for _, j := range e.status(t).Jobs {
		if j.Token == token {
			n++
		}
	}
	return n
}
