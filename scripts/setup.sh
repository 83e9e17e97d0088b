#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs what Airlock's build, tests, demo and benchmarks need on a fresh
# Debian machine, fetches Go modules and builds bin/airlock and
# bin/libairlock-preload.so. Idempotent: it
# installs only what is missing. Needs root for apt-get (skipped if all
# packages are present).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(iperf3 curl bind9-dnsutils iproute2 iputils-ping util-linux passwd ca-certificates nftables gcc make libc6-dev python3 squid tshark procps)
# The wireguard-go fork test (third_party/wireguard-go) applies its patch with patch(1).
pkgs+=(patch)
# Batch-system integration tests (test/e2e TestSlurm) and the SPANK plugin
# (slurm/), and the Prometheus tests: the distribution's Slurm, munge and
# Prometheus (with promtool).
pkgs+=(slurmctld slurmd slurm-client munge libslurm-dev prometheus)
# make dist and its test (packaging/): Debian's package checker, RPM and
# rpmlint, and the shells whose completion scripts are parsed; groff
# renders the man pages in cmd/airlock's test.
pkgs+=(lintian rpm rpmlint zsh fish groff-base)
# The fleet tests (internal/store/pgstore, test/e2e TestFleet) start their
# own PostgreSQL server as an unprivileged user (test/pgtest).
pkgs+=(postgresql-15)
# FUSE and containers inside jobs (test/e2e TestFUSE, TestJobContainers):
# squashfuse mounts a squashfs image through fusermount3 (fuse3).
pkgs+=(squashfuse squashfs-tools bubblewrap fuse3)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "setup: installing Debian packages: ${missing[*]}"
	if [ "$(id -u)" -ne 0 ]; then
		echo "setup: need root to install packages: sudo apt-get install ${missing[*]}" >&2
		exit 1
	fi
	export DEBIAN_FRONTEND=noninteractive
	# The tests start munged, slurmctld, slurmd, prometheus and postgres themselves,
	# in their own namespaces; the packages must not start system-wide
	# copies (nor fail to install when those cannot start). policy-rc.d
	# is Debian's switch for that.
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		trap 'rm -f /usr/sbin/policy-rc.d' EXIT
	fi
	# tshark (the capture tests' pcap consumer) asks whether non-root users
	# may capture; answer no without a prompt.
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	# squid is only for the tests, which start their own in a namespace:
	# do not leave the distribution's service running on port 3128.
	if [[ " ${missing[*]} " == *" squid "* ]] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
		systemctl disable --now squid >/dev/null 2>&1 || true
	fi
	# Nor the distribution's PostgreSQL cluster (main, port 5432): the
	# tests make their own.
	if [[ " ${missing[*]} " == *" postgresql-15 "* ]] && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
		systemctl disable --now postgresql >/dev/null 2>&1 || true
	fi
fi

if ! command -v go >/dev/null; then
	echo "setup: no Go toolchain on PATH; install Go >= 1.23 (go.dev/doc/install), then re-run" >&2
	exit 1
fi
go mod download
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $(scripts/version.sh ldflags)" -o bin/airlock ./cmd/airlock
# The LD_PRELOAD library of airlock run --mode preload, next to the binary,
# where airlock finds it.
make -s -C preload
cp preload/libairlock-preload.so bin/
# The Slurm SPANK plugin (docs/slurm.md), against the distribution's headers.
make -s -C slurm
cp slurm/spank_airlock.so slurm/airlock-slurm-task bin/
echo "setup: built bin/airlock ($(go version | awk '{print $3}')), bin/libairlock-preload.so and bin/spank_airlock.so"
