#!/usr/bin/env bash
# Installs what Airlock's build, tests, demo and benchmarks need on a fresh
# Debian machine, fetches Go modules and builds bin/airlock and
# bin/libairlock-preload.so. Idempotent: it
# installs only what is missing. Needs root for apt-get (skipped if all
# packages are present).
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(iperf3 curl bind9-dnsutils iproute2 iputils-ping util-linux passwd ca-certificates nftables gcc make libc6-dev python3 procps)
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
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
	echo "setup: no Go toolchain on PATH; install Go >= 1.23 (go.dev/doc/install), then re-run" >&2
	exit 1
fi
go mod download
mkdir -p bin
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(git describe --always --dirty 2>/dev/null || echo dev)" -o bin/airlock ./cmd/airlock
# The LD_PRELOAD library of airlock run --mode preload, next to the binary,
# where airlock finds it.
make -s -C preload
cp preload/libairlock-preload.so bin/
echo "setup: built bin/airlock ($(go version | awk '{print $3}')) and bin/libairlock-preload.so"
