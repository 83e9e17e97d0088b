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

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/bearer/bearertest"
	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/topology"
)

// Identity from the experiment's bearer tokens (issue 37, item 1), end to
// end: a real token issuer in inet (airlock-testpeer issuer: HTTPS with
// its own CA, a discovery document and a key set of real RSA and EC keys
// that the test rotates), a gateway in dmz whose config trusts it, and
// jobs in cn that present their tokens as the WLCG discovery profile
// finds them, with no join token.

// bearerEnv is TestBearerIdentity's world.
type bearerEnv struct {
	e        *env
	url      string // the issuer's
	aud      string // the gateway's advertised name, as tokens carry it
	issuer   *topology.Process
	dir      string // the issuer's served directory
	tls      bearertest.TLS
	tokDir   string // the test user's token files (0700)
	rsa1     *bearertest.Key
	ec1      *bearertest.Key
	rsa2     *bearertest.Key
	httpURL  string
	issuerAt string // ADDR:PORT it listens on
}

func TestBearerIdentity(t *testing.T) {
	be := newBearerEnv(t, nil)
	t.Run("Valid", be.valid)
	t.Run("Refusals", be.refusals)
	t.Run("GroupPolicy", be.groupPolicy)
	t.Run("RefreshDuringJob", be.refresh)
	t.Run("ExpiredNotRefreshed", be.expired)
	t.Run("Rotation", be.rotation)
	t.Run("KickBanSubject", be.kickBan)
	t.Run("IssuerDown", be.issuerDown)
}

// newBearerEnv builds the topology (with topo), starts the token issuer
// in inet and the gateway in dmz trusting it (issuer "exp": scope
// compute.create, group /exp; group /exp/prod accounted as exp-prod and
// denied the HTTP server), and the test user's token directory. The
// gateway renews leases every second; extra are more of its arguments.
func newBearerEnv(t *testing.T, topo []topology.Option, extra ...string) *bearerEnv {
	t.Helper()
	be := &bearerEnv{rsa1: bearertest.NewRSA("rsa1"), ec1: bearertest.NewEC("ec1"), rsa2: bearertest.NewRSA("rsa2")}
	be.e = newEnvHook(t, modeUser, topo, func(e *env) []string {
		port := e.tp.Port()
		be.issuerAt = netip.AddrPortFrom(e.tp.INETAddr, uint16(port)).String()
		be.url = "https://" + be.issuerAt
		be.aud = "https://" + netip.AddrPortFrom(e.tp.DMZAddrCN, gatewayPort).String()
		be.dir = topology.TempDir(t)
		be.tls = bearertest.NewTLS(e.tp.INETAddr.String())
		if err := bearertest.Write(be.dir, be.url, be.tls, be.rsa1, be.ec1); err != nil {
			t.Fatal(err)
		}
		ca := filepath.Join(be.dir, "ca.pem")
		if err := os.WriteFile(ca, be.tls.CAPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		be.startIssuer(t, e)
		be.httpURL = fmt.Sprintf("http://%s:%d/small", e.tp.INETAddr, e.httpPort)
		conf := filepath.Join(be.dir, "gateway.toml")
		doc := fmt.Sprintf(`version = 1
[bearer]
refresh = "2s"
min_refetch = "1s"
leeway = "1s"

[[issuer]]
name = "exp"
url = %q
scopes = ["compute.create"]
groups = ["/exp"]
ca_file = %q
[[issuer.map]]
group = "/exp/prod"
as = "exp-prod"

[[policy.rule]]
name = "prod-no-http"
action = "deny"
proto = "tcp"
ports = [%d]
tokens = ["exp-prod"]
`, be.url, ca, e.httpPort)
		if err := os.WriteFile(conf, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return append([]string{"--config", conf, "--renew-interval", "1s"}, extra...)
	})
	be.tokDir = topology.TempDir(t)
	if err := os.Chmod(be.tokDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(be.tokDir, be.e.u.UID, be.e.u.GID); err != nil {
		t.Fatal(err)
	}
	if log := be.e.gw.Stderr(); !strings.Contains(log, "trusting issuer") {
		t.Fatalf("gateway log does not name the issuer it trusts%s", be.e.diag(""))
	}
	return be
}

func (be *bearerEnv) startIssuer(t *testing.T, e *env) {
	t.Helper()
	be.issuer = e.tp.Start(t, e.tp.INET, nil, e.peer, "issuer", be.dir, be.issuerAt)
	e.tp.WaitTCP(t, e.tp.INET, netip.MustParseAddrPort(be.issuerAt), be.issuer)
}

// claims are a good token's: subject sub, groups, valid for ttl.
func (be *bearerEnv) claims(sub string, ttl time.Duration, groups ...string) map[string]any {
	if groups == nil {
		groups = []string{"/exp"}
	}
	return bearertest.Claims(be.url, sub, be.aud, ttl, "compute.create storage.read:/exp", groups...)
}

// writeToken puts tok into the test user's token file name as a pilot
// does (a new file renamed over the old), and returns its path.
func (be *bearerEnv) writeToken(t *testing.T, name, tok string) string {
	t.Helper()
	p := filepath.Join(be.tokDir, name)
	tmp := p + ".new"
	if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(tmp, be.e.u.UID, be.e.u.GID); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// argv is airlock run with no join token, the job's environment vars
// (BEARER_TOKEN_FILE=..., AIRLOCK_JOB_ID=...) and command args.
func (be *bearerEnv) argv(vars []string, args ...string) []string {
	argv := append([]string{"env"}, vars...)
	argv = append(argv, be.e.airlock, "run", "--gateway", be.e.gateway, "--pin", be.e.pin, "--join-timeout", "30s", "--")
	return append(argv, args...)
}

func (be *bearerEnv) run(t *testing.T, timeout time.Duration, vars []string, args ...string) (int, string, string) {
	t.Helper()
	argv := be.argv(vars, args...)
	return be.e.tp.Run(t, timeout, be.e.tp.CN, be.e.u, argv[0], argv[1:]...)
}

// fetch is a job command that downloads /small and prints its sha256.
func (be *bearerEnv) fetch() []string {
	return []string{"bash", "-c", "set -o pipefail; curl -sS --max-time 20 " + be.httpURL + " | sha256sum"}
}

func (be *bearerEnv) fetched(out string) bool {
	f := strings.Fields(out)
	return len(f) > 0 && f[0] == be.e.sha["small"]
}

// valid: an RSA-signed token in BEARER_TOKEN_FILE, an EC-signed one in
// $XDG_RUNTIME_DIR/bt_u$UID; each job joins without a join token and
// downloads. The token is not in the job's environment (airlock run adds
// nothing; here the pilot gave the job none).
func (be *bearerEnv) valid(t *testing.T) {
	f := be.writeToken(t, "valid", be.rsa1.Sign(be.claims("alice", time.Hour)))
	code, out, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, be.fetch()...)
	if code != 0 || !be.fetched(out) {
		t.Fatalf("RSA token in BEARER_TOKEN_FILE: exit %d, %q%s", code, out, be.e.diag(stderr))
	}
	xdg := filepath.Join(be.tokDir, "xdg")
	if err := os.Mkdir(xdg, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(xdg, be.e.u.UID, be.e.u.GID); err != nil {
		t.Fatal(err)
	}
	be.writeToken(t, "xdg/bt_u"+strconv.Itoa(be.e.u.UID), be.ec1.Sign(be.claims("bob", time.Hour)))
	code, out, stderr = be.run(t, 60*time.Second, []string{"XDG_RUNTIME_DIR=" + xdg}, "bash", "-c", be.fetch()[2]+"; env | grep -c BEARER_TOKEN || true")
	if code != 0 || !be.fetched(out) || !strings.HasSuffix(strings.TrimSpace(out), "0") {
		t.Fatalf("EC token in $XDG_RUNTIME_DIR/bt_u$UID: exit %d, %q (want the download and no BEARER_TOKEN in the job's environment)%s", code, out, be.e.diag(stderr))
	}
}

// refusals: every token the gateway must refuse ends the job's start
// with the reason, before the job runs.
func (be *bearerEnv) refusals(t *testing.T) {
	other := bearertest.NewRSA("rsa1") // same kid, another key: a forgery
	wrong := func(k string, v any) map[string]any {
		c := be.claims("eve", time.Hour)
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	for _, tc := range []struct{ name, tok, want string }{
		{"expired", be.rsa1.Sign(wrong("exp", time.Now().Add(-30*time.Second).Unix())), "expired"},
		{"wrong audience", be.rsa1.Sign(wrong("aud", "https://other-gateway.example:8443")), "audience"},
		{"wrong issuer", be.rsa1.Sign(wrong("iss", "https://evil.example")), "not one this gateway trusts"},
		{"forged signature", other.Sign(be.claims("eve", time.Hour)), "does not verify"},
		{"HS256 with the public key", be.rsa1.HMACWithPublicKey(be.claims("eve", time.Hour)), "HMAC"},
		{"alg none", bearertest.Unsigned("rsa1", be.claims("eve", time.Hour)), "unsigned"},
		{"missing scope", be.rsa1.Sign(wrong("scope", "storage.read:/exp")), `no scope "compute.create"`},
		{"not in a group", be.rsa1.Sign(be.claims("eve", time.Hour, "/other")), "in none of the groups"},
	} {
		t.Run(strings.ReplaceAll(tc.name, " ", "_"), func(t *testing.T) {
			f := be.writeToken(t, "bad", tc.tok)
			code, out, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, "echo", "ran")
			if code == 0 || strings.Contains(out, "ran") || !strings.Contains(stderr, "bearer token refused") || !strings.Contains(stderr, tc.want) {
				t.Errorf("exit %d, stdout %q; want a refusal saying %q%s", code, out, tc.want, be.e.diag(stderr))
			}
		})
	}
}

// groupPolicy: [[issuer.map]] accounts the jobs of group /exp/prod as
// "exp-prod", and a policy rule naming it denies them the HTTP server
// that other jobs of the issuer reach.
func (be *bearerEnv) groupPolicy(t *testing.T) {
	f := be.writeToken(t, "prod", be.ec1.Sign(be.claims("carol", time.Hour, "/exp", "/exp/prod")))
	code, out, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, be.fetch()...)
	if code == 0 || be.fetched(out) {
		t.Errorf("job of group /exp/prod: exit %d, %q; want the download denied by rule prod-no-http%s", code, out, be.e.diag(stderr))
	}
}

// refresh: a long job whose first token expires while it runs keeps its
// lease because the pilot rewrote the token file and the renewals carry
// the new token; status, whois (text and --json) and the flow log name
// the issuer and subject, marked issuer-verified.
func (be *bearerEnv) refresh(t *testing.T) {
	f := be.writeToken(t, "long", be.rsa1.Sign(be.claims("dave", 5*time.Second)))
	argv := be.argv([]string{"BEARER_TOKEN_FILE=" + f, "AIRLOCK_JOB_ID=bt-long"}, "bash", "-c", "sleep 11; "+be.fetch()[2])
	p := be.e.tp.Start(t, be.e.tp.CN, be.e.u, argv[0], argv[1:]...)
	j := be.waitJob(t, "bt-long", p)
	if j.Issued == nil || j.Issued.Issuer != be.url || j.Issued.Subject != "dave" || j.Token != "exp" || j.Ref.Subject != "dave" {
		t.Errorf("status: issued %+v, token %q, ref %+v; want %s/dave accounted as exp", j.Issued, j.Token, j.Ref, be.url)
	}
	time.Sleep(time.Second)
	be.writeToken(t, "long", be.rsa1.Sign(be.claims("dave", time.Hour)))

	port := portOfBlock(t, j.Ports)
	at := fmt.Sprintf("%s:%d", be.e.tp.DMZAddrINET, port)
	code, out, stderr := be.e.admin(t, "whois", "--state", be.e.state, at)
	if want := be.url + "/dave [/exp] (" + identity.SourceIssuer + ")"; code != 0 || !strings.Contains(out, want) {
		t.Errorf("whois %s: exit %d, %s %s; want %q", at, code, out, stderr, want)
	}
	code, out, stderr = be.e.admin(t, "whois", "--state", be.e.state, "--json", at)
	var recs []store.LeaseRecord
	if code != 0 || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 1 || recs[0].Issued == nil || recs[0].Issued.Subject != "dave" || recs[0].Issued.Issuer != be.url {
		t.Errorf("whois --json %s: exit %d, %s %s; want the issued identity", at, code, out, stderr)
	}
	code, out, _ = be.e.admin(t, "status", "--state", be.e.state)
	if !strings.Contains(out, be.url+"/dave [/exp] ("+identity.SourceIssuer+")") {
		t.Errorf("status: exit %d, %s; want the identity marked %s", code, out, identity.SourceIssuer)
	}

	n, err := p.Wait(60 * time.Second)
	if err != nil || n != 0 || !be.fetched(p.Stdout()) {
		t.Fatalf("long job past its first token's expiry: exit %d (%v), %q; want the download%s", n, err, p.Stdout(), be.e.diag(p.Stderr()))
	}
	log, _ := os.ReadFile(filepath.Join(be.e.state, gatewayFlowLog))
	if !regexp.MustCompile(`"job_id":"bt-long"[^\n]*"issuer":"` + regexp.QuoteMeta(be.url) + `","subject":"dave"`).Match(log) {
		t.Errorf("flow log has no record of job bt-long naming its issuer and subject:\n%s", lastChars(string(log), 2000))
	}
}

// waitJob waits for status to list the lease of job id.
func (be *bearerEnv) waitJob(t *testing.T, id string, p *topology.Process) admin.JobStatus {
	t.Helper()
	var job admin.JobStatus
	found := false
	if !topology.PollEvery(30*time.Second, 100*time.Millisecond, func() bool {
		for _, j := range be.e.status(t).Jobs {
			if j.JobID == id {
				job, found = j, true
				return true
			}
		}
		ok, _ := p.Exited()
		return ok
	}) || !found {
		t.Fatalf("job %s has no lease: %s%s", id, p.Stdout(), be.e.diag(p.Stderr()))
	}
	return job
}

// expired: a job whose token expires and is not refreshed loses its
// lease at the next renewal, with a message that says why.
func (be *bearerEnv) expired(t *testing.T) {
	f := be.writeToken(t, "short", be.rsa1.Sign(be.claims("erin", 3*time.Second)))
	code, out, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, "bash", "-c", "sleep 9; curl -sS --max-time 3 "+be.httpURL+" | sha256sum")
	if be.fetched(out) || !strings.Contains(stderr, "bearer token expired") || !strings.Contains(stderr, "refresh the token file") {
		t.Errorf("job whose token expired: exit %d, %q; want its lease ended saying the token expired%s", code, out, be.e.diag(stderr))
	}
}

// rotation: the issuer withdraws rsa1 and publishes rsa2; a token of the
// new key joins (an unknown kid makes the gateway refetch the set), one
// of the withdrawn key no longer does.
func (be *bearerEnv) rotation(t *testing.T) {
	if err := bearertest.Write(be.dir, be.url, be.tls, be.ec1, be.rsa2); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // min_refetch
	f := be.writeToken(t, "rot", be.rsa2.Sign(be.claims("frank", time.Hour)))
	if code, out, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, "echo", "ran"); code != 0 || !strings.Contains(out, "ran") {
		t.Fatalf("token of the new key: exit %d, %q%s", code, out, be.e.diag(stderr))
	}
	f = be.writeToken(t, "rot", be.rsa1.Sign(be.claims("frank", time.Hour)))
	if code, _, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, "echo", "ran"); code == 0 || !strings.Contains(stderr, `no key "rsa1"`) {
		t.Errorf("token of the withdrawn key: exit %d; want a refusal naming the key%s", code, be.e.diag(stderr))
	}
}

// kickBan: airlock kick --ban of a token-identified job bans its subject:
// a new token of that subject is refused (from any node, with any token
// name), another subject of the issuer is not.
func (be *bearerEnv) kickBan(t *testing.T) {
	f := be.writeToken(t, "mallory", be.rsa2.Sign(be.claims("mallory", time.Hour)))
	argv := be.argv([]string{"BEARER_TOKEN_FILE=" + f, "AIRLOCK_JOB_ID=bt-mallory"}, "sleep", "60")
	p := be.e.tp.Start(t, be.e.tp.CN, be.e.u, argv[0], argv[1:]...)
	j := be.waitJob(t, "bt-mallory", p)
	code, out, stderr := be.e.admin(t, "kick", "--state", be.e.state, "--ban", "1h", "--reason", "e2e", string(j.Lease))
	if code != 0 || !strings.Contains(out+stderr, `subject "mallory"`) {
		t.Errorf("kick --ban: exit %d, %s %s; want the ban to name the subject", code, out, stderr)
	}
	f = be.writeToken(t, "mallory", be.ec1.Sign(be.claims("mallory", time.Hour)))
	if code, _, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, "echo", "ran"); code == 0 || !strings.Contains(stderr, `banned the jobs of subject "mallory"`) {
		t.Errorf("banned subject with a new token: exit %d; want a ban refusal%s", code, be.e.diag(stderr))
	}
	f = be.writeToken(t, "grace", be.ec1.Sign(be.claims("grace", time.Hour)))
	if code, out, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, "echo", "ran"); code != 0 || !strings.Contains(out, "ran") {
		t.Errorf("another subject: exit %d%s", code, be.e.diag(stderr))
	}
}

// issuerDown: with the issuer stopped, jobs keep joining with the keys
// the gateway holds, through several failed refreshes and a restart of
// the gateway (which reads the keys it kept in its state dir).
func (be *bearerEnv) issuerDown(t *testing.T) {
	be.issuer.Kill()
	time.Sleep(5 * time.Second) // refresh = 2s: two refreshes fail
	f := be.writeToken(t, "down", be.rsa2.Sign(be.claims("heidi", time.Hour)))
	code, out, stderr := be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, be.fetch()...)
	if code != 0 || !be.fetched(out) {
		t.Fatalf("issuer down, keys held: exit %d, %q%s", code, out, be.e.diag(stderr))
	}
	if !strings.Contains(be.e.gw.Stderr(), "cannot fetch the issuer's keys") {
		t.Errorf("gateway log does not say the issuer's keys cannot be fetched%s", be.e.diag(""))
	}
	if err := be.e.gw.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := be.e.gw.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	be.e.startGateway(t)
	code, out, stderr = be.run(t, 60*time.Second, []string{"BEARER_TOKEN_FILE=" + f}, be.fetch()...)
	if code != 0 || !be.fetched(out) {
		t.Fatalf("issuer down, gateway restarted, keys from its state dir: exit %d, %q%s", code, out, be.e.diag(stderr))
	}
	if !strings.Contains(be.e.gw.Stderr(), "cached key set loaded") {
		t.Errorf("restarted gateway did not load the cached keys%s", be.e.diag(""))
	}
}
