// SPDX-License-Identifier: MIT

package capture

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode"

	"github.com/airlock-vpn/airlock/internal/policy"
)

// Filter selects packets by a small subset of the pcap-filter language
// (tcpdump's expressions). Supported:
//
//	tcp | udp | icmp | ip | ip6            protocol (icmp includes ICMPv6)
//	[src|dst] host ADDR                     IPv4 or IPv6 address
//	[src|dst] net CIDR                      prefix, e.g. 192.0.2.0/24
//	[src|dst] port N                        TCP or UDP port
//	[src|dst] portrange N-M
//	tcp port 80, udp dst port 53, …         protocol, then a port primitive
//	not X | X and Y | X or Y | ( X )        also !, &&, ||
//
// "and" binds tighter than "or". Host names, byte offsets, "greater",
// "less" and everything else of pcap-filter are refused. The zero Filter
// and a nil *Filter match every packet. A Filter is immutable and safe for
// concurrent use; Match allocates nothing.
type Filter struct {
	root *node
	src  string
}

// node kinds.
const (
	nAnd = iota
	nOr
	nNot
	nProto  // proto: famIPv4, famIPv6, or an IP protocol number
	nNet    // dir, prefix
	nPort   // dir, lo, hi
	nRemote // rules: the packet's remote end matches one of them
)

// directions of host, net and port.
const (
	dirAny = iota
	dirSrc
	dirDst
)

type node struct {
	kind   int
	a, b   *node
	proto  uint8
	dir    int
	prefix netip.Prefix
	lo, hi uint16
	rules  []policy.Rule
}

// ParseFilter parses a filter expression; "" matches every packet.
func ParseFilter(s string) (*Filter, error) {
	if len(s) > 1024 {
		return nil, fmt.Errorf("filter longer than 1024 bytes")
	}
	toks, err := lex(s)
	if err != nil {
		return nil, err
	}
	f := &Filter{src: s}
	if len(toks) == 0 {
		return f, nil
	}
	p := &parser{toks: toks}
	n, err := p.or()
	if err != nil {
		return nil, fmt.Errorf("filter %q: %w", s, err)
	}
	if p.i < len(p.toks) {
		return nil, fmt.Errorf("filter %q: unexpected %q", s, p.toks[p.i])
	}
	f.root = n
	return f, nil
}

// String returns the expression as given.
func (f *Filter) String() string {
	if f == nil {
		return ""
	}
	return f.src
}

// WithRules returns a filter that also requires the packet's remote end
// (the destination of a packet a job sent, the source of one to a job) to
// match one of rules' destinations: prefixes, protocol and ports, as the
// egress policy matches them (tokens and action are ignored). No rules
// returns f.
func (f *Filter) WithRules(rules []policy.Rule) *Filter {
	if len(rules) == 0 {
		return f
	}
	r := &node{kind: nRemote, rules: rules}
	out := &Filter{src: f.String(), root: r}
	if f != nil && f.root != nil {
		out.root = &node{kind: nAnd, a: f.root, b: r}
	}
	return out
}

// matchPacket reports whether f selects p.
func (f *Filter) matchPacket(p *packet) bool {
	if f == nil || f.root == nil {
		return true
	}
	return f.root.match(p)
}

// Match reports whether f selects the IP packet b sent by a job (out) or
// to one.
func (f *Filter) Match(b []byte, out bool) bool {
	var p packet
	if !p.parse(b, out) {
		return f == nil || f.root == nil
	}
	return f.matchPacket(&p)
}

func (n *node) match(p *packet) bool {
	switch n.kind {
	case nAnd:
		return n.a.match(p) && n.b.match(p)
	case nOr:
		return n.a.match(p) || n.b.match(p)
	case nNot:
		return !n.a.match(p)
	case nProto:
		switch n.proto {
		case famIPv4:
			return p.src.Is4()
		case famIPv6:
			return p.src.Is6()
		case protoICMP:
			return p.proto == protoICMP || p.proto == protoICMPv6
		}
		return p.proto == n.proto
	case nNet:
		switch n.dir {
		case dirSrc:
			return n.prefix.Contains(p.src)
		case dirDst:
			return n.prefix.Contains(p.dst)
		}
		return n.prefix.Contains(p.src) || n.prefix.Contains(p.dst)
	case nPort:
		if !p.ports {
			return false
		}
		in := func(v uint16) bool { return v >= n.lo && v <= n.hi }
		switch n.dir {
		case dirSrc:
			return in(p.sport)
		case dirDst:
			return in(p.dport)
		}
		return in(p.sport) || in(p.dport)
	case nRemote:
		addr, port := p.remote()
		for i := range n.rules {
			if ruleMatches(&n.rules[i], addr, p.proto, port, p.ports) {
				return true
			}
		}
	}
	return false
}

// ruleMatches reports whether a packet with remote end addr:port and IP
// protocol proto is inside r's destinations.
func ruleMatches(r *policy.Rule, addr netip.Addr, proto uint8, port uint16, hasPort bool) bool {
	switch r.Proto {
	case policy.ProtoTCP:
		if proto != protoTCP {
			return false
		}
	case policy.ProtoUDP:
		if proto != protoUDP {
			return false
		}
	case policy.ProtoICMP:
		if proto != protoICMP && proto != protoICMPv6 {
			return false
		}
	}
	if len(r.Ports) > 0 {
		if !hasPort {
			return false
		}
		ok := false
		for _, pr := range r.Ports {
			if pr.Contains(port) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(r.To) == 0 {
		return true
	}
	for _, pf := range r.To {
		if pf.Contains(addr) {
			return true
		}
	}
	return false
}

// lex splits s into words and the operators ( ) ! && ||.
func lex(s string) ([]string, error) {
	var toks []string
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			i++
		case c == '(' || c == ')' || c == '!':
			toks = append(toks, s[i:i+1])
			i++
		case strings.HasPrefix(s[i:], "&&"), strings.HasPrefix(s[i:], "||"):
			toks = append(toks, s[i:i+2])
			i += 2
		case c < 0x80 && (unicode.IsLetter(rune(c)) || unicode.IsDigit(rune(c)) || strings.IndexByte(".:/-_", c) >= 0):
			j := i
			for j < len(s) && s[j] < 0x80 && (unicode.IsLetter(rune(s[j])) || unicode.IsDigit(rune(s[j])) || strings.IndexByte(".:/-_", s[j]) >= 0) {
				j++
			}
			toks = append(toks, strings.ToLower(s[i:j]))
			i = j
		default:
			return nil, fmt.Errorf("filter: unexpected character %q at %d", c, i)
		}
	}
	return toks, nil
}

type parser struct {
	toks []string
	i    int
}

func (p *parser) peek() string {
	if p.i < len(p.toks) {
		return p.toks[p.i]
	}
	return ""
}

func (p *parser) next() string {
	t := p.peek()
	if p.i < len(p.toks) {
		p.i++
	}
	return t
}

func (p *parser) or() (*node, error) {
	n, err := p.and()
	if err != nil {
		return nil, err
	}
	for t := p.peek(); t == "or" || t == "||"; t = p.peek() {
		p.next()
		m, err := p.and()
		if err != nil {
			return nil, err
		}
		n = &node{kind: nOr, a: n, b: m}
	}
	return n, nil
}

func (p *parser) and() (*node, error) {
	n, err := p.unary()
	if err != nil {
		return nil, err
	}
	for t := p.peek(); t == "and" || t == "&&"; t = p.peek() {
		p.next()
		m, err := p.unary()
		if err != nil {
			return nil, err
		}
		n = &node{kind: nAnd, a: n, b: m}
	}
	return n, nil
}

func (p *parser) unary() (*node, error) {
	switch t := p.peek(); t {
	case "not", "!":
		p.next()
		n, err := p.unary()
		if err != nil {
			return nil, err
		}
		return &node{kind: nNot, a: n}, nil
	case "(":
		p.next()
		n, err := p.or()
		if err != nil {
			return nil, err
		}
		if p.next() != ")" {
			return nil, fmt.Errorf("missing )")
		}
		return n, nil
	case "":
		return nil, fmt.Errorf("expression ends too early")
	}
	return p.primitive()
}

// Pseudo protocol numbers of nProto for "ip" and "ip6" (IANA's 254 and
// 255 never appear in the filter's packets).
const (
	famIPv4 = 254
	famIPv6 = 255
)

var protoNames = map[string]uint8{"ip": famIPv4, "ip6": famIPv6, "tcp": protoTCP, "udp": protoUDP, "icmp": protoICMP, "icmp6": protoICMP}

func (p *parser) primitive() (*node, error) {
	t := p.next()
	if pr, ok := protoNames[t]; ok {
		n := &node{kind: nProto, proto: pr}
		// "tcp port 80" is "tcp and port 80".
		switch p.peek() {
		case "src", "dst", "port", "portrange", "host", "net":
			m, err := p.primitive()
			if err != nil {
				return nil, err
			}
			return &node{kind: nAnd, a: n, b: m}, nil
		}
		return n, nil
	}
	dir := dirAny
	switch t {
	case "src":
		dir, t = dirSrc, p.next()
	case "dst":
		dir, t = dirDst, p.next()
	}
	if t == "src" || t == "dst" {
		return nil, fmt.Errorf("%q after a direction: write \"host\", \"net\" or \"port\" (src or dst is supported, not both)", t)
	}
	arg := p.next()
	if arg == "" {
		return nil, fmt.Errorf("%q needs an argument", t)
	}
	switch t {
	case "host":
		a, err := netip.ParseAddr(arg)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("host %q: want an IPv4 or IPv6 address (names are not resolved)", arg)
		}
		return &node{kind: nNet, dir: dir, prefix: netip.PrefixFrom(a, a.BitLen())}, nil
	case "net":
		pf, err := netip.ParsePrefix(arg)
		if err != nil {
			return nil, fmt.Errorf("net %q: want a prefix such as 192.0.2.0/24", arg)
		}
		return &node{kind: nNet, dir: dir, prefix: pf.Masked()}, nil
	case "port":
		v, err := strconv.ParseUint(arg, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("port %q: want a number 0-65535 (service names are not looked up)", arg)
		}
		return &node{kind: nPort, dir: dir, lo: uint16(v), hi: uint16(v)}, nil
	case "portrange":
		lo, hi, ok := strings.Cut(arg, "-")
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h, err2 := strconv.ParseUint(hi, 10, 16)
		if !ok || err1 != nil || err2 != nil || l > h {
			return nil, fmt.Errorf("portrange %q: want N-M with N <= M", arg)
		}
		return &node{kind: nPort, dir: dir, lo: uint16(l), hi: uint16(h)}, nil
	}
	return nil, fmt.Errorf("%q is not supported: use tcp, udp, icmp, ip, ip6, [src|dst] host|net|port|portrange, and, or, not, ( )", t)
}
