// SPDX-License-Identifier: MIT

package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// noUserNS runs args with user namespaces unavailable to it and to all its
// descendants, as on a hardened site: a seccomp filter (which nothing
// under it can remove) makes unshare(2) and clone(2) with CLONE_NEWUSER
// fail with EPERM, the error of kernel.unprivileged_userns_clone=0 or an
// AppArmor userns restriction, and clone3(2), whose flags a filter cannot
// read, fail with ENOSYS, so that libc and Go fall back to clone(2). It
// changes nothing outside the process tree, so nothing needs restoring.
//
// With -noseccomp first, seccomp(2) fails with ENOSYS too, as on a kernel
// built without seccomp: airlock run's seccomp mode is then unavailable.
func noUserNS(args []string) error {
	noSeccomp := len(args) > 0 && args[0] == "-noseccomp"
	if noSeccomp {
		args = args[1:]
	}
	if len(args) == 0 {
		return fmt.Errorf("usage: nouserns [-noseccomp] CMD [ARGS...]")
	}
	var arch uint32
	switch runtime.GOARCH {
	case "amd64":
		arch = unix.AUDIT_ARCH_X86_64
	case "arm64":
		arch = unix.AUDIT_ARCH_AARCH64
	default:
		return fmt.Errorf("nouserns: unsupported architecture %s", runtime.GOARCH)
	}
	const (
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
		allow  = unix.SECCOMP_RET_ALLOW
	)
	seccompNr := uint32(unix.SYS_SECCOMP)
	if !noSeccomp {
		seccompNr = 0xffffffff // no such syscall
	}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arch, SkipFalse: 9},
		bpf.LoadAbsolute{Off: 0, Size: 4}, // nr
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_CLONE3, SkipTrue: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: seccompNr, SkipFalse: 1},
		bpf.RetConstant{Val: enosys},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_CLONE, SkipTrue: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.SYS_UNSHARE, SkipFalse: 3},
		bpf.LoadAbsolute{Off: 16, Size: 4}, // low word of args[0]: the flags
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: unix.CLONE_NEWUSER, SkipFalse: 1},
		bpf.RetConstant{Val: eperm},
		bpf.RetConstant{Val: allow},
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if _, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	return syscall.Exec(path, args, os.Environ())
}
