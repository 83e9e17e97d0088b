// SPDX-License-Identifier: MIT

// Package airlock is the root of Airlock, a rootless, user-level VPN and
// egress gateway for batch jobs on network-restricted compute nodes. The
// program is cmd/airlock; the parts are under internal/ (see
// docs/architecture.md). This package holds only repository-wide tests.
package airlock
