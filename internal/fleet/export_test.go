// SPDX-License-Identifier: MIT

package fleet

// Work returns how many reloads and kick queries notifications and the
// resync ticker have caused.
func (n *Node) Work() int64 { return n.work.Load() }
