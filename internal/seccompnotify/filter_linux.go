// SPDX-License-Identifier: MIT

package seccompnotify

import (
	"fmt"
	"runtime"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Offsets in struct seccomp_data.
const (
	offNr   = 0
	offArch = 4
)

// nativeArch is the AUDIT_ARCH_* value of the running architecture.
func nativeArch() (uint32, error) {
	switch runtime.GOARCH {
	case "amd64":
		return unix.AUDIT_ARCH_X86_64, nil
	case "arm64":
		return unix.AUDIT_ARCH_AARCH64, nil
	}
	return 0, fmt.Errorf("%w: architecture %s is not supported", ErrUnavailable, runtime.GOARCH)
}

// Filter returns the classic-BPF program of the filter: connect(2) of arch
// (an AUDIT_ARCH_* value) with syscall number nr is sent to the
// supervisor, every other call is allowed:
//
//	0: ld  [4]                  ; seccomp_data.arch
//	1: jeq #arch, 2, 5          ; another ABI (i386 on x86-64): allow
//	2: ld  [0]                  ; seccomp_data.nr
//	3: jeq #nr, 4, 5            ; x32 numbers have bit 30 set: allow
//	4: ret #SECCOMP_RET_USER_NOTIF
//	5: ret #SECCOMP_RET_ALLOW
func Filter(arch, nr uint32) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arch, SkipFalse: 3},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: nr, SkipFalse: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_USER_NOTIF},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
	}
}

// assemble turns a program into the kernel's sock_filter array.
func assemble(prog []bpf.Instruction) ([]unix.SockFilter, error) {
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp filter: %w", err)
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out, nil
}
