#!/bin/sh
# SPDX-License-Identifier: MIT
# The per-join cost of attested identity, two ways: munged's socket
# protocol spoken by internal/munge (what airlock does) against exec'ing
# MUNGE's munge(1) and unmunge(1). One "op" is what a join costs: one
# encode (airlock run, on the node) and one decode (the gateway). A real
# munged with a random key serves both (internal/munge/mungetest).
#
#   flock /tmp/airlock-heavy.lock bench/munge.sh [ROUNDS] [OPS]
#
# Interleaves the two, ROUNDS (default 10) times OPS (default 300)
# operations each, and writes the raw `go test -bench` lines with the
# load before and after to bench/results/DATE-munge.txt.
set -eu
cd "$(dirname "$0")/.."
rounds=${1:-10}
ops=${2:-300}
out=bench/results/$(date -u +%Y-%m-%dT%H%M%SZ)-munge.txt
go test -c -o /tmp/airlock-munge-bench.test ./internal/munge/
{
	echo "# bench/munge.sh rounds=$rounds ops=$ops $(go version) $(munged --version 2>&1 | head -1)"
	echo "# load before: $(cat /proc/loadavg)"
	i=0
	while [ "$i" -lt "$rounds" ]; do
		for b in Socket Exec; do
			/tmp/airlock-munge-bench.test -test.run '^$' -test.bench "^BenchmarkJoinCredential$b\$" -test.benchtime "${ops}x" | grep '^Benchmark'
		done
		i=$((i + 1))
	done
	echo "# load after: $(cat /proc/loadavg)"
} | tee "$out"
awk '/^BenchmarkJoinCredential/ { n[$1]++; s[$1] += $3 } END { for (k in n) printf "# %s: mean %.0f ns/op over %d rounds\n", k, s[k]/n[k], n[k] }' "$out" | tee -a "$out"
rm -f /tmp/airlock-munge-bench.test
