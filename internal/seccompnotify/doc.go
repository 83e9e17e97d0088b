// SPDX-License-Identifier: MIT

// Package seccompnotify catches connect(2) of every process of a job with a
// seccomp user-notification filter and hands the job a socket that leads
// into the tunnel (airlock run --mode seccomp; Linux >= 5.9).
//
// # Theory of operation
//
// airlock run re-executes itself as a small shim ([Init]) that installs a
// seccomp filter on its own thread, sends the filter's notification fd to
// the parent over a socket inherited as an extra file, and execs the job.
// The filter is inherited by every child and thread and survives execve,
// so it covers the job's whole process tree, static binaries included —
// nothing in the job can remove it (no_new_privs is set, as unprivileged
// seccomp requires).
//
// The filter ([Filter]) is six classic-BPF instructions: syscalls of the
// native architecture numbered connect go to user space
// (SECCOMP_RET_USER_NOTIF), everything else is allowed. A task that calls
// connect() sleeps until the supervisor ([Serve]) in airlock run answers:
//
//  1. it reads the sockaddr from the task's memory (process_vm_readv) and
//     checks the notification is still valid (the task may have died);
//  2. for addresses that are not IPv4/IPv6 (unix sockets …) it answers
//     "continue": the kernel performs the call as if no filter existed;
//  3. otherwise it fetches a copy of the task's socket (pidfd_getfd) to
//     learn its type, family and O_NONBLOCK, and asks the [Redirector];
//  4. the redirector either declines (continue; e.g. loopback), fails
//     (the errno is returned from connect), or returns a new, already
//     connected loopback socket whose other end is relayed through the
//     tunnel; the supervisor installs it over the job's fd number
//     (SECCOMP_IOCTL_NOTIF_ADDFD with SECCOMP_ADDFD_FLAG_SETFD, an atomic
//     dup2 into the task, keeping FD_CLOEXEC) and answers 0.
//
// The job then reads and writes an ordinary kernel socket; only connect
// goes through the supervisor, the data does not. getpeername() on such a
// socket names the loopback relay, not the real destination.
//
// Limits, stated to the user by airlock run: only connect() is caught, so
// UDP sent with sendto()/sendmsg() to an address on an unconnected socket
// and raw sockets are not redirected; 32-bit (i386, x32) system calls are
// not caught; "continue" is not a security boundary (a job can change the
// address after the check) — it does not need to be, because the compute
// node has no route out anyway: interception is for function, not
// confinement.
package seccompnotify
