// SPDX-License-Identifier: MIT

package impair

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DisableOffloads turns off transmit checksum offload, TSO, GSO and GRO on
// interface ifname of the current network namespace (ethtool -K IF tx off
// tso off gso off gro off, through the legacy ethtool ioctls), so that
// every frame it sends is one wire packet with a complete checksum: what a
// relay that drops single packets needs to see.
func DisableOffloads(ifname string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("disable offloads on %s: %w", ifname, err)
	}
	defer unix.Close(fd)
	for _, c := range []struct {
		cmd  uint32
		name string
	}{
		{unix.ETHTOOL_STSO, "tso"},
		{unix.ETHTOOL_SGSO, "gso"},
		{unix.ETHTOOL_SGRO, "gro"},
		{unix.ETHTOOL_STXCSUM, "tx"},
	} {
		if err := ethtoolSet(fd, ifname, c.cmd, 0); err != nil {
			return fmt.Errorf("disable offloads on %s: %s off: %w", ifname, c.name, err)
		}
	}
	return nil
}

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd, data uint32
}

// ifreqData is struct ifreq with ifr_data.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [24 - unsafe.Sizeof(uintptr(0))]byte
}

func ethtoolSet(fd int, ifname string, cmd, v uint32) error {
	if len(ifname) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q too long", ifname)
	}
	val := ethtoolValue{cmd: cmd, data: v}
	var ifr ifreqData
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(&val)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	if errno != 0 {
		return errno
	}
	return nil
}
