// SPDX-License-Identifier: MIT

package control

// The lease on the wire. In memory a lease holds its addresses as lists
// of either family (Lease.Addresses, Gateways, PublicAddrs, Exposed). On
// the wire, version 2 sends the job's tunnel addresses, the gateway's
// tunnel addresses and the job's egress addresses as the same lists
// ("addresses", "gateways", "public_addrs"), IPv4 first, at most one
// per family. Version 1's per-family fields (leaseV1: address/address6,
// gateway/gateway6, public_addr/public_addr6, exposed/exposed6) are still
// sent beside them, for clients of earlier releases: that is the shim,
// and the one place a field per family remains. Exposures travel only in
// the version-1 fields, split by the family of their public address. A
// client reads the lists when the gateway sent them, else the version-1
// fields (a gateway of an earlier release).

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// leaseFields is Lease without its JSON methods: its fields that are the
// same in both versions, encoded as tagged (the address lists are "-").
type leaseFields Lease

// leaseV1 is the version-1 form of a lease's addresses: a field per
// family. Address and Gateway hold the tunnel's first addresses (IPv4,
// or IPv6 on an IPv6-only tunnel), Address6 and Gateway6 the IPv6 ones
// beside IPv4. PublicAddr is the IPv4 egress address and PublicAddr6
// the IPv6 one; Exposed are the mappings on an IPv4 address, Exposed6
// those on an IPv6 one.
type leaseV1 struct {
	Address     netip.Prefix `json:"address"`
	Gateway     netip.Addr   `json:"gateway"`
	Address6    netip.Prefix `json:"address6,omitzero"`
	Gateway6    netip.Addr   `json:"gateway6,omitzero"`
	PublicAddr  netip.Addr   `json:"public_addr,omitzero"`
	PublicAddr6 netip.Addr   `json:"public_addr6,omitzero"`
	Exposed     []Exposed    `json:"exposed,omitempty"`
	Exposed6    []Exposed    `json:"exposed6,omitempty"`
}

// leaseV2 is the version-2 form of a lease's addresses: lists.
type leaseV2 struct {
	Addresses   []netip.Prefix `json:"addresses,omitempty"`
	Gateways    []netip.Addr   `json:"gateways,omitempty"`
	PublicAddrs []netip.Addr   `json:"public_addrs,omitempty"`
}

// leaseWire is a Lease on the wire: the fields both versions share,
// version 1's per-family fields and version 2's lists.
type leaseWire struct {
	*leaseFields
	leaseV1
	leaseV2
}

// MarshalJSON encodes l with both forms of its addresses. A list that is
// not one address per family is left out of version 2 (the client then
// reads the version-1 fields).
func (l Lease) MarshalJSON() ([]byte, error) {
	f := leaseFields(l)
	w := leaseWire{leaseFields: &f, leaseV1: l.v1()}
	if onePerFamily(l.Addresses, netip.Prefix.Addr) {
		w.leaseV2.Addresses = l.Addresses
	}
	if onePerFamily(l.Gateways, addrOf) {
		w.leaseV2.Gateways = l.Gateways
	}
	if onePerFamily(l.PublicAddrs, addrOf) {
		w.leaseV2.PublicAddrs = l.PublicAddrs
	}
	return json.Marshal(w)
}

// v1 returns l's addresses in the version-1 fields.
func (l Lease) v1() leaseV1 {
	var v leaseV1
	v.Address, v.Address6 = perFamily(l.Addresses, netip.Prefix.Addr)
	v.Gateway, v.Gateway6 = perFamily(l.Gateways, addrOf)
	for _, a := range l.PublicAddrs {
		if a.Is6() {
			v.PublicAddr6 = a
		} else {
			v.PublicAddr = a
		}
	}
	for _, x := range l.Exposed {
		if x.PublicAddr.Is6() {
			v.Exposed6 = append(v.Exposed6, x)
		} else {
			v.Exposed = append(v.Exposed, x)
		}
	}
	return v
}

// perFamily returns the entries of list for the version-1 fields X and
// X6 of the tunnel's addresses: the IPv4 one and the IPv6 one beside it,
// or, without an IPv4 one, the IPv6 one and nothing.
func perFamily[T any](list []T, addr func(T) netip.Addr) (first, v6 T) {
	var v4 T
	has4, has6 := false, false
	for _, x := range list {
		switch {
		case addr(x).Is4() && !has4:
			v4, has4 = x, true
		case addr(x).Is6() && !has6:
			v6, has6 = x, true
		}
	}
	if !has4 {
		var zero T
		return v6, zero
	}
	return v4, v6
}

// UnmarshalJSON decodes a lease of either version.
func (l *Lease) UnmarshalJSON(b []byte) error {
	*l = Lease{}
	w := leaseWire{leaseFields: (*leaseFields)(l)}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	v1, v2 := w.leaseV1, w.leaseV2
	var err error
	// The lists of version 2 if the gateway sent them, else the fields of
	// version 1.
	if l.Addresses, err = fromList("addresses", v2.Addresses, netip.Prefix.Addr); err == nil && len(v2.Addresses) == 0 {
		l.Addresses, err = fromList("address, address6", valid(v1.Address, v1.Address6), netip.Prefix.Addr)
	}
	if err != nil {
		return err
	}
	if l.Gateways, err = fromList("gateways", v2.Gateways, addrOf); err == nil && len(v2.Gateways) == 0 {
		l.Gateways, err = fromList("gateway, gateway6", valid(v1.Gateway, v1.Gateway6), addrOf)
	}
	if err != nil {
		return err
	}
	if l.PublicAddrs, err = fromList("public_addrs", v2.PublicAddrs, addrOf); err == nil && len(v2.PublicAddrs) == 0 {
		l.PublicAddrs, err = fromList("public_addr, public_addr6", valid(v1.PublicAddr, v1.PublicAddr6), addrOf)
	}
	// IPv4 first, whichever field an entry came in.
	l.Exposed = append(v1.Exposed, v1.Exposed6...)
	slices.SortStableFunc(l.Exposed, func(a, b Exposed) int { return cmpBool(a.PublicAddr.Is6(), b.PublicAddr.Is6()) })
	return err
}

// cmpBool orders false before true.
func cmpBool(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// addrOf is an address list's entry's address: itself.
func addrOf(a netip.Addr) netip.Addr { return a }

// valid returns the valid ones of xs, in order.
func valid[T interface{ IsValid() bool }](xs ...T) []T {
	var out []T
	for _, x := range xs {
		if x.IsValid() {
			out = append(out, x)
		}
	}
	return out
}

// fromList returns a list of the wire in Lease's order (IPv4 first), nil
// for an empty one, or an error if it is not valid addresses of at most
// one per family (addr returns an entry's address).
func fromList[T any](name string, list []T, addr func(T) netip.Addr) ([]T, error) {
	if len(list) == 0 {
		return nil, nil
	}
	if !onePerFamily(list, addr) {
		return nil, fmt.Errorf("lease %s %v: want valid addresses, at most one per family", name, list)
	}
	out := slices.Clone(list)
	slices.SortStableFunc(out, func(a, b T) int { return ipfamily.Of(addr(a)).Index - ipfamily.Of(addr(b)).Index })
	return out, nil
}

// onePerFamily reports whether every entry of list has a valid address
// (addr), none IPv4-mapped, and no two of one family.
func onePerFamily[T any](list []T, addr func(T) netip.Addr) bool {
	var seen [ipfamily.N]bool
	for _, x := range list {
		a := addr(x)
		if !a.IsValid() || a.Is4In6() || seen[ipfamily.Of(a).Index] {
			return false
		}
		seen[ipfamily.Of(a).Index] = true
	}
	return true
}
