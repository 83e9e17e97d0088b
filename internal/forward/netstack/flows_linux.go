// SPDX-License-Identifier: MIT

package netstack

import (
	"net"
	"sync"

	"golang.org/x/sys/unix"
)

// tcpInfoSegments returns a function that reads the segment counters of
// the kernel socket c (the job's side of a kernel-TCP flow) from TCP_INFO:
// tcpi_segs_in (from the job) and tcpi_segs_out (to it). The kernel counts
// a GRO-merged packet as the segments it merged, so these are the packets
// that crossed the private namespace's TUN. After c is closed it returns
// the last values it read.
func tcpInfoSegments(c *net.TCPConn) func() (out, in uint64) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	var mu sync.Mutex
	var lastIn, lastOut uint64
	return func() (uint64, uint64) {
		mu.Lock()
		defer mu.Unlock()
		var info *unix.TCPInfo
		rc.Control(func(fd uintptr) {
			info, _ = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		})
		if info != nil {
			lastIn, lastOut = uint64(info.Segs_in), uint64(info.Segs_out)
		}
		return lastIn, lastOut
	}
}
