// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestSiteProxy runs jobs on a node whose only way to the gateway is the
// site's web proxy: cn's link to dmz is down, cn reaches only the site
// network, and a real squid there (with its own link to dmz) is the way
// out. airlock run finds that direct TCP fails, reaches the control API
// and the TCP/TLS transport through the proxy's CONNECT (HTTPS_PROXY),
// and the job downloads through the tunnel; --check names the path; a
// proxy that refuses CONNECT to the gateway's port (403) or wants
// credentials (407) ends the job at once with the fix, and credentials
// from AIRLOCK_PROXY_AUTH_FILE are sent. The job also mounts a squashfs
// image with FUSE, as the seed's jobs mount their software.
func TestSiteProxy(t *testing.T) {
	e := newEnvTopo(t, modeUser, []topology.Option{topology.WithSiteUplink(), topology.WithUserFUSE()})
	e.tp.CutCNFromDMZ(t)
	open := e.tp.StartSquidWith(t, topology.SquidOptions{})
	forbid := e.tp.StartSquidWith(t, topology.SquidOptions{ConnectPorts: []int{443}})
	authed := e.tp.StartSquidWith(t, topology.SquidOptions{User: "pilot", Password: "s3cret:x"})
	proxy := func(p *topology.SquidProcess) string {
		return fmt.Sprintf("HTTPS_PROXY=http://%s:%d", topology.SiteAddr, p.Port)
	}
	url := fmt.Sprintf("http://%s:%d/small", e.tp.INETAddr, e.httpPort)
	get := []string{"sh", "-c", "curl -sS --max-time 30 " + url + " | sha256sum"}
	fast := []string{"--join-timeout", "60s", "--log-level", "info"}

	t.Run("NoOtherRoute", func(t *testing.T) {
		code, out, stderr := e.runWith(t, runOpts{flags: []string{"--join-timeout", "2s"}}, "true")
		if code == 0 || !strings.Contains(stderr, "cannot reach gateway") {
			t.Fatalf("without HTTPS_PROXY: exit %d, %q, want unreachable%s", code, out, e.diag(stderr))
		}
		// Nothing else leads out of cn: the gateway's host is unreachable.
		if e.tp.TCPCheck(t, e.tp.CN, nil, netip.MustParseAddrPort(e.gateway)) {
			t.Fatalf("cn reaches %s directly", e.gateway)
		}
	})

	t.Run("Job", func(t *testing.T) {
		// The seed's job: its software from a squashfs image mounted
		// with FUSE, its data downloaded through the tunnel.
		const content = "software from squashfs\n"
		image, dir := squashfsImage(t, e.u, content)
		script := fmt.Sprintf("squashfuse %s %s && cat %s/hello.txt && curl -sS --max-time 30 %s | sha256sum", image, dir, dir, url)
		before := strings.Count(open.AccessLog(), "CONNECT")
		code, out, stderr := e.runWith(t, runOpts{env: []string{proxy(open)}, flags: fast}, "sh", "-c", script)
		if code != 0 || !strings.HasPrefix(out, content+e.sha["small"]) {
			t.Fatalf("FUSE mount and download through the proxy: exit %d, %q, want %q and sha %s%s", code, out, content, e.sha["small"], e.diag(stderr))
		}
		for _, want := range []string{"transport: tcp", "through the site's web proxy http://" + topology.SiteAddr.String(), "direct TCP failed"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("airlock run's log does not say %q:\n%s", want, stderr)
			}
		}
		log := open.AccessLog()
		if n := strings.Count(log, "CONNECT "+e.gateway); n <= before {
			t.Errorf("squid's access log has no new CONNECT %s:\n%s", e.gateway, log)
		}
	})

	t.Run("Check", func(t *testing.T) {
		check := func(env ...string) (int, string) {
			argv := append([]string{"env"}, env...)
			argv = append(argv, e.airlock, "run", "--check", "--gateway", e.gateway, "--pin", e.pin, "--token", e.token)
			code, out, stderr := e.tp.Run(t, 60*time.Second, e.tp.CN, e.u, argv[0], argv[1:]...)
			return code, out + stderr
		}
		_, out := check(proxy(open))
		for _, want := range []string{"path", "through the site's web proxy", "direct TCP failed", "control API answers"} {
			if !strings.Contains(out, want) {
				t.Errorf("--check with HTTPS_PROXY does not say %q:\n%s", want, out)
			}
		}
		code, out := check()
		if code == 0 || !strings.Contains(out, "set HTTPS_PROXY") {
			t.Errorf("--check without a proxy: exit %d, want a problem that names HTTPS_PROXY:\n%s", code, out)
		}
	})

	t.Run("Forbidden", func(t *testing.T) {
		t0 := time.Now()
		code, _, stderr := e.runWith(t, runOpts{env: []string{proxy(forbid)}, flags: fast}, "true")
		if code == 0 || !strings.Contains(stderr, "must allow CONNECT to the gateway's port 8443") {
			t.Fatalf("squid allowing CONNECT to 443 only: exit %d, want the 403 and its fix%s", code, e.diag(stderr))
		}
		if took := time.Since(t0); took > 30*time.Second {
			t.Errorf("a 403 took %v to end the job: it waited as for an unreachable gateway", took)
		}
	})

	dir := topology.TempDir(t)
	authFile := filepath.Join(dir, "proxy-auth")
	if err := os.WriteFile(authFile, []byte("pilot:s3cret:x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(authFile, e.u.UID, e.u.GID); err != nil {
		t.Fatal(err)
	}
	t.Run("Auth", func(t *testing.T) {
		code, _, stderr := e.runWith(t, runOpts{env: []string{proxy(authed)}, flags: fast}, "true")
		if code == 0 || !strings.Contains(stderr, "wants credentials") || !strings.Contains(stderr, "AIRLOCK_PROXY_AUTH_FILE") {
			t.Errorf("no credentials: exit %d, want the 407 and where credentials go%s", code, e.diag(stderr))
		}
		wrong := fmt.Sprintf("HTTPS_PROXY=http://pilot:nope@%s:%d", topology.SiteAddr, authed.Port)
		code, _, stderr = e.runWith(t, runOpts{env: []string{wrong}, flags: fast}, "true")
		if code == 0 || !strings.Contains(stderr, "rejected the credentials from the proxy URL") || strings.Contains(stderr, "nope") {
			t.Errorf("wrong password: exit %d, want the 407 naming the URL as source, without the password%s", code, e.diag(stderr))
		}
		code, out, stderr := e.runWith(t, runOpts{env: []string{proxy(authed), "AIRLOCK_PROXY_AUTH_FILE=" + authFile}, flags: fast}, get...)
		if code != 0 || !strings.HasPrefix(out, e.sha["small"]) {
			t.Fatalf("credentials from AIRLOCK_PROXY_AUTH_FILE: exit %d, %q%s", code, out, e.diag(stderr))
		}
	})
}
