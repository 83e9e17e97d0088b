// SPDX-License-Identifier: MIT

package lease

// ByKey returns the lease held by WireGuard public key pub, live or
// expired but not yet swept.
func (m *Manager) ByKey(pub [32]byte) (Lease, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.byKey[pub]
	if !ok {
		return Lease{}, false
	}
	return *l, true
}

// Count returns the number of leases for which match returns true. match
// is called with the manager's lock held: it must not call the Manager.
func (m *Manager) Count(match func(Lease) bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, l := range m.byID {
		if match(*l) {
			n++
		}
	}
	return n
}
