// SPDX-License-Identifier: MIT

package client

import (
	"slices"
	"strings"
	"testing"
)

func TestJobProxyEnv(t *testing.T) {
	env := []string{"PATH=/bin", "HTTPS_PROXY=http://10.77.0.1:3128", "http_proxy=http://10.77.0.1:3128",
		"ALL_PROXY=socks5://10.77.0.1:1080", "NO_PROXY=.site", "HTTPS_PROXYX=kept"}
	rest := []string{"PATH=/bin", "NO_PROXY=.site", "HTTPS_PROXYX=kept"}
	const proxy = "http://10.77.0.1:3128"
	local := func(h string) bool { return h == "10.77.0.1" }
	never := func(string) bool { return false }
	for _, tc := range []struct {
		name, mode, proxy string
		local             func(string) bool
		want              []string
		note              string
	}{
		{"auto through the proxy", JobProxyEnvAuto, proxy, never, rest, "which the job's network, the tunnel, does not reach; --job-proxy-env keep keeps them"},
		{"auto empty mode", "", proxy, never, rest, "through the site's web proxy"},
		{"auto direct", JobProxyEnvAuto, "", never, env, ""},
		{"auto proxy in the bypass list", JobProxyEnvAuto, proxy, local, env, ""},
		{"keep", JobProxyEnvKeep, proxy, never, env, ""},
		{"drop direct", JobProxyEnvDrop, "", never, rest, "--job-proxy-env drop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, note := jobProxyEnv(slices.Clone(env), tc.mode, tc.proxy, tc.local)
			if !slices.Equal(got, tc.want) {
				t.Errorf("env %q, want %q", got, tc.want)
			}
			if (note == "") != (tc.note == "") || !strings.Contains(note, tc.note) {
				t.Errorf("note %q, want one saying %q", note, tc.note)
			}
			if note != "" && !strings.HasPrefix(note, "HTTPS_PROXY, http_proxy, ALL_PROXY removed from the job's environment") {
				t.Errorf("note %q does not name the variables it removed", note)
			}
		})
	}
	if got, note := jobProxyEnv([]string{"PATH=/bin"}, JobProxyEnvDrop, proxy, never); note != "" || len(got) != 1 {
		t.Errorf("nothing to remove: %q, note %q; want no note", got, note)
	}
	if note := JobProxyEnvNote(env, "", proxy); !strings.HasPrefix(note, "HTTPS_PROXY, http_proxy, ALL_PROXY removed") {
		t.Errorf("JobProxyEnvNote through the proxy: %q", note)
	}
	if note := JobProxyEnvNote(env, JobProxyEnvAuto, ""); note != "" {
		t.Errorf("JobProxyEnvNote direct: %q, want none", note)
	}
	if _, err := checkJobProxyEnv("strip"); err == nil || !strings.Contains(err.Error(), "auto") {
		t.Errorf("checkJobProxyEnv(strip) = %v, want an error naming the values", err)
	}
}

// The mode line says what was removed in the modes that keep the job's
// environment, not in those that set the variables to their own proxy.
func TestModeLineNote(t *testing.T) {
	for _, tc := range []struct {
		m    Mode
		want bool
	}{{ModeNetns, true}, {ModeSeccomp, true}, {ModePreload, false}, {ModeProxy, false}} {
		p := newPlan(tc.m)
		p.note = "HTTPS_PROXY removed from the job's environment (x)"
		if got := strings.HasSuffix(p.line(), "; "+p.note); got != tc.want {
			t.Errorf("mode %s: line %q, want the note: %v", tc.m, p.line(), tc.want)
		}
	}
}
