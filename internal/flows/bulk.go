// SPDX-License-Identifier: MIT

package flows

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/airlock-vpn/airlock/internal/ipproto"
)

// BulkRule marks known-good bulk destinations (e.g. the site's xrootd
// servers): flows whose outside address is in Prefix and, if Lo > 0, whose
// outside port is in Lo..Hi are counted in the rule's aggregate instead of
// being logged one by one. TCP and UDP flows match; ICMP flows match rules
// without ports.
type BulkRule struct {
	// Name is the rule as written, e.g. "192.0.2.0/24:1094".
	Name   string
	Prefix netip.Prefix
	Lo, Hi uint16
}

// ParseBulkRule parses CIDR[:PORT[-PORT]], where CIDR may also be a bare
// address (IPv6 with ports in brackets: [2001:db8::1]:1094).
func ParseBulkRule(s string) (BulkRule, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return BulkRule{}, fmt.Errorf("bad bulk rule %q: empty; want CIDR[:PORT[-PORT]], e.g. 192.0.2.0/24:1094", s)
	}
	addr, ports, hasPorts := in, "", false
	if i := strings.IndexByte(in, '/'); i >= 0 {
		if j := strings.IndexByte(in[i:], ':'); j >= 0 {
			addr, ports, hasPorts = in[:i+j], in[i+j+1:], true
		}
	} else if strings.HasPrefix(in, "[") {
		k := strings.Index(in, "]")
		if k < 0 {
			return BulkRule{}, fmt.Errorf("bad bulk rule %q: missing ]", s)
		}
		addr = in[1:k]
		rest := in[k+1:]
		if rest != "" {
			if rest[0] != ':' {
				return BulkRule{}, fmt.Errorf("bad bulk rule %q: want [IPv6]:PORT", s)
			}
			ports, hasPorts = rest[1:], true
		}
	} else if strings.Count(in, ":") == 1 {
		addr, ports, hasPorts = strings.Cut(in, ":")
	}
	var p netip.Prefix
	var err error
	if strings.Contains(addr, "/") {
		p, err = netip.ParsePrefix(addr)
	} else {
		var a netip.Addr
		if a, err = netip.ParseAddr(addr); err == nil {
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
	}
	if err != nil {
		return BulkRule{}, fmt.Errorf("bad bulk rule %q: bad address or CIDR %q; want e.g. 192.0.2.0/24:1094", s, addr)
	}
	if p.Addr().Zone() != "" {
		return BulkRule{}, fmt.Errorf("bad bulk rule %q: zoned address", s)
	}
	r := BulkRule{Name: in, Prefix: netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked()}
	if p.Addr().Is4In6() {
		if p.Bits() < 96 {
			return BulkRule{}, fmt.Errorf("bad bulk rule %q: IPv4-mapped prefix shorter than /96", s)
		}
		r.Prefix = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
	}
	if hasPorts {
		lo, hi, ok := strings.Cut(ports, "-")
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h := l
		var err2 error
		if ok {
			h, err2 = strconv.ParseUint(hi, 10, 16)
		}
		if err1 != nil || err2 != nil || l == 0 || h < l {
			return BulkRule{}, fmt.Errorf("bad bulk rule %q: bad ports %q; want PORT or LO-HI within 1-65535", s, ports)
		}
		r.Lo, r.Hi = uint16(l), uint16(h)
	}
	return r, nil
}

// ParseBulkRules parses a comma-separated list of rules; "" is none.
func ParseBulkRules(list string) ([]BulkRule, error) {
	var out []BulkRule
	for _, f := range strings.Split(list, ",") {
		if strings.TrimSpace(f) == "" {
			continue
		}
		r, err := ParseBulkRule(f)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// Match reports whether a flow of proto with outside end ap matches r.
func (r BulkRule) Match(proto ipproto.Proto, ap netip.AddrPort) bool {
	if !r.Prefix.Contains(ap.Addr().Unmap()) {
		return false
	}
	if r.Lo == 0 {
		return true
	}
	if proto != ProtoTCP && proto != ProtoUDP {
		return false
	}
	return ap.Port() >= r.Lo && ap.Port() <= r.Hi
}

// matchBulk returns the index of the first rule matching, or -1.
func matchBulk(rules []BulkRule, proto ipproto.Proto, ap netip.AddrPort) int {
	for i, r := range rules {
		if r.Match(proto, ap) {
			return i
		}
	}
	return -1
}
