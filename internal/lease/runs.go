// SPDX-License-Identifier: MIT

package lease

// Runs of port blocks: a job may hold several blocks (a data mover asks
// for 1,024 ports where the gateway's block is 256). The blocks of one
// job are a run b, b+stride, …, b+(n-1)×stride: with an egress pool of k
// addresses the gateway makes stride k, so that the run is n consecutive
// port blocks of one address (portblock.Pool numbers block i as port block
// i/k of address i%k) and its ports one contiguous range. A run never
// wraps past the last block. A lease stores only its first block and its
// length, so attribution (one range per lease) and restore stay exact.

// run returns the block indices l holds, nil if none.
func (m *Manager) run(l Lease) []int {
	if l.Block < 0 {
		return nil
	}
	n := max(l.Blocks, 1)
	out := make([]int, n)
	for j := range out {
		out[j] = l.Block + j*m.stride
	}
	return out
}

// runExistsLocked reports whether l's blocks all exist (or, without
// blocks, whether the Manager hands out none).
func (m *Manager) runExistsLocked(l Lease) bool {
	if m.blocks == 0 || l.Block < 0 {
		return m.blocks == 0 && l.Block < 0
	}
	n := max(l.Blocks, 1)
	return l.Blocks >= 0 && l.Block+(n-1)*m.stride < m.blocks
}

// runFreeLocked reports whether the n blocks of the run from b are free;
// b < 0 (no block) is free.
func (m *Manager) runFreeLocked(b, n int) bool {
	if b < 0 {
		return true
	}
	for j := 0; j < n; j++ {
		if m.byBlock[b+j*m.stride] != nil {
			return false
		}
	}
	return true
}

// holdRunLocked marks l's blocks as held by l.
func (m *Manager) holdRunLocked(l *Lease) {
	for _, b := range m.run(*l) {
		m.byBlock[b] = l
	}
}

// findFreeRunLocked finds the first run of n free blocks, searching from
// after the last block handed out so that a freed block is reused as late
// as possible (like findFreeLocked for addresses).
func (m *Manager) findFreeRunLocked(n int) (int, bool) {
	last := m.blocks - (n-1)*m.stride // a run must start below last
	if last <= 0 {
		return -1, false
	}
	for i := 0; i < m.blocks; i++ {
		b := (m.nextBlock + i) % m.blocks
		if b < last && m.runFreeLocked(b, n) {
			m.nextBlock = (b + 1) % m.blocks
			return b, true
		}
	}
	return -1, false
}

// BlocksUsed returns how many port blocks live leases hold.
func (m *Manager) BlocksUsed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.byBlock)
}
