// SPDX-License-Identifier: MIT

// Package bench measures Airlock against native routing, the reference
// stack of Tovar et al. (ocserv + openconnect + vpnns, over TCP and over
// DTLS; slirp4netns as the user-space stack of the unprivileged server) and
// the peers a user with root would pick instead (wireguard-go with kernel
// forwarding, OpenVPN 2.6 over UDP), side by side on the cn/dmz/inet
// topology of test/topology: throughput with repetitions interleaved
// across configurations, each run paired with a native run, a load gate
// before every point, and latency idle and under a second job's bulk
// transfer.
//
// The benchmark is a test, TestBench, that skips unless AIRLOCK_BENCH=1, so
// that it never runs in `make test`. Run it as root with bench/run.sh,
// which installs the Debian packages it needs (bench/setup.sh), builds the
// LD_PRELOAD shim (fakeroot/fakeroot.c) and runs the test; every
// measurement is a row of a TSV under bench/results (format: bench/record),
// from which bench/report derives every table and plot. bench/rr is the
// TCP request/response latency probe. See bench/README.md.
package bench
