#!/bin/sh
# bench/run.sh: Airlock vs native routing vs the reference stack
# (ocserv/openconnect/vpnns, slirp4netns), side by side; see bench/README.md.
#
#   sudo bench/run.sh [--duration S] [--reps N] [--quick] [--configs LIST]
#                     [--links LIST] [--streams LIST] [--startup N]
#                     [--wan LIST] [--impaired] [--cc ALGO]
#
# --wan 10-0,40-0.1 runs every configuration through the impairment relay
# (test/impair) between cn and dmz, once per profile RTT_MS-LOSS_PERCENT.
# --impaired is the issue-8 preset: 1 Gbit links, RTT 10 and 40 ms, loss
# 0, 0.1 and 1 %, configurations airlock, airlock-kernel, airlock-tcp
# (--transport tcp), ocserv and ocserv-dtls, no
# start-up runs (combine with --duration/--reps/--streams). --cc reno sets
# TCP congestion control in every namespace (the host's default otherwise;
# only algorithms in net.ipv4.tcp_allowed_congestion_control).
#
# Needs root (namespaces, veth, tc). Installs the Debian packages it needs,
# builds the airlock binary from the committed HEAD (a clean export, so that
# uncommitted work in the tree is not measured), builds the LD_PRELOAD shim,
# runs TestBench (package bench, AIRLOCK_BENCH=1), and draws the plots into
# docs/. Results: bench/results/DATE/{runs,summary,startup,meta}.tsv,
# table.md, *.png.
set -eu

duration=10 reps=3 startup=50
configs=native,airlock,airlock-netstack,airlock-kernel,airlock-seccomp,airlock-preload,ocserv,ocserv-slirp,ocserv-ocproxy,slirp
links=1gbit,uncapped
streams=1,2,10,20
wan= tcpcc=
while [ $# -gt 0 ]; do
	case "$1" in
	--duration) duration=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--startup) startup=$2; shift 2 ;;
	--configs) configs=$2; shift 2 ;;
	--links) links=$2; shift 2 ;;
	--streams) streams=$2; shift 2 ;;
	--quick) duration=3 reps=1 startup=20; shift ;;
	--wan) wan=$2; shift 2 ;;
	--cc) tcpcc=$2; shift 2 ;;
	--impaired) wan=10-0,10-0.1,10-1,40-0,40-0.1,40-1 links=1gbit startup=0
		configs=airlock,airlock-netstack,airlock-kernel,airlock-tcp,ocserv,ocserv-dtls; shift ;;
	-h|--help) sed -n '2,25p' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
	esac
done
if [ "$(id -u)" != 0 ]; then
	echo "run.sh: needs root (ip netns, veth, tc); run it with sudo" >&2
	exit 1
fi

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)

pkgs="iperf3 ocserv openconnect ocproxy proxychains4 slirp4netns nftables gnuplot-nox openssl gcc libc6-dev util-linux"
missing=
for p in $pkgs; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "run.sh: installing$missing"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
fi

stamp=$(date -u +%Y-%m-%dT%H%M%SZ)
out="$here/results/$stamp"
mkdir -p "$out"
work=$(mktemp -d /tmp/airlock-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM

commit=$(git -C "$root" rev-parse HEAD)
echo "run.sh: building airlock at $commit (clean export of HEAD)"
mkdir "$work/src"
git -C "$root" archive HEAD | tar -x -C "$work/src"
(cd "$work/src" && CGO_ENABLED=0 go build -o "$work/airlock" ./cmd/airlock)
make -s -C "$work/src/preload" && cp "$work/src/preload/libairlock-preload.so" "$work/"
cc -shared -fPIC -Wall -Wextra -pedantic -O2 -o "$work/fakeroot.so" "$here/fakeroot/fakeroot.c" -ldl

echo "run.sh: results in $out"
cd "$here"
AIRLOCK_BENCH=1 AIRLOCK_TEST_BIN="$work/airlock" AIRLOCK_TEST_PRELOAD="$work/libairlock-preload.so" go test -count=1 -v -timeout 6h -run '^TestBench$' . -args \
	-bench.duration="$duration" -bench.reps="$reps" -bench.startup="$startup" \
	-bench.configs="$configs" -bench.links="$links" -bench.streams="$streams" \
	-bench.wan="$wan" -bench.cc="$tcpcc" -bench.shim="$work/fakeroot.so" -bench.commit="$commit" -bench.out="$out" 2>&1 | tee "$out/log.txt"

if [ -n "$wan" ]; then
	hi=$(echo "$streams" | tr ',' '\n' | sort -n | tail -1)
	gnuplot -e "summary='$out/summary-wan.tsv'; outdir='$out'; streams_hi=$hi" "$here/plot-wan.gp"
	cp "$out"/benchmarks-wan.png "$root/docs/"
else
	gnuplot -e "summary='$out/summary.tsv'; outdir='$out'" "$here/plot.gp"
	cp "$out"/benchmarks-throughput.png "$out"/benchmarks-ratio.png "$root/docs/"
fi
echo "run.sh: table: $out/table.md; plots: docs/benchmarks-*.png"
