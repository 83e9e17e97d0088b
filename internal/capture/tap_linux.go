// SPDX-License-Identifier: MIT

package capture

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openTAP attaches to the existing TAP device name (made by the admin,
// e.g. `ip tuntap add NAME mode tap user GATEWAYUSER`).
func openTAP(name string) (*tapWriter, error) {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/net/tun: %w", err)
	}
	var ifr [unix.IFNAMSIZ + 64]byte
	copy(ifr[:unix.IFNAMSIZ-1], name)
	*(*uint16)(unsafe.Pointer(&ifr[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&ifr[0]))); errno != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("attach to tap device %q: %w (make it with: ip tuntap add %s mode tap user GATEWAYUSER; ip link set %s up)", name, errno, name, name)
	}
	return &tapWriter{f: os.NewFile(uintptr(fd), "/dev/net/tun:"+name), skip: globalHeaderLen}, nil
}
