#!/bin/sh
# SPDX-License-Identifier: MIT
# bench/setup.sh: installs the Debian packages the benchmark needs (and
# only it: `make test` uses scripts/setup.sh, which stays lean). Idempotent;
# needs root to install. Called by bench/run.sh.
#
#   iperf3                      the bulk workload
#   ocserv openconnect ocproxy  the reference stack (ocproxy ships vpnns)
#   proxychains4                the reference's fallback (ocserv-ocproxy)
#   slirp4netns                 the reference's unprivileged server stack
#   wireguard-tools             `wg`, to configure the wireguard-go peer
#                               through its UAPI socket
#   openvpn                     the OpenVPN 2.6 peer
#   iputils-ping                the latency probe (ping)
#   nftables                    masquerade for the root-run peers
#   gnuplot-nox                 the plots (bench/report)
#   openssl                     certificates of ocserv and OpenVPN
#   gcc libc6-dev               the fakeroot shim of ocserv-slirp
set -eu
pkgs="iperf3 ocserv openconnect ocproxy proxychains4 slirp4netns wireguard-tools openvpn iputils-ping nftables gnuplot-nox openssl gcc libc6-dev util-linux iproute2"
missing=
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
if [ -z "$missing" ]; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "bench/setup.sh: need root to install:$missing" >&2
	exit 1
fi
echo "bench/setup.sh: installing$missing"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
