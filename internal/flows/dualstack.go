// SPDX-License-Identifier: MIT

package flows

import "net/netip"

// AddJobAlias makes the flows of tunnel address alias (a dual-stack job's
// IPv6 address) count as the job's at addr: they are attributed to its
// JobRef, add to its totals and are closed by CloseJob(addr). Records
// keep alias as their source (or destination) and carry addr as JobAddr.
// RemoveJob(addr) drops the alias.
func (t *Table) AddJobAlias(alias, addr netip.Addr) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.aliases == nil {
		t.aliases = make(map[netip.Addr]netip.Addr)
	}
	t.aliases[alias.Unmap()] = addr.Unmap()
}

// canonLocked maps a job-side address to the address its job is
// registered under. t.mu must be held.
func (t *Table) canonLocked(a netip.Addr) netip.Addr {
	if c, ok := t.aliases[a]; ok {
		return c
	}
	return a
}

// removeAliasesLocked drops the aliases of addr. t.mu must be held.
func (t *Table) removeAliasesLocked(addr netip.Addr) {
	for al, a := range t.aliases {
		if a == addr {
			delete(t.aliases, al)
		}
	}
}
