// SPDX-License-Identifier: MIT

// Package attest makes and checks the MUNGE credentials that attest who
// joins a gateway: a join credential, which the joining process (airlock
// run, as the job's user) makes on the node, and a job credential, which
// root makes for the job (Airlock's SPANK plugin in slurmstepd).
//
// Theory of operation. munged on the node puts into every credential the
// uid and gid of the process that asked for it (the kernel tells munged,
// through the socket) and the node's address; munged on the gateway
// decodes it with the same key, checks its lifetime and lets it decode
// only once. The payload says what the credential is for, and is bound so
// that nothing a user can read lets a second join succeed as another job
// or from another host:
//
//   - the join credential names the gateway (its pin) and the join's
//     WireGuard public key: it is worth nothing at another gateway, and
//     whoever presents it gets a lease only for a key whose private half
//     stays in the airlock run that made it; it lives 60 s and decodes
//     once at that gateway. The gateway takes the uid, gid and node from
//     it, and requires the join to come from that node's address
//     (origin "match", the default) so that a credential carried off the
//     node is refused;
//   - the job credential carries the batch job id, step, uid, gid and
//     node name as root saw them. Root makes it before the job's program
//     starts and it reaches airlock run in the task's environment, so the
//     job's user can read it: it is therefore honoured only together with
//     a join credential of the same uid, made on the same node, whose
//     payload holds its SHA-256, and only if a uid the gateway trusts
//     (root) made it. It decodes once per gateway: a copy lets the job's
//     own user, on that node, join once as that job before the job does
//     (the job's join then fails loudly as a replay), and nothing else.
//
// What the gateway trusts is its munged and its key. Whoever holds the key
// can make credentials for any uid: keep a dedicated key for nodes and
// gateways (docs/security.md), not the cluster's own, which on a DMZ host
// would let whoever takes that host impersonate any user to slurmctld.
package attest
