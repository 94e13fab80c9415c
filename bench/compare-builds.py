#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Two fanout-bench binaries side by side, alternating, medians per row.

    bench/compare-builds.py OLD_BIN NEW_BIN [--runs N] [-- BENCH_ARGS...]

Each run is one `fanout-bench --json` of the fanout rows (default: the
throughput sweep at batch 1, 64 and 4096, scale 0.3); the two binaries take
turns, so a noisy neighbour hits both alike.  Prints, per figure, the
median over the runs of each binary and NEW/OLD.
"""
import json
import statistics
import subprocess
import sys

DEFAULT_ARGS = ["--only", "throughput", "--peers", "fanout",
                "--sizes", "1,64,4096", "--scale", "0.3", "--no-python",
                "--no-plots", "--no-results"]


def run(binary, args):
    out = subprocess.run([binary, "--json"] + args, check=True,
                         stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL).stdout
    figs = json.loads(out)["figures"]
    return {(f["scenario"], f["metric"]): (f["value"], f["unit"],
                                           f["better"])
            for f in figs if f["peer"] == "fanout" and f["value"] is not None}


def main(argv):
    runs = 9
    args = DEFAULT_ARGS
    if "--" in argv:
        i = argv.index("--")
        argv, args = argv[:i], argv[i + 1:]
    if "--runs" in argv:
        i = argv.index("--runs")
        runs = int(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) != 2:
        sys.exit(__doc__)
    old, new = argv
    got = {old: {}, new: {}}
    meta = {}
    for r in range(runs):
        for b in ((old, new) if r % 2 == 0 else (new, old)):
            for k, (v, unit, better) in run(b, args).items():
                got[b].setdefault(k, []).append(v)
                meta[k] = (unit, better)
    print(f"median of {runs} alternating runs; args: {' '.join(args)}")
    print(f"  {'figure':34} {'old':>12} {'new':>12} {'new/old':>8}")
    for k in sorted(meta, key=lambda k: (k[0], int(k[1].split()[-1])
                                         if k[1].split()[-1].isdigit()
                                         else 0)):
        unit, better = meta[k]
        a = statistics.median(got[old].get(k, [float("nan")]))
        b = statistics.median(got[new].get(k, [float("nan")]))
        name = f"{k[0]}, {k[1]} ({unit}, {better})"
        print(f"  {name:34} {a:12.4g} {b:12.4g} {b / a:8.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
