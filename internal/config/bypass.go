// SPDX-License-Identifier: MIT

package config

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/airlock-vpn/airlock/internal/policy"
)

// Bypass is the site-local bypass of a config: destinations inside the
// site that jobs reach from the compute node's own network instead of
// through the gateway, and the domains the node's site resolvers answer.
type Bypass struct {
	// Rules are the bypass entries, in file order, each an allow rule
	// (To, Proto, Ports, Tokens as in the policy). A job's flow is
	// bypassed only if it matches one and the policy allows it too.
	Rules []policy.Rule
	// LocalDomains are lower-case DNS suffixes without a trailing dot.
	LocalDomains []string
	// Resolvers answer LocalDomains; set if and only if LocalDomains is.
	Resolvers []netip.AddrPort
}

// IsZero reports whether b bypasses nothing.
func (b Bypass) IsZero() bool { return len(b.Rules) == 0 && len(b.LocalDomains) == 0 }

type fileBypass struct {
	Name   string   `toml:"name"`
	To     []string `toml:"to"`
	Proto  string   `toml:"proto"`
	Ports  []any    `toml:"ports"`
	Tokens []string `toml:"tokens"`
}

type fileDNS struct {
	LocalDomains []string `toml:"local_domains"`
	Resolvers    []string `toml:"resolvers"`
}

// neverBypassed are ranges a bypass entry may not touch: the node's own
// loopback, "this network", multicast and broadcast.
var neverBypassed = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("255.255.255.255/32"),
	netip.MustParsePrefix("::/128"),
	netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("ff00::/8"),
}

// validateBypass reads the [[bypass]] entries and the [dns] table.
func (d *file) validateBypass(cfg *Config, bad func(string, string, ...any)) {
	names := map[string]int{}
	for i, fb := range d.Bypass {
		key := fmt.Sprintf("bypass[%d]", i+1)
		r := policy.Rule{Name: fb.Name, Action: policy.Allow}
		if r.Name == "" {
			r.Name = fmt.Sprintf("bypass%d", i+1)
		} else if err := policy.ValidateName(r.Name); err != nil {
			bad(key+".name", "%v", err)
		}
		if j, ok := names[r.Name]; ok {
			bad(key+".name", "%q is also the name of bypass[%d]; names must be unique (they label the bypass counters)", r.Name, j)
		}
		names[r.Name] = i + 1
		if len(fb.To) == 0 {
			bad(key+".to", "missing or empty: list the site's prefixes to bypass, e.g. to = [\"10.20.0.0/16\"]")
		}
		for _, s := range fb.To {
			p, err := parsePrefix(s)
			if err != nil {
				bad(key+".to", "%v", err)
				continue
			}
			if n := overlapsNever(p); n.IsValid() {
				bad(key+".to", "%s overlaps %s (loopback, this-network, multicast or broadcast), which is never bypassed", p, n)
				continue
			}
			r.To = append(r.To, p)
		}
		parseMatch(&r, fb.Proto, fb.Ports, fb.Tokens, key, bad)
		cfg.Bypass.Rules = append(cfg.Bypass.Rules, r)
	}

	if d.DNS.LocalDomains != nil && len(d.DNS.LocalDomains) == 0 {
		bad("dns.local_domains", "empty list: omit it, or list the site's domains")
	}
	seen := map[string]bool{}
	for _, s := range d.DNS.LocalDomains {
		dom, err := parseDomain(s)
		if err != nil {
			bad("dns.local_domains", "%v", err)
			continue
		}
		if !seen[dom] {
			cfg.Bypass.LocalDomains = append(cfg.Bypass.LocalDomains, dom)
			seen[dom] = true
		}
	}
	for _, s := range d.DNS.Resolvers {
		ap, err := parseResolver(s)
		if err != nil {
			bad("dns.resolvers", "%v", err)
			continue
		}
		cfg.Bypass.Resolvers = append(cfg.Bypass.Resolvers, ap)
	}
	switch {
	case len(d.DNS.LocalDomains) > 0 && len(d.DNS.Resolvers) == 0:
		bad("dns", "local_domains without resolvers: name the site resolver(s) the nodes should ask, e.g. resolvers = [\"10.20.0.53\"]")
	case len(d.DNS.LocalDomains) == 0 && len(d.DNS.Resolvers) > 0:
		bad("dns.resolvers", "resolvers without local_domains: list the domains they answer for")
	}
}

// overlapsNever returns the never-bypassed range p overlaps, if any.
func overlapsNever(p netip.Prefix) netip.Prefix {
	for _, n := range neverBypassed {
		if n.Overlaps(p) {
			return n
		}
	}
	return netip.Prefix{}
}

// parseDomain reads a DNS suffix such as "site.example" (a trailing dot
// is dropped, letters are lower-cased).
func parseDomain(s string) (string, error) {
	d := strings.ToLower(strings.TrimSuffix(s, "."))
	if d == "" || len(d) > 253 {
		return "", fmt.Errorf("%q: want a domain such as site.example", s)
	}
	for _, l := range strings.Split(d, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("%q: want a domain such as site.example (labels of 1-63 letters, digits and inner hyphens)", s)
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("%q: want a domain such as site.example (labels of 1-63 letters, digits and inner hyphens)", s)
			}
		}
	}
	return d, nil
}

// parseResolver reads "ADDR" (port 53) or "ADDR:PORT" / "[V6]:PORT".
func parseResolver(s string) (netip.AddrPort, error) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return netip.AddrPortFrom(a.Unmap(), 53), validResolver(s, a)
	}
	ap, err := netip.ParseAddrPort(s)
	if err != nil || ap.Port() == 0 || ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%q: want an address such as 10.20.0.53, or ADDR:PORT", s)
	}
	ap = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
	return ap, validResolver(s, ap.Addr())
}

func validResolver(s string, a netip.Addr) error {
	if a.IsUnspecified() || a.IsMulticast() {
		return fmt.Errorf("%q: not a resolver address", s)
	}
	return nil
}

// String formats b's entry counts for logs.
func (b Bypass) String() string {
	return strconv.Itoa(len(b.Rules)) + " bypass entries, " + strconv.Itoa(len(b.LocalDomains)) + " local domains"
}
