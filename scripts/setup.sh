#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/setup.sh [build|demo|test|dist|fuzz]: installs what that make
# target needs on a Debian 12 machine that has nothing but its package
# manager, then fetches Go modules and builds bin/airlock and
# bin/libairlock-preload.so (test and dist also the SPANK plugin). Each
# target gets only its own Debian packages: `make demo` installs neither
# Slurm, Prometheus nor PostgreSQL. Idempotent: it installs only what is
# missing, and needs root only for that.
#
# The Go toolchain: the one go.mod's toolchain line names, from the Go
# module proxy, checksum-verified against the checksum database, as the go command
# itself fetches toolchains (GOTOOLCHAIN, go.dev/doc/toolchain). Debian 12's
# golang-go (Go 1.19) is only the client that downloads it, as the module
# golang.org/toolchain@v0.0.1-goVERSION.linux-ARCH; the toolchain stays in
# the Go module cache, and bin/toolchain links to it (the Makefile puts
# bin/toolchain/bin first on PATH). A go on PATH that is new enough is used
# as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-build}

# What every target needs: a C compiler for the preload library, make,
# certificates for the module proxy, and git for the version stamp.
pkgs=(gcc make libc6-dev ca-certificates git)
case $target in
build | fuzz) ;;
demo)
	# scripts/demo.sh: namespaces, the outside servers and the sample job.
	pkgs+=(iproute2 iputils-ping util-linux passwd procps curl iperf3)
	;;
test)
	pkgs+=(iperf3 curl bind9-dnsutils iproute2 iputils-ping util-linux passwd nftables python3 squid tshark procps)
	# The wireguard-go fork test (third_party/wireguard-go) applies its
	# patch with patch(1).
	pkgs+=(patch)
	# Batch-system integration tests (test/e2e TestSlurm) and the SPANK
	# plugin (slurm/), and the Prometheus tests: the distribution's Slurm,
	# munge and Prometheus (with promtool).
	pkgs+=(slurmctld slurmd slurm-client munge libslurm-dev prometheus)
	# The packages' tests (packaging/): Debian's package checker, RPM and
	# rpmlint, the shells whose completion scripts are parsed, groff for
	# the man pages, AppArmor's parser for the shipped profile, and
	# debootstrap for the bare-Debian test of this very script (test/bare).
	pkgs+=(lintian rpm rpmlint zsh fish groff-base apparmor debootstrap)
	# The fleet tests (internal/store/pgstore, test/e2e TestFleet) start
	# their own PostgreSQL server as an unprivileged user (test/pgtest).
	pkgs+=(postgresql-15)
	# FUSE and containers inside jobs (test/e2e TestFUSE, TestJobContainers):
	# squashfuse mounts a squashfs image through fusermount3 (fuse3).
	pkgs+=(squashfuse squashfs-tools bubblewrap fuse3)
	;;
dist)
	pkgs+=(libslurm-dev lintian rpm rpmlint zsh fish groff-base)
	;;
*)
	echo "setup: unknown target $target: want build, demo, test, dist or fuzz" >&2
	exit 2
	;;
esac
# Services of the test tools. The tests start their own munged, slurmctld,
# slurmd, prometheus, squid and postgres, in their own namespaces; the
# distribution's copies must neither start now nor at the next boot.
services=(munge slurmctld slurmd prometheus squid postgresql)

# The Go toolchain that go.mod names, and whether the go on PATH is one.
want=$(sed -n 's/^toolchain go//p' go.mod)
[ -n "$want" ] || want=$(sed -n 's/^go \([0-9.]*\)$/\1/p' go.mod)
[ ! -x bin/toolchain/bin/go ] || export PATH=$PWD/bin/toolchain/bin:$PATH
goversion() { GOTOOLCHAIN=local go env GOVERSION 2>/dev/null | sed 's/^go//'; }
goenough() { command -v go >/dev/null && dpkg --compare-versions "$(goversion)" ge "$want"; }
goenough || command -v go >/dev/null || pkgs+=(golang-go)

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
	# policy-rc.d is Debian's switch that keeps packages from starting their
	# services (nor failing to install when those cannot start).
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
fi
# ...and what the packages enabled for the next boot is disabled again:
# systemd's links (systemctl works on them without a running systemd, as
# in a container) and sysvinit's.
for s in "${services[@]}"; do
	[ -e "/lib/systemd/system/$s.service" ] || [ -e "/etc/init.d/$s" ] || continue
	ls /etc/systemd/system/*.wants/"$s".service /etc/rc[2-5].d/S??"$s" >/dev/null 2>&1 || continue
	if [ "$(id -u)" -ne 0 ]; then
		echo "setup: $s starts at boot; as root: systemctl disable $s" >&2
		continue
	fi
	if [ -d /run/systemd/system ]; then
		systemctl disable --now "$s" >/dev/null 2>&1 || true
	elif command -v systemctl >/dev/null; then
		systemctl disable "$s" >/dev/null 2>&1 || true
	fi
	if ls /etc/rc[2-5].d/S??"$s" >/dev/null 2>&1; then
		update-rc.d "$s" disable >/dev/null 2>&1 || true
	fi
done

if ! goenough; then
	mod=golang.org/toolchain@v0.0.1-go$want.linux-$(GOTOOLCHAIN=local go env GOARCH)
	echo "setup: $(go version | awk '{print $3}') is older than go.mod's go$want: fetching $mod through the Go module proxy"
	# Outside the module: Go 1.19 cannot read go.mod's toolchain line.
	dir=$(cd / && GO111MODULE=on GOFLAGS= GOTOOLCHAIN=local go mod download -json "$mod" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	if [ ! -x "$dir/bin/go" ]; then
		# Module zips keep no execute bits; the go command sets them on first
		# use of a downloaded toolchain, the commands in bin/ last.
		[ -d "$dir/bin" ] || {
			echo "setup: $mod has no bin/ in $dir" >&2
			exit 1
		}
		find "$dir/pkg/tool" -type f -exec chmod a+x {} +
		find "$dir/bin" -type f -exec chmod a+x {} +
	fi
	mkdir -p bin
	ln -sfn "$dir" bin/toolchain
	export PATH=$PWD/bin/toolchain/bin:$PATH
	goenough || {
		echo "setup: bin/toolchain/bin/go is $(goversion), not go$want" >&2
		exit 1
	}
fi
go mod download
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $(scripts/version.sh ldflags)" -o bin/airlock ./cmd/airlock
# The LD_PRELOAD library of airlock run --mode preload, next to the binary,
# where airlock finds it.
make -s -C preload
cp preload/libairlock-preload.so bin/
built="bin/airlock, bin/libairlock-preload.so"
# The Slurm SPANK plugin (docs/slurm.md), against the distribution's
# headers, for the targets that test or package it.
if [ "$target" = test ] || [ "$target" = dist ]; then
	make -s -C slurm
	cp slurm/spank_airlock.so slurm/airlock-slurm-task bin/
	built="$built, bin/spank_airlock.so"
fi
echo "setup: built $built with $(go version | awk '{print $3}')"
