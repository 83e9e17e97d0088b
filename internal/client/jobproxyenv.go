// SPDX-License-Identifier: MIT

package client

import (
	"fmt"
	"net/netip"
	"net/url"
	"strings"
)

// The site's web proxy variables in the job's environment. A job inherits
// HTTPS_PROXY and its kin from the pilot. When airlock run reached its
// gateway through that proxy (the gateway is outside the site, the proxy
// is the node's only way out), the proxy is usually not reachable from
// inside the job: the job's network is the tunnel, and the gateway's
// floor denies the private addresses a site proxy has. A job that kept
// the variables would send its HTTP(S) through a proxy it cannot reach
// and fail, where without them it goes straight out through the tunnel.
// So in auto (the default), when the way to the gateway is the proxy and
// the proxy's host is not one the gateway's bypass list lets the job
// reach on the node's network, airlock run removes the variables from the
// job's environment and says so on the mode line; keep leaves them (a
// site whose proxy the tunnel does reach), drop always removes them. The
// fallback modes that run their own proxy (preload, proxy) set the
// variables to it whatever this says.

// Job proxy environment modes of Config.JobProxyEnv.
const (
	JobProxyEnvAuto = "auto"
	JobProxyEnvKeep = "keep"
	JobProxyEnvDrop = "drop"
)

// jobProxyVars are the proxy variables a job may inherit (NO_PROXY is
// left: without a proxy it does nothing).
var jobProxyVars = []string{"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"}

// checkJobProxyEnv checks a --job-proxy-env value ("" is auto).
func checkJobProxyEnv(mode string) (string, error) {
	switch mode {
	case "":
		return JobProxyEnvAuto, nil
	case JobProxyEnvAuto, JobProxyEnvKeep, JobProxyEnvDrop:
		return mode, nil
	}
	return "", fmt.Errorf("bad --job-proxy-env %q: want auto (remove the proxy variables from the job's environment when the gateway is reached through the site's web proxy), keep or drop", mode)
}

// jobProxyEnv applies mode to the job's environment env: proxy is the
// redacted URL of the site's web proxy the gateway was reached through
// ("" directly), local reports whether the job reaches a host on the
// node's network (the lease's bypass). It returns the environment and,
// when it removed variables, the note for the mode line.
func jobProxyEnv(env []string, mode, proxy string, local func(host string) bool) ([]string, string) {
	switch mode {
	case JobProxyEnvKeep:
		return env, ""
	case JobProxyEnvAuto, "":
		if proxy == "" {
			return env, ""
		}
		if u, err := url.Parse(proxy); err == nil && u.Hostname() != "" && local != nil && local(u.Hostname()) {
			return env, ""
		}
	}
	out := env[:0:0]
	var removed []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if isJobProxyVar(name) {
			removed = append(removed, name)
			continue
		}
		out = append(out, kv)
	}
	if len(removed) == 0 {
		return env, ""
	}
	why := "--job-proxy-env drop"
	if mode != JobProxyEnvDrop {
		why = "the gateway is reached through the site's web proxy, which the job's network, the tunnel, does not reach; --job-proxy-env keep keeps them"
	}
	return out, fmt.Sprintf("%s removed from the job's environment (%s)", strings.Join(removed, ", "), why)
}

func isJobProxyVar(name string) bool {
	for _, v := range jobProxyVars {
		if name == v {
			return true
		}
	}
	return false
}

// proxyLocal reports whether the lease's bypass list lets the job reach
// host (an address or a name) on the node's network.
func (s *Session) proxyLocal(host string) bool {
	set := s.bypass.Set()
	if set == nil {
		return false
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return set.Covers(a.Unmap())
	}
	return set.IsLocal(host)
}

// viaProxy returns the redacted URL of the site's web proxy the current
// gateway is reached through; "" directly.
func (s *Session) viaProxy() string {
	if s.dialer == nil {
		return ""
	}
	if p, ok := s.dialer.Path(s.cur.addr); ok {
		return p.Proxy
	}
	return ""
}

// JobProxyEnvNote says, for airlock run --check, what airlock run would
// remove from a job's environment env under mode when the gateway is
// reached through proxy ("" directly); "" when nothing. The lease's
// bypass list is not known before a join: a proxy it covers would be
// kept.
func JobProxyEnvNote(env []string, mode, proxy string) string {
	mode, err := checkJobProxyEnv(mode)
	if err != nil {
		return err.Error()
	}
	_, note := jobProxyEnv(env, mode, proxy, nil)
	return note
}
