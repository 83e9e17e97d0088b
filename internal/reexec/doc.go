// SPDX-License-Identifier: MIT

// Package reexec is the one way Airlock starts a helper child of its own
// binary and gets descriptors back from it: the job's namespace
// (internal/nsexec), the user-mode gateway's private namespace
// (internal/usernet) and the seccomp shim (internal/seccompnotify).
//
// # Theory of operation
//
// The parent builds an exec.Cmd that re-executes this binary (with new
// namespaces, [IdentityMapped], or none) and hands it to [Start], which
// adds one end of a fresh SOCK_SEQPACKET socketpair as an extra file and
// names its descriptor in an environment variable (like wireguard-go's
// WG_TUN_FD). The child, selected in its main by that variable or another
// of its own, finds the socket with [FromEnv], does its setup step by
// step, and sends exactly one message with [Child.Reply]. Its config is
// JSON in another variable, or, for a child started before its config is
// known ([StartDeferred]: airlock run starts the job's namespace while it
// joins the gateway), on a pipe that [Parent.SendConfig] writes and
// closes; [Main] reads either. The reply is:
//
//   - success: an empty JSON [Reply] with the descriptors it hands over
//     attached (SCM_RIGHTS);
//   - failure: a [Reply] naming the failed step, the operation within it,
//     the error text and its innermost errno, taken from a [StepError].
//
// [Parent.Receive] reads that message (bounded by a context) and returns
// the descriptors, or a [*ChildError] that matches the errno with
// errors.Is and carries the step, so that each caller can turn a failure
// into an error that names the fix; [ErrNoReply] if the child died
// without replying. A child that must wait before its last step (exec of
// the job) blocks in [Child.WaitGo] until the parent calls [Parent.Go];
// end of file (the parent closed its end or died) means give up. A child
// that execs a program in its place does so with [Child.Exec], so that the
// program still dies with the parent.
//
// Parent and child are the same binary, so the message format is private
// to it and may change between versions.
package reexec
