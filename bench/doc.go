// Package bench measures Airlock against native routing and the reference
// stack of Tovar et al. (ocserv + openconnect + vpnns, and slirp4netns as
// the user-space stack of the unprivileged server), side by side on the
// cn/dmz/inet topology of test/topology.
//
// The benchmark is a test, TestBench, that skips unless AIRLOCK_BENCH=1, so
// that it never runs in `make test`. Run it as root with bench/run.sh, which
// installs the Debian packages it needs, builds the LD_PRELOAD shim
// (fakeroot/fakeroot.c), runs the test and draws the plots; see bench/README.md.
package bench
