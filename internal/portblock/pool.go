// SPDX-License-Identifier: MIT

package portblock

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// MaxPoolAddrs bounds the addresses of one egress pool.
const MaxPoolAddrs = 1024

// Pool is the egress plan over one or more public addresses: every
// address has the same port Plan, so the pool holds len(Addrs) ×
// Plan.Blocks() blocks. Block i of the pool is port block i/len(Addrs) of
// address i%len(Addrs): consecutive jobs leave from different addresses.
// An (address, port) names at most one block. The zero value has no
// blocks.
type Pool struct {
	Addrs []netip.Addr
	Plan  Plan
}

// Blocks returns the number of (address, port block) pairs.
func (p Pool) Blocks() int {
	if p.Plan.Size == 0 {
		return 0
	}
	return len(p.Addrs) * p.Plan.Blocks()
}

// Block returns the address and ports of block i, 0 <= i < Blocks().
func (p Pool) Block(i int) (netip.Addr, Range) {
	n := len(p.Addrs)
	return p.Addrs[i%n], p.Plan.Block(i / n)
}

// Run returns the address and ports of the n blocks i, i+len(Addrs), …,
// i+(n-1)×len(Addrs): n consecutive port blocks of one address, as one
// range (internal/lease hands such runs to jobs that ask for more ports
// than a block). The caller keeps the run inside the pool; n < 1 means 1.
func (p Pool) Run(i, n int) (netip.Addr, Range) {
	a, r := p.Block(i)
	if n > 1 {
		r.Hi = uint16(int(r.Lo) + n*p.Plan.Size - 1)
	}
	return a, r
}

// BlocksFor returns how many blocks hold ports ports: ⌈ports/Plan.Size⌉,
// at least 1.
func (p Pool) BlocksFor(ports int) int {
	if p.Plan.Size == 0 || ports <= p.Plan.Size {
		return 1
	}
	return (ports + p.Plan.Size - 1) / p.Plan.Size
}

// BlockOf returns the index of the block holding (addr, port), or -1.
func (p Pool) BlockOf(addr netip.Addr, port uint16) int {
	b := p.Plan.BlockOf(port)
	if b < 0 {
		return -1
	}
	for k, a := range p.Addrs {
		if a == addr.Unmap() {
			return b*len(p.Addrs) + k
		}
	}
	return -1
}

// ParseAddrs parses a comma-separated list of IP addresses and prefixes
// (a prefix stands for its addresses, without the network and broadcast
// addresses of an IPv4 prefix shorter than /31). Duplicates are refused,
// and so are more than MaxPoolAddrs addresses.
func ParseAddrs(s string) ([]netip.Addr, error) {
	var out []netip.Addr
	seen := map[netip.Addr]bool{}
	add := func(a netip.Addr) error {
		a = a.Unmap()
		if seen[a] {
			return fmt.Errorf("address %s given twice", a)
		}
		if len(out) == MaxPoolAddrs {
			return fmt.Errorf("more than %d addresses", MaxPoolAddrs)
		}
		seen[a] = true
		out = append(out, a)
		return nil
	}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("%q: want an IP address or a prefix", f)
			}
			if err := add(a); err != nil {
				return nil, err
			}
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q: want an IP address or a prefix", f)
		}
		p = p.Masked()
		if p.Addr().BitLen()-p.Bits() > 10 {
			return nil, fmt.Errorf("prefix %s: more than %d addresses", p, MaxPoolAddrs)
		}
		first, last := p.Addr(), lastAddr(p)
		if p.Addr().Is4() && p.Bits() < 31 {
			first, last = first.Next(), last.Prev()
		}
		for a := first; a.IsValid() && p.Contains(a); a = a.Next() {
			if err := add(a); err != nil {
				return nil, err
			}
			if a == last {
				break
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no address")
	}
	return out, nil
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}
