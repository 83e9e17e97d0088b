// SPDX-License-Identifier: MIT

// Package nsexec runs a job command in a fresh unprivileged user, network
// and mount namespace whose only interface is a TUN device, and hands the
// TUN file descriptor back to the calling process, which stays in the host
// network namespace and runs the tunnel on it.
//
// # Theory of operation
//
// [Start] re-executes the current binary (/proc/self/exe), through
// internal/reexec like every helper child of airlock, with
// CLONE_NEWUSER|CLONE_NEWNET|CLONE_NEWNS. It is [Prepare] (start the child,
// which then waits for its settings) and [Job.Setup] (send them, wait for
// the TUN): airlock run calls Prepare before it joins the gateway and
// Setup with the lease's addresses, so that the child's exec and Go
// start-up (a few milliseconds, the second process start of every job)
// overlap the join instead of following it. The caller's uid and gid are mapped
// to themselves, so the job sees its own ids, not root. Because a non-root
// uid loses its capabilities on execve, the re-executed child is given
// CAP_NET_ADMIN and CAP_SYS_ADMIN (of its own user namespace only) as
// ambient capabilities. A SOCK_SEQPACKET socketpair reaches the child as an
// extra file; an environment variable names its descriptor (like
// wireguard-go's WG_TUN_FD) and another names a pipe on which Setup writes
// the namespace settings and the job's environment as JSON
// (reexec.StartDeferred). Until then the child holds Prepare's
// environment, which the user's other processes can read, so the caller
// leaves its credentials out of it. The job's argv follows the child's
// argv[0].
//
// The child starts in [Init], called first thing in main. It reads its
// settings from the pipe (end of file: the parent gave up, it exits), takes
// the job's environment as its own, and
//
//  1. makes every mount private, so nothing it mounts leaks to the host;
//  2. opens /dev/net/tun and creates the TUN (IFF_TUN|IFF_NO_PI|IFF_VNET_HDR,
//     so the parent can enable offloads) with close-on-exec set;
//  3. over netlink sets the address, MTU and link up, brings lo up and adds
//     the default route via the TUN;
//  4. writes resolv.conf to a temporary file, bind-mounts it over
//     /etc/resolv.conf and unlinks the file (the mount keeps it alive);
//  5. sends one message on the socketpair: success with the TUN fd attached
//     (SCM_RIGHTS), or the failed step and its errno, which the parent turns
//     into a specific error that names the fix; then closes its TUN fd;
//  6. blocks until the parent sends one byte ([Job.Run]), clears its ambient
//     capabilities, strips airlock's variables from the environment, looks
//     CMD up in the job's PATH and calls execve. The job keeps the child's
//     PID, so [Job.Signal] reaches it directly and [Job.Wait] reaps it.
//
// The child gets SIGKILL when the parent thread that started it dies
// (PR_SET_PDEATHSIG); execve of CMD keeps that setting because the
// credentials do not change and no capabilities are gained, and because it
// goes through [reexec.Child.Exec]: the setting belongs to the child's first
// thread, the child's Go code may exec from another one, and such an
// execve would drop it.
//
// At Start the parent records the device and inode of the job's network
// namespace (/proc/PID/ns/net). [Job.Cleanup] scans /proc for processes in
// that namespace, kills each with SIGKILL through a pidfd (so a recycled PID
// is never hit), repeats until a scan finds none, and reaps the child.
//
// The job inherits its stdio and any descriptors that the airlock process
// itself inherited without close-on-exec, like any command run by a shell;
// it inherits neither the TUN nor the socketpair.
//
// [Preflight] reads sysctls and checks access to /dev/net/tun as the real
// user, so that a host that cannot run the job says why before anything
// starts.
package nsexec
