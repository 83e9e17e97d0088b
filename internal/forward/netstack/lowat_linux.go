// SPDX-License-Identifier: MIT

package netstack

import (
	"net"

	"golang.org/x/sys/unix"
)

// relayLowWater is TCP_NOTSENT_LOWAT on the relay's kernel sockets (the
// job's side in the private namespace and the dialled outside one): a
// socket reports itself writable, and splice moves the next chunk into it,
// only while less than this is queued and not yet sent. Without it a bulk
// flow parks megabytes in its send buffer that leave in bursts as the
// window opens, and those bursts queue in front of other jobs' packets
// (the private TUN, the WireGuard device, the node–gateway link); the
// relay needs only enough unsent data to keep the window full between two
// wake-ups. 128 KiB is about 350 µs at 3 Gbit/s.
const relayLowWater = 128 << 10

// setLowWater sets relayLowWater on c if it is a kernel TCP socket (the
// netstack's gonet connections have no such option).
func setLowWater(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	rc.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, relayLowWater)
	})
}
