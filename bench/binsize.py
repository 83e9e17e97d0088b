#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Size and start-up cost of two airlock binaries, side by side.

    bench/binsize.py [-n PAIRS] [-o OUT.tsv] A B [-- ARGS...]

For each binary: its size, the Go modules linked into it (go version -m),
and PAIRS runs of `BINARY ARGS` (default: version), interleaved A B A B so
that a drift of the machine's speed hits both; each run's wall time and its
user+system CPU (the kernel's rusage of the child, wait4). Prints medians,
the pairwise A/B ratios' median, and the load average before and after;
with -o it writes every run as a TSV row (the raw results for
bench/results/). Build both the way releases are built (stripped, static):

    CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o /tmp/airlock-X ./cmd/airlock
"""

import argparse
import os
import statistics
import subprocess
import sys
import time


def modules(path):
    out = subprocess.run(["go", "version", "-m", path], capture_output=True, text=True).stdout
    return sorted(line.split()[1] for line in out.splitlines() if line.strip().startswith("dep"))


def run(argv):
    devnull = os.open(os.devnull, os.O_RDWR)
    t0 = time.perf_counter_ns()
    pid = os.posix_spawn(argv[0], argv, os.environ, file_actions=[
        (os.POSIX_SPAWN_DUP2, devnull, 0), (os.POSIX_SPAWN_DUP2, devnull, 1), (os.POSIX_SPAWN_DUP2, devnull, 2)])
    _, status, ru = os.wait4(pid, 0)
    wall = time.perf_counter_ns() - t0
    os.close(devnull)
    if status != 0:
        sys.exit(f"{argv}: exit status {status}")
    return wall / 1e6, (ru.ru_utime + ru.ru_stime) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, default=200, help="pairs of runs (default 200)")
    p.add_argument("-o", help="write every run to this TSV")
    p.add_argument("a")
    p.add_argument("b")
    p.add_argument("args", nargs="*", default=["version"])
    o = p.parse_args()
    bins = {"A": os.path.abspath(o.a), "B": os.path.abspath(o.b)}
    for k, path in bins.items():
        print(f"{k} {path}: {os.path.getsize(path)} bytes, {len(modules(path))} modules")
    ma, mb = set(modules(bins["A"])), set(modules(bins["B"]))
    print("modules only in A:", " ".join(sorted(ma - mb)) or "-")
    print("modules only in B:", " ".join(sorted(mb - ma)) or "-")
    for k in bins:  # warm-up: page cache
        for _ in range(5):
            run([bins[k]] + o.args)
    load0 = os.getloadavg()
    rows = []
    for i in range(o.n):
        for k in ("A", "B") if i % 2 == 0 else ("B", "A"):
            wall, cpu = run([bins[k]] + o.args)
            rows.append((i, k, wall, cpu))
    load1 = os.getloadavg()
    res = {k: [(w, c) for _, kk, w, c in rows if kk == k] for k in bins}
    ratio_w = [a[0] / b[0] for a, b in zip(res["A"], res["B"])]
    ratio_c = [a[1] / b[1] for a, b in zip(res["A"], res["B"]) if b[1] > 0]
    print(f"load average before {load0[0]:.2f} after {load1[0]:.2f}; {o.n} pairs of `{' '.join(o.args)}`")
    for k in bins:
        ws, cs = [w for w, _ in res[k]], [c for _, c in res[k]]
        print(f"{k}: wall median {statistics.median(ws):.2f} ms (p10 {statistics.quantiles(ws, n=10)[0]:.2f}, p90 {statistics.quantiles(ws, n=10)[-1]:.2f}); cpu median {statistics.median(cs):.2f} ms")
    print(f"A/B pairwise: wall median {statistics.median(ratio_w):.3f}, cpu median {statistics.median(ratio_c):.3f}")
    if o.o:
        with open(o.o, "w") as f:
            f.write(f"# A={bins['A']} ({os.path.getsize(bins['A'])} bytes) B={bins['B']} ({os.path.getsize(bins['B'])} bytes) args={' '.join(o.args)}\n")
            f.write(f"# load1 before {load0[0]:.2f} after {load1[0]:.2f}; date {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
            f.write("pair\tbinary\twall_ms\tcpu_ms\n")
            for i, k, w, c in rows:
                f.write(f"{i}\t{k}\t{w:.3f}\t{c:.3f}\n")


if __name__ == "__main__":
    main()
