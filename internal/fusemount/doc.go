// SPDX-License-Identifier: MIT

// Package fusemount lets a job inside airlock run mount FUSE file systems
// (squashfuse, sshfs, cvmfsexec) the way it does on the bare node: through
// fusermount3.
//
// # Theory of operation
//
// On the node, libfuse runs the setuid-root fusermount3, which opens
// /dev/fuse, mounts it on the job's directory after checking that the user
// may write there, and passes the /dev/fuse descriptor back over the
// socket that the environment variable _FUSE_COMMFD names (one byte with
// the descriptor attached, SCM_RIGHTS). Inside the job's user namespace a
// setuid-root binary is powerless (root of the host is not mapped there),
// so fusermount3 fails with "mount failed: Operation not permitted".
//
// Yet the kernel allows FUSE mounts (since Linux 4.18) to a process with
// CAP_SYS_ADMIN in the user namespace that owns the mount namespace: the
// job's namespace child has it until it execs the job. So, before that
// exec, the namespace child (internal/nsexec):
//
//  1. bind-mounts the airlock binary over fusermount3 and fusermount (in
//     the job's private mount namespace only; libfuse runs the absolute
//     path first, a shell finds the same file on PATH);
//  2. starts the mount server, a re-executed airlock that keeps
//     CAP_SYS_ADMIN of the job's user namespace and nothing else, as a
//     sibling of the job (CLONE_PARENT: the job never sees it as a child
//     to wait for), listening on an abstract unix socket. Abstract sockets
//     belong to the network namespace, and the job's is private: only the
//     job's own processes can connect.
//
// Run as fusermount3 or fusermount ([Main] looks at argv[0]), airlock is
// the shim: it first tries the mount itself (a nested user namespace,
// unshare -Urm, where the caller has CAP_SYS_ADMIN), then asks the server.
// It sends the mount point as an O_PATH descriptor opened with its own
// (the job's) permissions, and the options. The server takes the caller's
// uid and gid from SO_PEERCRED, makes fusermount3's checks (a directory or
// regular file the caller may write, not in a sticky directory it does not
// own, on a file system fusermount3 allows; allow_other only with
// user_allow_other in /etc/fuse.conf; suid and dev never), opens
// /dev/fuse, mounts it with nosuid,nodev, user_id and group_id on
// /proc/self/fd/N (the caller's descriptor, so no path is resolved twice),
// and returns the descriptor, which the shim passes to libfuse over
// _FUSE_COMMFD. Unmounting (-u, -z) likewise: the server unmounts only a
// FUSE mount whose user_id is the caller's, named by the caller's
// descriptor of its root.
//
// What the server can do is what the job could do itself with unshare
// -Urm in its own mount namespace; it holds nothing of the host's.
package fusemount
