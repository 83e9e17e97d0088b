// SPDX-License-Identifier: MIT

package topology

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The site network (WithSite): a namespace, site, linked to cn only, so
// that cn reaches it directly (the compute node's own network) and the
// gateway in dmz cannot (dmz has no route to it):
//
//	cn 10.77.0.2 (site0) ── veth ── 10.77.0.1 (cn0) site
//
// SiteAddr2 is a second address of site, for destinations outside a
// bypass entry.
var (
	SiteAddr   = netip.MustParseAddr("10.77.0.1")
	SiteAddr2  = netip.MustParseAddr("10.77.0.9")
	CNAddrSite = netip.MustParseAddr("10.77.0.2")
	SitePrefix = netip.MustParsePrefix("10.77.0.0/24")
)

// Interface names of the site link.
const (
	IfCNToSite  = "site0" // in cn
	IfSiteToCN  = "cn0"   // in site
	IfSiteToDMZ = "dmz0"  // in site (WithSiteUplink)
	IfDMZToSite = "site0" // in dmz (WithSiteUplink)
)

// The site's uplink (WithSiteUplink): the site network's own way to the
// gateway's host, which the site's web proxy takes:
//
//	site 10.78.0.1 (dmz0) ── veth ── 10.78.0.2 (site0) dmz
//
// with a route in site to dmz's inside address (DMZAddrCN) through it.
var (
	SiteAddrUplink = netip.MustParseAddr("10.78.0.1")
	DMZAddrSite    = netip.MustParseAddr("10.78.0.2")
)

// WithSite adds the site network (see SiteAddr), for tests of site-local
// bypass.
func WithSite() Option { return func(o *options) { o.site = true } }

// WithSiteUplink adds the site network with its own link to dmz (see
// SiteAddrUplink), so that a web proxy in site (StartSquidWith) reaches
// the gateway; with CutCNFromDMZ the proxy is cn's only way to it, as at
// a site whose nodes reach an outside gateway only through its proxy.
func WithSiteUplink() Option { return func(o *options) { o.site, o.uplink = true, true } }

// linkSiteUplink makes the site–dmz link and returns its two ends.
func (tp *Topology) linkSiteUplink(t testing.TB) [][2]string {
	mustIP(t, "-n", tp.Site, "link", "add", IfSiteToDMZ, "type", "veth", "peer", "name", IfDMZToSite, "netns", tp.DMZ)
	mustIP(t, "-n", tp.Site, "addr", "add", SiteAddrUplink.String()+"/24", "dev", IfSiteToDMZ)
	mustIP(t, "-n", tp.Site, "link", "set", IfSiteToDMZ, "up")
	mustIP(t, "-n", tp.DMZ, "addr", "add", DMZAddrSite.String()+"/24", "dev", IfDMZToSite)
	mustIP(t, "-n", tp.DMZ, "link", "set", IfDMZToSite, "up")
	mustIP(t, "-n", tp.Site, "route", "add", tp.DMZAddrCN.String()+"/32", "via", DMZAddrSite.String())
	return [][2]string{{tp.Site, IfSiteToDMZ}, {tp.DMZ, IfDMZToSite}}
}

// CutCNFromDMZ takes cn's link to dmz down: cn keeps only the site link,
// and reaches the gateway's host only through something in site that
// re-originates its connections (a web proxy). Its IPv4 and IPv6 routes
// to dmz go with the link.
func (tp *Topology) CutCNFromDMZ(t testing.TB) {
	t.Helper()
	mustIP(t, "-n", tp.CN, "link", "set", IfCNToDMZ, "down")
}

// SquidOptions configures StartSquidWith. The zero value is StartSquid's
// open proxy.
type SquidOptions struct {
	// ConnectPorts, if not empty, are the only ports squid lets CONNECT
	// reach (squid's stock SSL_ports rule, which allows only 443); a
	// CONNECT elsewhere gets 403.
	ConnectPorts []int
	// User and Password, if User is set, make squid ask for Basic proxy
	// authentication (basic_ncsa_auth with an htpasswd file): no or
	// wrong credentials get 407.
	User, Password string
}

// SquidProcess is a running squid (StartSquidWith).
type SquidProcess struct {
	Port int
	dir  string
}

// AccessLog returns squid's access log so far.
func (s *SquidProcess) AccessLog() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "access.log"))
	return string(b)
}

// linkSite makes the cn–site link and returns its two ends.
func (tp *Topology) linkSite(t testing.TB) [][2]string {
	mustIP(t, "-n", tp.CN, "link", "add", IfCNToSite, "type", "veth", "peer", "name", IfSiteToCN, "netns", tp.Site)
	mustIP(t, "-n", tp.CN, "addr", "add", CNAddrSite.String()+"/24", "dev", IfCNToSite)
	mustIP(t, "-n", tp.CN, "link", "set", IfCNToSite, "up")
	mustIP(t, "-n", tp.Site, "addr", "add", SiteAddr.String()+"/24", "dev", IfSiteToCN)
	mustIP(t, "-n", tp.Site, "addr", "add", SiteAddr2.String()+"/24", "dev", IfSiteToCN)
	mustIP(t, "-n", tp.Site, "link", "set", IfSiteToCN, "up")
	return [][2]string{{tp.CN, IfCNToSite}, {tp.Site, IfSiteToCN}}
}

// Squid is the path of the squid binary (Debian package squid).
const Squid = "/usr/sbin/squid"

// StartSquid starts squid in the site namespace as a caching forward
// proxy on SiteAddr:port, open to the cn link, with a memory-only cache,
// and waits until it accepts connections. It skips the test if squid is
// not installed (scripts/setup.sh installs it), unless CI is set.
func (tp *Topology) StartSquid(t testing.TB) int {
	t.Helper()
	return tp.StartSquidWith(t, SquidOptions{}).Port
}

// StartSquidWith is StartSquid with the rules of o.
func (tp *Topology) StartSquidWith(t testing.TB, o SquidOptions) *SquidProcess {
	t.Helper()
	if _, err := os.Stat(Squid); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("squid not installed (%v): run scripts/setup.sh", err)
		}
		t.Skipf("squid not installed (%v): run scripts/setup.sh", err)
	}
	if tp.Site == "" {
		t.Fatal("StartSquid needs WithSite")
	}
	dir := TempDir(t)
	port := tp.Port()
	var rules strings.Builder
	if len(o.ConnectPorts) > 0 {
		rules.WriteString("acl SSL_ports port")
		for _, p := range o.ConnectPorts {
			fmt.Fprintf(&rules, " %d", p)
		}
		rules.WriteString("\nacl CONNECT method CONNECT\nhttp_access deny CONNECT !SSL_ports\n")
	}
	if o.User != "" {
		out, err := exec.Command("openssl", "passwd", "-apr1", o.Password).Output()
		if err != nil {
			t.Fatalf("squid password file: openssl passwd: %v", err)
		}
		pw := filepath.Join(dir, "passwd")
		if err := os.WriteFile(pw, []byte(o.User+":"+strings.TrimSpace(string(out))+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&rules, "auth_param basic program /usr/lib/squid/basic_ncsa_auth %s\nauth_param basic realm airlock-test\nacl authed proxy_auth REQUIRED\nhttp_access deny !authed\n", pw)
	}
	conf := fmt.Sprintf(`http_port %s:%d
acl cn src %s
`+rules.String()+`http_access allow cn
http_access deny all
cache_mem 64 MB
maximum_object_size_in_memory 64 MB
cache_dir null /tmp
pid_filename %s
access_log stdio:%s
cache_log %s
cache_effective_user proxy
coredump_dir %s
shutdown_lifetime 0 seconds
`, SiteAddr, port, SitePrefix, filepath.Join(dir, "squid.pid"), filepath.Join(dir, "access.log"),
		filepath.Join(dir, "cache.log"), dir)
	// "cache_dir null" needs a build with it; memory-only is the default
	// without any cache_dir, so drop it if squid refuses.
	cf := filepath.Join(dir, "squid.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("ip", "netns", "exec", tp.Site, Squid, "-k", "parse", "-f", cf).CombinedOutput(); err != nil {
		conf = strings.Replace(conf, "cache_dir null /tmp\n", "", 1)
		if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		if out2, err := exec.Command("ip", "netns", "exec", tp.Site, Squid, "-k", "parse", "-f", cf).CombinedOutput(); err != nil {
			t.Fatalf("squid config: %v: %s\n%s", err, out, out2)
		}
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	p := tp.Start(t, tp.Site, nil, Squid, "-N", "-f", cf)
	deadline := time.Now().Add(20 * time.Second)
	ap := netip.AddrPortFrom(SiteAddr, uint16(port))
	for !tp.TCPCheck(t, tp.CN, nil, ap) {
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "cache.log"))
			t.Fatalf("squid did not listen on %s within 20 s: %s\n%s", ap, p.Stderr(), log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "access.log"))
			t.Logf("squid access log:\n%s", log)
		}
	})
	return &SquidProcess{Port: port, dir: dir}
}
