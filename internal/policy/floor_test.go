// SPDX-License-Identifier: MIT

package policy

import (
	"net/netip"
	"testing"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

// gwTunnel is the tunnel subnet of the tests (the gateway's default).
var gwTunnel = []netip.Prefix{netip.MustParsePrefix("100.64.0.0/16")}

// verdict of a registry entry without any rule: "allow" or the rule that
// denies it.
func noRuleVerdict(a netip.Addr) string {
	v := (&Policy{Default: Allow}).Decide(Flow{Proto: ProtoTCP, Dst: a, Port: 80, Tunnels: gwTunnel})
	if v.Action == Allow {
		return "allow"
	}
	return v.Rule
}

// TestSpecialPurposeRegistries walks every entry of the IANA IPv4 and IPv6
// Special-Purpose Address Registries (as of 2025; iana.org/assignments/
// iana-ipv4-special-registry and iana-ipv6-special-registry) and states
// the verdict a job gets with no config for the entry's first address,
// an address inside it, and its last address. Entries the registry does
// not list (multicast, IPv4-compatible, site-local, the cloud endpoints)
// follow.
func TestSpecialPurposeRegistries(t *testing.T) {
	const (
		allow    = "allow"
		floor    = RuleFloor
		linkl    = RuleLinkLocal
		private  = RulePrivate
		internal = RuleInternal
		metadata = RuleMetadata
	)
	tests := []struct {
		prefix, name string
		// first, mid, last: verdicts for the first address, one inside
		// (prefix address + 1, or the sample given), the last address.
		want       string
		sample     string // optional address to judge as well
		sampleWant string
	}{
		// IPv4 Special-Purpose Address Registry.
		{"0.0.0.0/8", "\"This network\"", floor, "", ""},
		{"0.0.0.0/32", "\"This host on this network\"", floor, "", ""},
		{"10.0.0.0/8", "Private-Use", private, "", ""},
		{"100.64.0.0/10", "Shared Address Space", internal, "100.64.0.1", floor}, // inside: the tunnel subnet
		{"127.0.0.0/8", "Loopback", floor, "", ""},
		{"169.254.0.0/16", "Link Local", linkl, "169.254.169.254", metadata},
		{"172.16.0.0/12", "Private-Use", private, "", ""},
		{"192.0.0.0/24", "IETF Protocol Assignments", internal, "", ""},
		{"192.0.0.0/29", "IPv4 Service Continuity Prefix", internal, "", ""},
		{"192.0.0.8/32", "IPv4 dummy address", internal, "", ""},
		{"192.0.0.9/32", "Port Control Protocol Anycast", internal, "", ""},
		{"192.0.0.10/32", "Traversal Using Relays around NAT Anycast", internal, "", ""},
		{"192.0.0.170/32", "NAT64/DNS64 Discovery", internal, "", ""},
		{"192.0.0.171/32", "NAT64/DNS64 Discovery", internal, "", ""},
		{"192.0.2.0/24", "Documentation (TEST-NET-1)", allow, "", ""},
		{"192.31.196.0/24", "AS112-v4", allow, "", ""},
		{"192.52.193.0/24", "AMT", allow, "", ""},
		{"192.88.99.0/24", "Deprecated (6to4 Relay Anycast)", allow, "", ""},
		{"192.168.0.0/16", "Private-Use", private, "", ""},
		{"192.175.48.0/24", "Direct Delegation AS112 Service", allow, "", ""},
		{"198.18.0.0/15", "Benchmarking", internal, "", ""},
		{"198.51.100.0/24", "Documentation (TEST-NET-2)", allow, "", ""},
		{"203.0.113.0/24", "Documentation (TEST-NET-3)", allow, "", ""},
		{"240.0.0.0/4", "Reserved", internal, "255.255.255.254", internal},
		{"255.255.255.255/32", "Limited Broadcast", floor, "", ""},

		// IPv6 Special-Purpose Address Registry.
		{"::1/128", "Loopback Address", floor, "", ""},
		{"::/128", "Unspecified Address", floor, "", ""},
		{"::ffff:0:0/96", "IPv4-mapped Address", floor, "::ffff:8.8.8.8", allow}, // ::ffff:0.0.0.0 is "this network"
		{"64:ff9b::/96", "IPv4-IPv6 Translat.", floor, "64:ff9b::808:808", allow},
		{"64:ff9b:1::/48", "IPv4-IPv6 Translat.", internal, "64:ff9b:1::a9fe:a9fe", metadata},
		{"100::/64", "Discard-Only Address Block", internal, "", ""},
		{"100:0:0:1::/64", "Dummy IPv6 Prefix", internal, "", ""},
		{"2001::/23", "IETF Protocol Assignments", internal, "2001:5::1", internal},
		{"2001::/32", "TEREDO", floor, "2001:0:4136:e378:8000:63bf:3fff:fdd2", allow}, // 2001:: embeds server 0.0.0.0
		{"2001:1::1/128", "Port Control Protocol Anycast", allow, "", ""},
		{"2001:1::2/128", "Traversal Using Relays around NAT Anycast", allow, "", ""},
		{"2001:1::3/128", "DNS-SD Service Registration Protocol Anycast", allow, "", ""},
		{"2001:2::/48", "Benchmarking", internal, "", ""},
		{"2001:3::/32", "AMT", allow, "", ""},
		{"2001:4:112::/48", "AS112-v6", allow, "", ""},
		{"2001:10::/28", "Deprecated (previously ORCHID)", internal, "", ""},
		{"2001:20::/28", "ORCHIDv2", allow, "", ""},
		{"2001:30::/28", "Drone Remote ID Protocol Entity Tags (DETs) Prefix", allow, "", ""},
		{"2001:db8::/32", "Documentation", allow, "", ""},
		{"2002::/16", "6to4", floor, "2002:808:808::1", allow}, // 2002:: embeds 0.0.0.0
		{"2620:4f:8000::/48", "Direct Delegation AS112 Service", allow, "", ""},
		{"3fff::/20", "Documentation", allow, "", ""},
		{"5f00::/16", "Segment Routing (SRv6) SIDs", internal, "", ""},
		{"fc00::/7", "Unique-Local", private, "fd00:ec2::254", metadata},
		{"fe80::/10", "Link-Local Unicast", linkl, "", ""},

		// Not in the special-purpose registries.
		{"224.0.0.0/4", "IPv4 multicast", floor, "", ""},
		{"ff00::/8", "IPv6 multicast", floor, "", ""},
		{"fec0::/10", "deprecated site-local", internal, "", ""},
		{"168.63.129.16/32", "Azure WireServer", metadata, "", ""},
		{"100.100.100.200/32", "Alibaba Cloud metadata", metadata, "", ""},
		{"169.254.170.2/32", "AWS ECS task metadata", metadata, "", ""},
		{"fd20:ce::254/128", "GCP metadata (IPv6)", metadata, "", ""},
		{"8.8.8.0/24", "global unicast", allow, "", ""},
		{"2a00:1450::/32", "global unicast", allow, "", ""},
	}
	for _, tc := range tests {
		p := netip.MustParsePrefix(tc.prefix)
		first, last := p.Addr(), lastAddr(p)
		got := map[string]string{first.String(): noRuleVerdict(first)}
		fw := tc.want
		switch tc.prefix {
		case "100.64.0.0/10":
			fw = floor // 100.64.0.0 is in the tunnel subnet 100.64.0.0/16
		case "64:ff9b:1::/48":
			fw = floor // embeds 0.0.0.0 in its last 32 bits
		case "2001::/23":
			fw = floor // 2001:: is Teredo with server 0.0.0.0
		}
		want := map[string]string{first.String(): fw}
		if tc.sample != "" {
			s := netip.MustParseAddr(tc.sample)
			got[s.String()], want[s.String()] = noRuleVerdict(s), tc.sampleWant
		}
		// The last address has the entry's verdict, except where the
		// first address embeds 0.0.0.0 (floor) and the last one
		// 255.255.255.255 or other space.
		lw := tc.want
		switch tc.prefix {
		case "::ffff:0:0/96", "64:ff9b::/96":
			lw = floor // 255.255.255.255
		case "2001::/32":
			lw = floor // server 0.255.255.255 (this network)
		case "2002::/16":
			lw = floor // 255.255.255.255
		case "240.0.0.0/4":
			lw = floor // 255.255.255.255
		case "64:ff9b:1::/48":
			lw = floor // 255.255.255.255 in the last 32 bits
		case "::1/128", "::/128":
		}
		got[last.String()], want[last.String()] = noRuleVerdict(last), lw
		for a, w := range want {
			if got[a] != w {
				t.Errorf("%s %s: %s: got %s, want %s", tc.prefix, tc.name, a, got[a], w)
			}
		}
	}
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// TestEmbeddedIPv4 checks that IPv6 forms of protected IPv4 addresses are
// judged by the IPv4 address, and that only an allow rule naming the
// IPv6 image of the protected range opens them.
func TestEmbeddedIPv4(t *testing.T) {
	a := netip.MustParseAddr

	for _, tc := range []struct {
		dst  string
		want string
	}{
		{"64:ff9b::a9fe:a9fe", RuleMetadata},           // NAT64 of 169.254.169.254
		{"64:ff9b::a9fe:101", RuleLinkLocal},           // 169.254.1.1
		{"64:ff9b::a00:1", RulePrivate},                // 10.0.0.1
		{"64:ff9b::6464:64c8", RuleMetadata},           // 100.100.100.200
		{"64:ff9b::647f:1", RuleInternal},              // 100.127.0.1
		{"64:ff9b::c000:1", RuleInternal},              // 192.0.0.1
		{"64:ff9b::7f00:1", RuleFloor},                 // 127.0.0.1
		{"64:ff9b::6440:1", RuleFloor},                 // 100.64.0.1, the tunnel subnet
		{"64:ff9b:1:2:3:4:a9fe:a9fe", RuleMetadata},    // local-use NAT64
		{"::a9fe:a9fe", RuleMetadata},                  // IPv4-compatible
		{"::ffff:169.254.169.254", RuleMetadata},       // IPv4-mapped
		{"2002:a9fe:a9fe::1", RuleMetadata},            // 6to4
		{"2002:a00:1::1", RulePrivate},                 // 6to4 of 10.0.0.1
		{"2001:0:a9fe:a9fe::f7f7:f7f7", RuleMetadata},  // Teredo server 169.254.169.254, client 8.8.8.8
		{"2001:0:808:808:0:0:5601:5601", RuleMetadata}, // Teredo client ~0x56015601 = 169.254.169.254
		{"2001:0:808:808:0:0:f5ff:fffe", RulePrivate},  // client 10.0.0.1
		{"64:ff9b::808:808", "allow"},                  // 8.8.8.8
	} {
		if got := noRuleVerdict(a(tc.dst)); got != tc.want {
			t.Errorf("%s: got %s, want %s", tc.dst, got, tc.want)
		}
	}

	// Which allow rules open 64:ff9b::a9fe:a9fe.
	for _, tc := range []struct {
		to   string
		want Action
	}{
		{"64:ff9b::a9fe:a9fe/128", Allow},
		{"64:ff9b::a9fe:a900/120", Deny}, // names link-local, not the metadata endpoint
		{"64:ff9b::/96", Deny},
		{"::/0", Deny},
		{"169.254.169.254/32", Deny}, // the IPv4 rule does not match the IPv6 form
	} {
		p := &Policy{Rules: []Rule{{Name: "r", Action: Allow, To: pfx(tc.to)}}}
		if got := p.Decide(Flow{Proto: ProtoTCP, Dst: a("64:ff9b::a9fe:a9fe"), Port: 80, Tunnels: gwTunnel}); got.Action != tc.want {
			t.Errorf("allow %s: 64:ff9b::a9fe:a9fe got %+v, want %v", tc.to, got, tc.want)
		}
	}
}

// TestNamingOpens checks the new protected ranges open only for an allow
// rule that names them, and that the tunnel subnet never opens.
func TestNamingOpens(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		to, dst string
		want    Verdict
	}{
		{"100.64.0.0/10", "100.100.0.1", Verdict{Allow, "r"}},
		{"100.64.0.0/10", "100.100.100.200", Verdict{Deny, RuleMetadata}}, // the metadata endpoint needs its own name
		{"100.100.100.200/32", "100.100.100.200", Verdict{Allow, "r"}},
		{"100.64.0.0/10", "100.64.0.7", Verdict{Deny, RuleFloor}}, // another job in the tunnel subnet
		{"100.64.0.0/16", "100.64.0.1", Verdict{Deny, RuleFloor}},
		{"0.0.0.0/0", "100.100.0.1", Verdict{Deny, RuleInternal}},
		{"192.0.0.0/24", "192.0.0.170", Verdict{Allow, "r"}},
		{"192.0.0.0/16", "192.0.0.170", Verdict{Deny, RuleInternal}},
		{"168.63.129.16/32", "168.63.129.16", Verdict{Allow, "r"}},
		{"168.63.0.0/16", "168.63.129.16", Verdict{Deny, RuleMetadata}},
		{"169.254.0.0/16", "169.254.169.254", Verdict{Deny, RuleMetadata}},
		{"169.254.0.0/16", "169.254.1.1", Verdict{Allow, "r"}},
	} {
		p := &Policy{Default: Allow, Rules: []Rule{{Name: "r", Action: Allow, To: pfx(tc.to)}}}
		if got := p.Decide(Flow{Proto: ProtoUDP, Dst: a(tc.dst), Port: 53, Tunnels: gwTunnel}); got != tc.want {
			t.Errorf("allow %s, dst %s: got %+v, want %+v", tc.to, tc.dst, got, tc.want)
		}
	}
}

func TestBuiltinAllocs(t *testing.T) {
	dst := netip.MustParseAddr("2001:0:808:808:0:0:f5ff:fffe")
	if n := testing.AllocsPerRun(100, func() { Builtin(dst, gwTunnel, false) }); n != 0 {
		t.Errorf("Builtin allocates %v times", n)
	}
}

// TestEmbeddingsList checks that Embeddings lists exactly the forms that
// Embedded recognises: every address built from an entry embeds the IPv4
// address at the entry's offset.
func TestEmbeddingsList(t *testing.T) {
	v4 := netip.MustParseAddr("192.0.2.77")
	for _, e := range Embeddings() {
		b := e.Prefix.Addr().As16()
		a4 := v4.As4()
		for i := 0; i < 4; i++ {
			x := a4[i]
			if e.Inverted {
				x ^= 0xff
			}
			b[e.Off/8+i] = x
		}
		a := netip.AddrFrom16(b)
		if !e.Prefix.Contains(a) {
			t.Fatalf("%s: built %v outside %v", e.Name, a, e.Prefix)
		}
		got, off, n := Embedded(a)
		found := false
		for i := 0; i < n; i++ {
			found = found || got[i] == v4 && off[i] == e.Off
		}
		if !found {
			t.Errorf("%s: Embedded(%v) = %v at %v (%d), want %v at %d", e.Name, a, got, off, n, v4, e.Off)
		}
	}
}

// TestDecideTunnels: the floor closes the IPv6 tunnel prefix like the IPv4
// one, even under an allow rule that names it; IPv6 rules decide IPv6
// flows.
func TestDecideTunnels(t *testing.T) {
	p := &Policy{Rules: []Rule{
		{Name: "ula", Action: Allow, To: []netip.Prefix{netip.MustParsePrefix("fd00::/8")}},
		{Name: "no-v6-ssh", Action: Deny, To: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}, Proto: ProtoTCP, Ports: []portblock.Range{{Lo: 22, Hi: 22}}},
	}}
	tun6 := netip.MustParsePrefix("fd12:3456:789a::/48")
	for _, tc := range []struct {
		dst  string
		port uint16
		want Verdict
	}{
		{"fd12:3456:789a::6440:2", 80, Verdict{Deny, RuleFloor}},
		{"fd99::1", 80, Verdict{Allow, "ula"}},
		{"2001:db8::5", 22, Verdict{Deny, "no-v6-ssh"}},
		{"2001:db8::5", 443, Verdict{Allow, RuleDefault}},
	} {
		got := p.Decide(Flow{Proto: ProtoTCP, Dst: netip.MustParseAddr(tc.dst), Port: tc.port, Tunnels: []netip.Prefix{netip.MustParsePrefix("100.64.0.0/16"), tun6}})
		if got != tc.want {
			t.Errorf("Decide(%s:%d) = %v, want %v", tc.dst, tc.port, got, tc.want)
		}
	}
}
