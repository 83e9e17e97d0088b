// SPDX-License-Identifier: MIT

package seccompnotify

import (
	"encoding/binary"
	"testing"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompData builds the first 16 bytes of struct seccomp_data. The kernel
// loads its words in host order; x/net/bpf's VM loads big-endian, so the
// words are written big-endian here to give the VM the same values.
func seccompData(nr, arch uint32) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], nr)
	binary.BigEndian.PutUint32(b[offArch:], arch)
	return b
}

func TestFilter(t *testing.T) {
	const arch = unix.AUDIT_ARCH_X86_64
	const connect = 42
	vm, err := bpf.NewVM(Filter(arch, connect))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		nr, arch uint32
		want     uint32
	}{
		{"connect", connect, arch, unix.SECCOMP_RET_USER_NOTIF},
		{"socket", 41, arch, unix.SECCOMP_RET_ALLOW},
		{"sendto", 44, arch, unix.SECCOMP_RET_ALLOW},
		{"x32-connect", connect | 0x40000000, arch, unix.SECCOMP_RET_ALLOW},
		{"i386-socketcall", 102, unix.AUDIT_ARCH_I386, unix.SECCOMP_RET_ALLOW},
		{"i386-nr-42", connect, unix.AUDIT_ARCH_I386, unix.SECCOMP_RET_ALLOW},
	} {
		got, err := vm.Run(seccompData(tc.nr, tc.arch))
		if err != nil {
			t.Fatal(err)
		}
		if uint32(got) != tc.want {
			t.Errorf("%s: got %#x, want %#x", tc.name, got, tc.want)
		}
	}
	if _, err := assemble(Filter(arch, connect)); err != nil {
		t.Fatal(err)
	}
}
