// SPDX-License-Identifier: MIT

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestExperimentGateway is issue 37's deployment end to end: an
// experiment runs its gateway outside the site (dmz, which cn reaches
// only through the site's squid: CutCNFromDMZ, and the squid allows
// CONNECT to the gateway's port alone), trusting its own token issuer (a
// real HTTPS issuer in inet). A job on the node joins identified only by
// its bearer token (no join token, no MUNGE), through the proxy, mounts
// a squashfs image with FUSE and downloads through the tunnel; the
// outside source port of its connection names the issuer and subject in
// whois (text and --json), status and the flow log. The site proxy's
// variables are not in the job's environment (the tunnel does not reach
// the proxy), unless --job-proxy-env keep; the bearer token is not either,
// unless the pilot gave it to the job itself.
func TestExperimentGateway(t *testing.T) {
	// The gateway renews leases every second (lease TTL 3 s, no more
	// than the auto transport's wait for a UDP handshake before it falls
	// back to TCP through the proxy): the wait must leave the lease time
	// for its first renewal.
	be := newBearerEnv(t, []topology.Option{topology.WithSiteUplink(), topology.WithUserFUSE()})
	e := be.e
	e.tp.CutCNFromDMZ(t)
	squid := e.tp.StartSquidWith(t, topology.SquidOptions{ConnectPorts: []int{gatewayPort}})
	proxyURL := fmt.Sprintf("http://%s:%d", topology.SiteAddr, squid.Port)
	srcPort := e.tp.StartTCPSrcPort(t)
	tok := be.rsa1.Sign(be.claims("mc-pilot", time.Hour))
	tokFile := be.writeToken(t, "experiment", tok)
	// What a pilot at such a site sets: the proxy (both spellings, as
	// site profiles do), the token file it refreshes, no join token; and
	// no MUNGE: the node's credential means nothing to this gateway.
	pilot := []string{"HTTPS_PROXY=" + proxyURL, "http_proxy=" + proxyURL, "ALL_PROXY=" + proxyURL, "AIRLOCK_ATTEST=off"}

	t.Run("Job", func(t *testing.T) {
		const content = "experiment software from squashfs\n"
		image, dir := squashfsImage(t, e.u, content)
		goOn := filepath.Join(be.tokDir, "go-on")
		script := fmt.Sprintf(`set -e
squashfuse %[1]s %[2]s
cat %[2]s/hello.txt
exec 3<>/dev/tcp/%[3]s/%[4]d
read -r src <&3
echo "src $src"
curl -sS --max-time 30 %[5]s | sha256sum
echo "--- env"
env
echo "--- end"
for i in $(seq 300); do [ -e %[6]s ] && break; sleep 0.1; done
fusermount3 -u %[2]s`, image, dir, e.tp.INETAddr, srcPort, be.httpURL, goOn)
		vars := append([]string{"BEARER_TOKEN_FILE=" + tokFile, "AIRLOCK_JOB_ID=exp-mc"}, pilot...)
		argv := be.argv(vars, "bash", "-c", script)
		p := e.tp.Start(t, e.tp.CN, e.u, argv[0], argv[1:]...)
		j := be.waitJob(t, "exp-mc", p)
		if j.Issued == nil || j.Issued.Issuer != be.url || j.Issued.Subject != "mc-pilot" || j.Token != "exp" {
			t.Errorf("status: issued %+v, token %q; want %s/mc-pilot accounted as the issuer's name exp", j.Issued, j.Token, be.url)
		}
		// The outside address and port the job's connection came from,
		// as the server in inet saw them.
		var src string
		srcLine := regexp.MustCompile(`(?m)^src (\S+)$`)
		if !topology.Poll(60*time.Second, func() bool {
			if m := srcLine.FindStringSubmatch(p.Stdout()); m != nil {
				src = m[1]
				return true
			}
			ok, _ := p.Exited()
			return ok
		}) || src == "" {
			t.Fatalf("the job printed no source address: %q%s", p.Stdout(), e.diag(p.Stderr()))
		}
		if !strings.HasPrefix(src, e.tp.DMZAddrINET.String()+":") {
			t.Errorf("the job's connection came from %s, want the gateway's outside address %s", src, e.tp.DMZAddrINET)
		}
		want := be.url + "/mc-pilot [/exp] (" + identity.SourceIssuer + ")"
		code, out, stderr := e.admin(t, "whois", "--state", e.state, src)
		if code != 0 || !strings.Contains(out, want) {
			t.Errorf("whois %s: exit %d, %s %s; want %q", src, code, out, stderr, want)
		}
		code, out, stderr = e.admin(t, "whois", "--state", e.state, "--json", src)
		var recs []store.LeaseRecord
		if code != 0 || json.Unmarshal([]byte(out), &recs) != nil || len(recs) != 1 || recs[0].Issued == nil ||
			recs[0].Issued.Issuer != be.url || recs[0].Issued.Subject != "mc-pilot" || recs[0].JobID != "exp-mc" || recs[0].Attested != nil {
			t.Errorf("whois --json %s: exit %d, %s %s; want job exp-mc's record with the issuer and subject, no MUNGE attestation", src, code, out, stderr)
		}
		if err := os.WriteFile(goOn, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if n, err := p.Wait(60 * time.Second); err != nil || n != 0 {
			t.Fatalf("job: exit %d (%v), stdout %q%s", n, err, p.Stdout(), e.diag(p.Stderr()))
		}
		out, stderr = p.Stdout(), p.Stderr()
		if !strings.HasPrefix(out, content) || !strings.Contains(out, "\n"+e.sha["small"]+" ") {
			t.Errorf("job's stdout %q: want the image's file, then the download's sha256 %s", out, e.sha["small"])
		}
		_, jobEnv, _ := strings.Cut(out, "--- env\n")
		jobEnv, _, _ = strings.Cut(jobEnv, "--- end\n")
		if m := regexp.MustCompile(`(?im)^(https?|all)_proxy=.*$`).FindAllString(jobEnv, -1); m != nil {
			t.Errorf("the job's environment has the site proxy's variables %q, which the tunnel does not reach", m)
		}
		if strings.Contains(jobEnv, tok) {
			t.Errorf("the job's environment holds the bearer token:\n%s", jobEnv)
		}
		for _, w := range []string{"through the site's web proxy " + proxyURL, "transport: tcp",
			"HTTPS_PROXY, http_proxy, ALL_PROXY removed from the job's environment"} {
			if !strings.Contains(stderr, w) {
				t.Errorf("airlock run's stderr does not say %q:\n%s", w, stderr)
			}
		}
		// The proxy carried the tunnel (CONNECT to the gateway's port,
		// ciphertext), not the job's download.
		access := squid.AccessLog()
		if !strings.Contains(access, "CONNECT "+e.gateway) || strings.Contains(access, be.httpURL) {
			t.Errorf("squid's access log: want CONNECT %s and not the job's download %s:\n%s", e.gateway, be.httpURL, access)
		}
		log, _ := os.ReadFile(filepath.Join(e.state, gatewayFlowLog))
		if !regexp.MustCompile(`"job_id":"exp-mc"[^\n]*"issuer":"` + regexp.QuoteMeta(be.url) + `","subject":"mc-pilot"`).Match(log) {
			t.Errorf("flow log has no record of job exp-mc naming its issuer and subject:\n%s", lastChars(string(log), 2000))
		}
	})

	// keep: the pilot's proxy variables reach the job unchanged, and so
	// does a token the pilot put into the job's environment itself.
	t.Run("KeepProxyEnv", func(t *testing.T) {
		vars := append([]string{"BEARER_TOKEN=" + tok, "AIRLOCK_JOB_PROXY_ENV=keep"}, pilot...)
		code, out, stderr := be.run(t, 60*time.Second, vars, "env")
		if code != 0 {
			t.Fatalf("exit %d, %q%s", code, out, e.diag(stderr))
		}
		for _, w := range []string{"HTTPS_PROXY=" + proxyURL, "http_proxy=" + proxyURL, "ALL_PROXY=" + proxyURL, "BEARER_TOKEN=" + tok} {
			if !strings.Contains(out, "\n"+w+"\n") && !strings.HasPrefix(out, w+"\n") {
				t.Errorf("with --job-proxy-env keep the job's environment lacks %q:\n%s", w, out)
			}
		}
		if strings.Contains(stderr, "removed from the job's environment") {
			t.Errorf("with keep, the mode line still says variables were removed:\n%s", stderr)
		}
	})

	t.Run("Check", func(t *testing.T) {
		argv := append(append([]string{"env", "BEARER_TOKEN_FILE=" + tokFile}, pilot...),
			e.airlock, "run", "--check", "--gateway", e.gateway, "--pin", e.pin)
		_, out, stderr := e.tp.Run(t, 60*time.Second, e.tp.CN, e.u, argv[0], argv[1:]...)
		for _, w := range []string{"through the site's web proxy", "issuer " + be.url + ", subject mc-pilot", "control API answers",
			"HTTPS_PROXY, http_proxy, ALL_PROXY removed from the job's environment"} {
			if !strings.Contains(out+stderr, w) {
				t.Errorf("--check does not say %q:\n%s%s", w, out, stderr)
			}
		}
	})
}
