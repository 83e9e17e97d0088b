// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/attest"
	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/munge"
	"github.com/airlock-vpn/airlock/internal/munge/mungetest"
	"github.com/airlock-vpn/airlock/internal/store"
)

// TestAttestedGateway runs a gateway with --attest munge against a real
// munged (the node's and the gateway's, one key): a job joins with a
// credential and no token; the lease, status, whois and flow table say
// what was attested; a join that claims another uid or replays a
// credential is refused; a job credential attests the batch job id, and a
// rejoin that proves the lease keeps it.
func TestAttestedGateway(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	me := uint32(os.Getuid())
	reg := prometheus.NewRegistry()
	g := startGatewayWith(t, func(c *Config) {
		c.Attest = config.Attest{Mode: config.AttestMunge, Socket: d.Socket, JobUIDs: []uint32{me}}
		c.Registry = reg
	})
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	mc := munge.Client{Socket: d.Socket}
	h, err := cc.Health(ctx)
	if err != nil || h.Attest != "munge" {
		t.Errorf("health %+v %v, want attest munge", h, err)
	}
	joinReq := func(t *testing.T, jobCred string) control.JoinRequest {
		t.Helper()
		key := freshKey(t)
		cred, err := attest.MakeJoin(ctx, mc, g.info.Fingerprint, key, jobCred)
		if err != nil {
			t.Fatal(err)
		}
		return control.JoinRequest{PublicKey: key, Job: control.JobInfo{UID: int(me), Hostname: "claimed-host"},
			Attest: &control.Attest{Munge: cred, MungeJob: jobCred}}
	}

	req := joinReq(t, "")
	l, err := cc.Join(ctx, req)
	if err != nil {
		t.Fatalf("attested join without a token: %v", err)
	}
	ac := adminClient(t, g)
	st, err := ac.Status(ctx)
	if err != nil || len(st.Jobs) != 1 {
		t.Fatalf("status: %+v %v", st, err)
	}
	j := st.Jobs[0]
	if j.Attested == nil || j.Attested.UID != me || j.Attested.Node.String() != "127.0.0.1" || j.Host != "claimed-host" ||
		j.Ref.AttestedBy != "munge" || j.Ref.AttestedUID == nil || *j.Ref.AttestedUID != me {
		t.Errorf("status job %+v, want uid %d attested by munge on 127.0.0.1 next to the claimed host", j, me)
	}
	if n := identityGauge(t, reg, "munge", "claimed"); n != 1 {
		t.Errorf("airlock_jobs_identity{uid_source=munge,job_id_source=claimed} = %v, want 1", n)
	}
	recs, err := admin.Whois(ctx, g.state, netip.AddrPortFrom(j.PublicAddr, portOf(t, j.Ports)), time.Now())
	if err != nil || len(recs) != 1 || recs[0].Attested == nil || recs[0].Attested.UID != me || recs[0].ID != l.ID {
		t.Errorf("whois: %+v %v, want the attested record", recs, err)
	}

	// Replayed: the same request again (the same credential).
	if _, err := cc.Join(ctx, req); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "used before") {
		t.Errorf("replayed credential: %v, want attestation_failed saying it was used before", err)
	}
	// Claims another uid.
	other := joinReq(t, "")
	other.Job.UID = int(me) + 1
	if _, err := cc.Join(ctx, other); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "claims uid") {
		t.Errorf("join claiming another uid: %v, want attestation_failed", err)
	}

	// A job credential: the batch job id is attested; a rejoin with proof
	// of the lease keeps it without a job credential of its own.
	jc, err := attest.MakeJob(ctx, mc, attest.JobPayload{Batch: "slurm", JobID: "4242", Step: "0", UID: me, GID: uint32(os.Getgid()), Node: "cn1"}, 300)
	if err != nil {
		t.Fatal(err)
	}
	jr := joinReq(t, jc)
	jr.Job.BatchJobID, jr.Job.BatchSystem = "4242", "slurm"
	jl, err := cc.Join(ctx, jr)
	if err != nil {
		t.Fatalf("join with a job credential: %v", err)
	}
	cred, err := attest.MakeJoin(ctx, mc, g.info.Fingerprint, jr.PublicKey, "")
	if err != nil {
		t.Fatal(err)
	}
	rejoin := control.JoinRequest{PublicKey: jr.PublicKey, Job: jr.Job, Attest: &control.Attest{Munge: cred},
		Replace: &control.LeaseRef{ID: jl.ID, Secret: jl.Secret}}
	rl, err := cc.Join(ctx, rejoin)
	if err != nil {
		t.Fatalf("rejoin with proof: %v", err)
	}
	st, _ = ac.Status(ctx)
	for _, j := range st.Jobs {
		if string(j.Lease) != rl.ID {
			continue
		}
		if a := j.Attested; a == nil || a.Job == nil || a.Job.JobID != "4242" || !a.Job.Inherited || !j.Ref.JobAttested || j.JobID != "4242" {
			t.Errorf("rejoined job %+v (attested %+v), want job 4242 attested, inherited from the replaced lease", j, j.Attested)
		}
	}
	// kick by the attested batch id finds it.
	res, err := ac.Kick(ctx, admin.KickRequest{Job: "4242"})
	if err != nil || len(res.Kicked) != 1 || res.Kicked[0].Lease != rl.ID {
		t.Errorf("kick 4242: %+v %v, want the attested job's lease", res, err)
	}
}

// TestAttestMungeDown: a gateway told to check credentials with a munged
// that is not there does not start, and says which socket and what to do.
func TestAttestMungeDown(t *testing.T) {
	cfg := Config{Attest: config.Attest{Mode: config.AttestMunge, Socket: t.TempDir() + "/nosuch.socket"}}
	g := newGateway(Config{})
	g.log = testLogger()
	err := g.admit.applyAttest(cfg.Attest)
	if err == nil || !strings.Contains(err.Error(), "nosuch.socket") || !strings.Contains(err.Error(), "does not answer") {
		t.Errorf("applyAttest with no munged: %v, want an error naming the socket", err)
	}
}

// identityGauge reads airlock_jobs_identity{uid_source, job_id_source}.
func identityGauge(t *testing.T, reg *prometheus.Registry, uid, job string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "airlock_jobs_identity" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["uid_source"] == uid && l["job_id_source"] == job {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// portOf is the first port of a LO-HI block.
func portOf(t *testing.T, block string) uint16 {
	t.Helper()
	lo, _, _ := strings.Cut(block, "-")
	n, err := strconv.ParseUint(lo, 10, 16)
	if err != nil {
		t.Fatalf("port block %q", block)
	}
	return uint16(n)
}

func testLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestAttestedJobWaits (issue 33, item 1): a job whose join is refused
// for a reason that clears with time (its token's max_leases held by
// another job; a drain) keeps its job credential, made once by root:
// its retry, with the same job credential and a fresh join credential as
// airlock run makes them, is admitted as that job once the reason is
// gone, through a real munged. The job credential then is spent: a copy
// presented again is refused as a replay.
func TestAttestedJobWaits(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	me := uint32(os.Getuid())
	g, cc := secGateway(t, `version = 1
[attest]
mode = "munge"
socket = "`+d.Socket+`"
job_uids = [`+strconv.Itoa(int(me))+`]
[quota.token.one]
max_leases = 1
`)
	tok := namedToken(t, g, "one")
	ctx := context.Background()
	mc := munge.Client{Socket: d.Socket}
	jobCred := func(t *testing.T, id string) string {
		t.Helper()
		jc, err := attest.MakeJob(ctx, mc, attest.JobPayload{Batch: "slurm", JobID: id, Step: "batch", UID: me, GID: uint32(os.Getgid()), Node: "cn1"}, 300)
		if err != nil {
			t.Fatal(err)
		}
		return jc
	}
	// join is one attempt of airlock run: a fresh join credential bound
	// to the job credential jc.
	join := func(t *testing.T, jc, id string) (control.Lease, error) {
		t.Helper()
		key := freshKey(t)
		cred, err := attest.MakeJoin(ctx, mc, g.info.Fingerprint, key, jc)
		if err != nil {
			t.Fatal(err)
		}
		return cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: key,
			Job: control.JobInfo{UID: int(me), BatchJobID: id, BatchSystem: "slurm"}, Attest: &control.Attest{Munge: cred, MungeJob: jc}})
	}
	holder, err := join(t, jobCred(t, "1"), "1")
	if err != nil {
		t.Fatalf("first job: %v", err)
	}
	jc2 := jobCred(t, "2")
	for i := 0; i < 2; i++ {
		if _, err := join(t, jc2, "2"); !errors.Is(err, control.ErrQuota) {
			t.Fatalf("second job, attempt %d, while the first holds max_leases = 1: %v, want ErrQuota", i+1, err)
		}
	}
	if err := cc.Release(ctx, control.LeaseRef{ID: holder.ID, Secret: holder.Secret}); err != nil {
		t.Fatal(err)
	}
	l2, err := join(t, jc2, "2")
	if err != nil {
		t.Fatalf("second job after the first left: %v, want admitted with its job credential", err)
	}
	ac := adminClient(t, g)
	st, err := ac.Status(ctx)
	if err != nil || len(st.Jobs) != 1 || st.Jobs[0].Attested == nil || st.Jobs[0].Attested.Job == nil || st.Jobs[0].Attested.Job.JobID != "2" {
		t.Fatalf("status %+v %v, want job 2 attested", st, err)
	}
	// Across a drain: refused while draining, admitted after.
	jc3 := jobCred(t, "3")
	if err := cc.Release(ctx, control.LeaseRef{ID: l2.ID, Secret: l2.Secret}); err != nil {
		t.Fatal(err)
	}
	if _, err := ac.Drain(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := join(t, jc3, "3"); !errors.Is(err, control.ErrDraining) {
		t.Fatalf("join while draining: %v, want ErrDraining", err)
	}
	if _, err := ac.Drain(ctx, false); err != nil {
		t.Fatal(err)
	}
	if _, err := join(t, jc3, "3"); err != nil {
		t.Fatalf("join after the drain ended: %v, want admitted with its job credential", err)
	}
	// Spent now: the same job credential again is a replay.
	if _, err := join(t, jc3, "3"); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "used before") {
		t.Errorf("job credential of a job that joined, again: %v, want attestation_failed (used before)", err)
	}
}

// TestBanSticksToPerson (issue 33, item 2): `kick --ban` of an attested
// job bans the person, through a real munged: the same uid's running job
// of another token ends, and so does the unattested job of the banned
// token from the same node; new joins of that uid with any token or none
// are refused, and so are unattested joins from the node of the banned
// token or claiming the uid; another user's unattested join of another
// token from the node is not.
func TestBanSticksToPerson(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	me := uint32(os.Getuid())
	g, cc := secGateway(t, `version = 1
[attest]
mode = "munge"
socket = "`+d.Socket+`"
`)
	t1, t2, t3 := namedToken(t, g, "t1"), namedToken(t, g, "t2"), namedToken(t, g, "t3")
	ctx := context.Background()
	mc := munge.Client{Socket: d.Socket}
	req := func(t *testing.T, tok string, attested bool) control.JoinRequest {
		t.Helper()
		r := control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: control.JobInfo{UID: int(me), Hostname: "cn1"}}
		if tok == t3 {
			r.Job.UID = int(me) + 1 // another user of the node
		}
		if attested {
			cred, err := attest.MakeJoin(ctx, mc, g.info.Fingerprint, r.PublicKey, "")
			if err != nil {
				t.Fatal(err)
			}
			r.Attest = &control.Attest{Munge: cred}
		}
		return r
	}
	kicked, err := cc.Join(ctx, req(t, t1, true))
	if err != nil {
		t.Fatal(err)
	}
	sameUserOtherToken, err := cc.Join(ctx, req(t, t2, true))
	if err != nil {
		t.Fatal(err)
	}
	sameNodeUnattested, err := cc.Join(ctx, req(t, t1, false))
	if err != nil {
		t.Fatal(err)
	}
	otherToken, err := cc.Join(ctx, req(t, t3, false))
	if err != nil {
		t.Fatal(err)
	}
	ac := adminClient(t, g)
	res, err := ac.Kick(ctx, admin.KickRequest{Job: kicked.ID, Reason: "abuse", Ban: "1h"})
	if err != nil || !strings.Contains(res.BanCovers, "with any token or none") {
		t.Fatalf("kick --ban: %+v %v, want a ban that says it covers the uid with any token", res, err)
	}
	for _, tc := range []struct {
		name string
		l    control.Lease
		live bool
	}{{"the same uid's job of another token", sameUserOtherToken, false}, {"the unattested job of the token from the node", sameNodeUnattested, false}, {"another token's unattested job", otherToken, true}} {
		_, err := cc.Renew(ctx, control.LeaseRef{ID: tc.l.ID, Secret: tc.l.Secret})
		if live := err == nil; live != tc.live {
			t.Errorf("%s after the ban: renew %v, want live %v", tc.name, err, tc.live)
		}
	}
	for _, tc := range []struct {
		name     string
		tok      string
		attested bool
		banned   bool
	}{
		{"the uid, the same token", t1, true, true},
		{"the uid, another token", t2, true, true},
		{"the uid, no token", "", true, true},
		{"unattested, the banned token, from the node", t1, false, true},
		{"unattested, another token", t3, false, false},
	} {
		_, err := cc.Join(ctx, req(t, tc.tok, tc.attested))
		if got := errors.Is(err, control.ErrBanned); got != tc.banned {
			t.Errorf("join %s: %v, want banned %v", tc.name, err, tc.banned)
		}
	}
}

// TestQuotaPerUser (issue 33, item 3): token-less attested joins are
// metered per attested uid ([quota.user]): one user who holds their
// max_leases does not stop another user's job, and the refusal names the
// uid and the config key.
func TestQuotaPerUser(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to make a credential as another user")
	}
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	g, cc := secGateway(t, `version = 1
[attest]
mode = "munge"
socket = "`+d.Socket+`"
[quota.user]
max_leases = 1
`)
	ctx := context.Background()
	join := func(t *testing.T, uid int) error {
		t.Helper()
		key := freshKey(t)
		cmd := exec.Command("setpriv", "--reuid="+strconv.Itoa(uid), "--regid="+strconv.Itoa(uid), "--clear-groups", "--", "munge", "--socket", d.Socket, "--ttl", "60")
		cmd.Stdin = strings.NewReader(string(attest.JoinPayload{Gateway: g.info.Fingerprint, Key: key}.Marshal()))
		out, err := cmd.Output()
		if err != nil {
			t.Fatal(err)
		}
		_, err = cc.Join(ctx, control.JoinRequest{PublicKey: key, Job: control.JobInfo{UID: uid},
			Attest: &control.Attest{Munge: strings.TrimSpace(string(out))}})
		return err
	}
	if err := join(t, 65534); err != nil {
		t.Fatalf("first job of uid 65534: %v", err)
	}
	if err := join(t, 65534); !errors.Is(err, control.ErrQuota) || !strings.Contains(err.Error(), "uid 65534") || !strings.Contains(err.Error(), "quota.user.max_leases") {
		t.Errorf("second job of uid 65534: %v, want ErrQuota naming the uid and quota.user.max_leases", err)
	}
	if err := join(t, 65533); err != nil {
		t.Errorf("another user's job while uid 65534 holds its quota: %v, want admitted", err)
	}
}

// TestMungedDownIs503 (issue 33, item 6): when the gateway's munged stops
// answering, a join with a credential gets a clear 503
// (attestation_unavailable) with a Retry-After, which airlock run waits
// out, and it counts against its source like a failure; no 500.
func TestMungedDownIs503(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	me := uint32(os.Getuid())
	node := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	g, cc := secGateway(t, `version = 1
[attest]
mode = "munge"
socket = "`+d.Socket+`"
`)
	// The gateway's munged goes away: its socket no longer answers.
	if err := os.Remove(d.Socket); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := freshKey(t)
	cred, err := attest.MakeJoin(ctx, munge.Client{Socket: node.Socket}, g.info.Fingerprint, key, "")
	if err != nil {
		t.Fatal(err)
	}
	_, err = cc.Join(ctx, control.JoinRequest{PublicKey: key, Job: control.JobInfo{UID: int(me)}, Attest: &control.Attest{Munge: cred}})
	var ae *control.APIError
	if !errors.As(err, &ae) || ae.Status != 503 || ae.Code != control.CodeAttestationUnavailable || ae.RetryAfter <= 0 {
		t.Fatalf("join while the gateway's munged is down: %v, want 503 attestation_unavailable with a Retry-After", err)
	}
}

// TestTokenlessLeaseAcrossRestart: a job that joined by its MUNGE
// credential alone keeps its lease across a gateway restart, as a token's
// job does (it was closed as "token revoked or expired"); and it is
// re-checked at renewal as a token lease is: a ban of its uid recorded
// while the gateway was down ends it at its first renewal after the
// restart, and so does a reload that turns attested identity off.
func TestTokenlessLeaseAcrossRestart(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	me := uint32(os.Getuid())
	conf := filepath.Join(t.TempDir(), "gateway.toml")
	on := "version = 1\n[attest]\nmode = \"munge\"\nsocket = \"" + d.Socket + "\"\n"
	if err := os.WriteFile(conf, []byte(on), 0o600); err != nil {
		t.Fatal(err)
	}
	start := func(state string) (*testGateway, *control.Client) {
		g := startGatewayWith(t, func(c *Config) {
			c.RenewInterval, c.LeaseTTL, c.ConfigFile = 10*time.Second, 30*time.Second, conf
			if state != "" {
				c.StateDir = state
			}
		})
		cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cc.Close)
		return g, cc
	}
	ctx := context.Background()
	join := func(g *testGateway, cc *control.Client) control.LeaseRef {
		t.Helper()
		r := control.JoinRequest{PublicKey: freshKey(t), Job: control.JobInfo{UID: int(me), Hostname: "cn1"}}
		cred, err := attest.MakeJoin(ctx, munge.Client{Socket: d.Socket}, g.info.Fingerprint, r.PublicKey, "")
		if err != nil {
			t.Fatal(err)
		}
		r.Attest = &control.Attest{Munge: cred}
		l, err := cc.Join(ctx, r)
		if err != nil {
			t.Fatalf("token-less attested join: %v", err)
		}
		return control.LeaseRef{ID: l.ID, Secret: l.Secret}
	}
	g, cc := start("")
	kept, banned := join(g, cc), join(g, cc)
	g.stop()

	// While the gateway is down, the site bans the uid of the second job
	// (as another fleet member's replica would bring it).
	st, err := store.Open(filepath.Join(g.state, store.FileName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	other := me + 1
	if _, err := st.AddBan(store.Ban{UID: &other, Until: time.Now().Add(time.Hour), Reason: "another user"}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	g2, cc2 := start(g.state)
	if _, err := cc2.Renew(ctx, kept); err != nil {
		t.Fatalf("renew of a token-less attested lease after a restart: %v (want it restored)", err)
	}
	g2.stop()
	st, err = store.Open(filepath.Join(g.state, store.FileName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.AddBan(store.Ban{UID: &me, Until: time.Now().Add(time.Hour), Reason: "abuse"}); err != nil {
		t.Fatal(err)
	}
	st.Close()
	_, cc3 := start(g.state)
	if _, err := cc3.Renew(ctx, banned); err == nil || !strings.Contains(err.Error(), "banned") {
		t.Errorf("renew of a token-less lease whose uid was banned meanwhile: %v, want it ended as banned", err)
	}
	if _, err := cc3.Renew(ctx, kept); err == nil {
		t.Error("the banned uid's other token-less lease was renewed")
	}

	// A reload that turns attested identity off ends the token-less
	// leases at their renewal, as a revoked token's.
	g4, cc4 := start("")
	live := join(g4, cc4)
	if err := os.WriteFile(conf, []byte("version = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := adminClient(t, g4).Reload(ctx); err != nil {
		t.Fatalf("reload with attested identity off: %v", err)
	}
	if _, err := cc4.Renew(ctx, live); err == nil || !strings.Contains(err.Error(), "attested identity turned off") {
		t.Errorf("renew of a token-less lease after attested identity was turned off: %v, want it ended saying so", err)
	}
}
