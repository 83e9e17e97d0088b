#!/bin/sh
# SPDX-License-Identifier: MIT
# bench/run.sh: Airlock vs native routing vs the reference stack (ocserv +
# openconnect, over TCP and over DTLS) and the peers a user would pick
# instead (wireguard-go, OpenVPN 2.6), side by side; see bench/README.md.
#
#   sudo bench/run.sh                 # the full, quotable run (about 100 min)
#   sudo bench/run.sh --smoke         # proves the method works (a few min); never quoted
#   sudo bench/run.sh --quick         # development: -t 3, 1 repetition; never quoted
#
# Options: --duration S --reps N --configs LIST --links LIST --streams LIST
#   --latency LIST --latency-links LIST --warmup S --maxload PER_CORE
#   --retries N --wait-budget DURATION --startup N --wan LIST --impaired
#   --cc ALGO --no-commit --perf --breakdown --ab REV
#
# --ab REV builds airlock also at REV (a clean export) as the binary of the
# configurations with the suffix @base (e.g. --configs airlock,airlock@base):
# an interleaved A/B of two commits in one run.
#
# Needs root (namespaces, veth, tc). Installs what it needs (bench/setup.sh),
# builds airlock from a clean export of the committed HEAD (uncommitted work
# is not measured), runs TestBench (AIRLOCK_BENCH=1) and writes one row per
# measurement to bench/results/STAMP.tsv and STAMP-latency.tsv; daemon logs,
# meta.tsv and startup.tsv go to bench/results/STAMP/ (not committed).
# A full run then regenerates docs/benchmarks.md's tables
# and docs/benchmarks-*.png with bench/report and commits them with the TSVs
# (--no-commit leaves that to you). --quick and --smoke runs write only
# bench/results/[smoke/]STAMP-report.md, marked not quotable.
set -eu

mode=full duration=10 reps=3 startup=20 warmup=3 maxload=0.25 retries=5 waitbudget=30m
configs=native,airlock,airlock-v6,airlock-kernel,ocserv,ocserv-dtls,wireguard-go,openvpn
latency=native,airlock,ocserv,ocserv-dtls,wireguard-go,openvpn
links=1gbit,uncapped latlinks=1gbit streams=1,10
wan= tcpcc= commit=yes perf= breakdown=false ab=
while [ $# -gt 0 ]; do
	case "$1" in
	--duration) duration=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--startup) startup=$2; shift 2 ;;
	--configs) configs=$2; shift 2 ;;
	--latency) latency=$2; shift 2 ;;
	--latency-links) latlinks=$2; shift 2 ;;
	--links) links=$2; shift 2 ;;
	--streams) streams=$2; shift 2 ;;
	--warmup) warmup=$2; shift 2 ;;
	--maxload) maxload=$2; shift 2 ;;
	--retries) retries=$2; shift 2 ;;
	--wait-budget) waitbudget=$2; shift 2 ;;
	--quick) mode=quick duration=3 reps=1 startup=5 warmup=1; shift ;;
	--smoke) mode=smoke duration=2 reps=1 startup=0 warmup=1 streams=1 links=uncapped latlinks=uncapped retries=0; shift ;;
	--wan) wan=$2; shift 2 ;;
	--cc) tcpcc=$2; shift 2 ;;
	--no-commit) commit=no; shift ;;
	--perf) perf=yes; shift ;;
	--breakdown) breakdown=true; shift ;;
	--ab) ab=$2; shift 2 ;;
	--impaired) wan=10-0,10-0.1,10-1,40-0,40-0.1,40-1 links=1gbit startup=0 latency=
		configs=airlock,airlock-netstack,airlock-kernel,airlock-tcp,ocserv,ocserv-dtls; shift ;;
	-h|--help) sed -n '2,29p' "$0"; exit 0 ;;
	*) echo "run.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
	esac
done
if [ "$(id -u)" != 0 ]; then
	echo "run.sh: needs root (ip netns, veth, tc); run it with sudo" >&2
	exit 1
fi
# Anything but the documented full run is not quotable.
if [ "$mode" = full ] && { [ "$duration" -lt 10 ] || [ "$reps" -lt 3 ]; }; then
	echo "run.sh: -t $duration with $reps repetitions is below the method (10 s, 3 repetitions): marked quick"
	mode=quick
fi
# perf's sampling costs CPU: a profiled run is for reading, never quoted.
if [ "$mode" = full ] && [ -n "$perf" ]; then
	echo "run.sh: --perf: profiled runs are marked quick"
	mode=quick
fi

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
"$here/setup.sh"
if [ -n "$perf" ] && ! command -v perf >/dev/null; then
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends linux-perf >/dev/null
fi

count() { echo "$1" | tr ',' '\n' | grep -c .; }
nwan=1; [ -n "$wan" ] && nwan=$(count "$wan")
nlat=0; [ -n "$latency" ] && nlat=$(count "$latency")
points=$(( $(count "$links") * nwan * $(count "$configs") * $(count "$streams") * 2 * reps ))
latpoints=$(( $(count "$latlinks") * nlat * 3 * reps ))
# A point: 3 s load gate + the run + its native run + ~2 s of iperf3 start-up;
# a latency point: gate + the probe twice (with 2 s ramp under bulk).
est=$(( (points * (2 * duration + 5) + latpoints * (2 * duration + 7) + 180 * $(count "$links")) / 60 ))
echo "run.sh: $mode run: $points throughput points, $latpoints latency points, about $est minutes if the machine stays quiet"

stamp=$(date -u +%Y-%m-%dT%H%M%SZ)
resdir="$here/results"
[ "$mode" = smoke ] && resdir="$here/results/smoke"
out="$resdir/$stamp"
tsv="$resdir/$stamp.tsv"
mkdir -p "$out"
perfdir=
[ -n "$perf" ] && perfdir="$out/perf"
work=$(mktemp -d /tmp/airlock-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT INT TERM

head=$(git -C "$root" rev-parse HEAD)
echo "run.sh: building airlock at $head (clean export of HEAD)"
mkdir "$work/src"
git -C "$root" archive HEAD | tar -x -C "$work/src"
(cd "$work/src" && CGO_ENABLED=0 go build -o "$work/airlock" ./cmd/airlock)
make -s -C "$work/src/preload" && cp "$work/src/preload/libairlock-preload.so" "$work/"
cc -shared -fPIC -Wall -Wextra -pedantic -O2 -o "$work/fakeroot.so" "$here/fakeroot/fakeroot.c" -ldl
bins= abrev=
if [ -n "$ab" ]; then
	abrev=$(git -C "$root" rev-parse "$ab")
	echo "run.sh: building airlock at $abrev for the @base configurations"
	mkdir "$work/ab"
	git -C "$root" archive "$abrev" | tar -x -C "$work/ab"
	(cd "$work/ab" && CGO_ENABLED=0 go build -o "$work/airlock-base" ./cmd/airlock)
	bins="base=$work/airlock-base"
fi

echo "run.sh: rows in $tsv; logs in $out"
cd "$here"
rc=0
AIRLOCK_BENCH=1 AIRLOCK_TEST_BIN="$work/airlock" AIRLOCK_TEST_PRELOAD="$work/libairlock-preload.so" go test -count=1 -v -timeout 5h -run '^TestBench$' . -args \
	-bench.mode="$mode" -bench.duration="$duration" -bench.reps="$reps" -bench.startup="$startup" \
	-bench.configs="$configs" -bench.links="$links" -bench.streams="$streams" \
	-bench.latency="$latency" -bench.latency-links="$latlinks" -bench.warmup="$warmup" \
	-bench.maxload="$maxload" -bench.retries="$retries" -bench.wait-budget="$waitbudget" \
	-bench.wan="$wan" -bench.cc="$tcpcc" -bench.shim="$work/fakeroot.so" -bench.commit="$head" \
	-bench.out="$out" -bench.tsv="$tsv" -bench.perf="$perfdir" -bench.breakdown="$breakdown" -bench.bins="$bins" -bench.bin-commits="${abrev:+base=$abrev}" >"$out/log.txt" 2>&1 || rc=$?
grep -E 'LOAD GATE|NOT MEASURED|FELL BACK|--- FAIL|^(ok|FAIL)' "$out/log.txt" || true
[ "$rc" = 0 ] || echo "run.sh: TestBench failed (exit $rc); the rows measured are in $tsv; log: $out/log.txt" >&2

cd "$root"
if [ "$mode" != full ]; then
	go run ./bench/report -in "$tsv" -md "$resdir/$stamp-report.md"
	echo "run.sh: $mode run, not quotable: $resdir/$stamp-report.md"
	exit "$rc"
fi
msg="bench/results: full run $stamp"
if [ "$rc" != 0 ]; then
	# The rows measured are still the run's; the report lists every
	# configuration not measured and every point not counted.
	echo "run.sh: TestBench FAILED (exit $rc): regenerating the tables anyway from the rows measured; read the report's \"Not counted\" list before quoting" >&2
	msg="$msg (TestBench failed: see the report's not-measured list)"
fi
go run ./bench/report -in "${tsv#$root/}" -docs docs/benchmarks.md -plots docs
echo "run.sh: docs/benchmarks.md and docs/benchmarks-*.png regenerated from ${tsv#$root/}"
if [ "$commit" = yes ]; then
	git add -- "${tsv#$root/}" "${tsv%.tsv}-latency.tsv" "${tsv%.tsv}-summary.tsv" docs/benchmarks.md docs/benchmarks-throughput.png docs/benchmarks-ratio.png
	git commit -q -m "$msg" -- "${tsv#$root/}" "${tsv%.tsv}-latency.tsv" "${tsv%.tsv}-summary.tsv" docs/benchmarks.md docs/benchmarks-throughput.png docs/benchmarks-ratio.png
	echo "run.sh: committed $(git rev-parse --short HEAD)"
fi
exit "$rc"
