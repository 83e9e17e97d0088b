// SPDX-License-Identifier: MIT

package lease

// Remove ends the lease with id without its secret, as an admin does
// (`airlock kick`), and returns it; ErrUnknownLease if there is none.
func (m *Manager) Remove(id string) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.byID[id]
	if !ok {
		return Lease{}, ErrUnknownLease
	}
	m.removeLocked(l)
	return *l, nil
}
