// SPDX-License-Identifier: MIT

package control

// The lease on the wire, version 2: the job's tunnel addresses, the
// gateway's tunnel addresses and the job's egress addresses travel as
// lists of either family ("addresses", "gateways", "public_addrs"), the
// first entry the one the gateway allocates (IPv4 on a dual-stack
// tunnel; IPv6 on an IPv6-only one), at most one per family. The
// per-family fields of version 1 (address/address6, gateway/gateway6,
// public_addr/public_addr6) are still sent beside them, for clients of
// earlier releases: that is the shim, and the one place they remain. A
// client reads the lists when the gateway sent them, else the version-1
// fields (a gateway of an earlier release).

import (
	"encoding/json"
	"fmt"
	"net/netip"
)

// leaseV1 is Lease without its JSON methods: the version-1 fields, and
// every field added later, encoded as tagged.
type leaseV1 Lease

// leaseWire is a Lease on the wire: version 1's fields and version 2's
// lists.
type leaseWire struct {
	*leaseV1
	Addresses   []netip.Prefix `json:"addresses,omitempty"`
	Gateways    []netip.Addr   `json:"gateways,omitempty"`
	PublicAddrs []netip.Addr   `json:"public_addrs,omitempty"`
}

// MarshalJSON encodes l with both forms of its addresses. A list that
// would not decode back to the same fields (an IPv6 egress address in the
// IPv4 slot of version 1) is left out: the client then reads the fields.
func (l Lease) MarshalJSON() ([]byte, error) {
	v1 := leaseV1(l)
	w := leaseWire{leaseV1: &v1}
	w.Addresses = prefixListOf(l.Address, l.Address6)
	is4 := l.Address.Addr().Is4()
	w.Gateways = listOf(is4, l.Gateway, l.Gateway6)
	w.PublicAddrs = listOf(is4, l.PublicAddr, l.PublicAddr6)
	return json.Marshal(w)
}

// UnmarshalJSON decodes a lease of either version.
func (l *Lease) UnmarshalJSON(b []byte) error {
	*l = Lease{}
	w := leaseWire{leaseV1: (*leaseV1)(l)}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	if len(w.Addresses) > 0 {
		var err error
		if l.Address, l.Address6, err = prefixesFromList(w.Addresses); err != nil {
			return err
		}
	}
	is4 := l.Address.Addr().Is4()
	if err := fromList("gateways", w.Gateways, is4, &l.Gateway, &l.Gateway6); err != nil {
		return err
	}
	return fromList("public_addrs", w.PublicAddrs, is4, &l.PublicAddr, &l.PublicAddr6)
}

// prefixesFromList returns the tunnel addresses of a version-2 list: the
// IPv4 one (or the one IPv6 one of an IPv6-only tunnel) and the IPv6 one
// beside an IPv4 one.
func prefixesFromList(list []netip.Prefix) (primary, v6 netip.Prefix, err error) {
	for _, p := range list {
		slot := &primary
		if p.Addr().Is6() && (len(list) == 2) {
			slot = &v6
		}
		if !p.IsValid() || p.Addr().Is4In6() || slot.IsValid() || len(list) > 2 {
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("lease addresses %v: want valid prefixes, at most one per family", list)
		}
		*slot = p
	}
	return primary, v6, nil
}

// prefixListOf returns the version-2 list of the tunnel addresses, or nil
// if prefixesFromList would not read it back into the same fields.
func prefixListOf(primary, v6 netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range []netip.Prefix{primary, v6} {
		if p.IsValid() {
			out = append(out, p)
		}
	}
	if p, s, err := prefixesFromList(out); err != nil || p != primary || s != v6 {
		return nil
	}
	return out
}

// fromList sets *primary and *v6 from a version-2 list, if there is one:
// an IPv6 entry beside a lease whose tunnel is IPv4 (is4) is the IPv6
// one, any other entry the primary one.
func fromList(name string, list []netip.Addr, is4 bool, primary, v6 *netip.Addr) error {
	if len(list) == 0 {
		return nil
	}
	*primary, *v6 = netip.Addr{}, netip.Addr{}
	for _, a := range list {
		slot := primary
		if is4 && a.Is6() {
			slot = v6
		}
		if !a.IsValid() || a.Is4In6() || slot.IsValid() {
			return fmt.Errorf("lease %s: %v: want valid addresses, at most one per family", name, list)
		}
		*slot = a
	}
	return nil
}

// listOf returns the version-2 list of primary and v6 (the valid ones),
// or nil if fromList would not read it back into the same fields.
func listOf(is4 bool, primary, v6 netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, a := range []netip.Addr{primary, v6} {
		if a.IsValid() {
			out = append(out, a)
		}
	}
	var p, s netip.Addr
	if fromList("", out, is4, &p, &s) != nil || p != primary || s != v6 {
		return nil
	}
	return out
}
