#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""peer-python.py - Python's concurrent.futures.ThreadPoolExecutor as a
fan-out/join peer of fanout-bench: submit N no-op children, wait for them.

fanout-bench runs it as a subprocess with --serve and the same thread
count, and interleaves its measurements with the other peers' inside each
round; commands come one per line on stdin, each answered by one line:

    tp <batch> <inflight> <seconds>     -> tp <children_per_s>
    lat <samples> <gap_seconds>         -> lat <ns> <ns> ...  (every sample)
    idle <seconds>                      -> idle <percent of one CPU>
    quit

Standalone (without --serve) it prints a summary, one result per line:

    throughput <batch> <inflight> <children_per_s> <min> <max>
    latency_hot <p50_ns> <p99_ns> <p999_ns> <max_ns> <samples>
    latency_parked <p50_ns> <p99_ns> <p999_ns> <max_ns> <samples>
    idle_cpu_pct <percent>

Every child increments a counter; each measurement checks that exactly the
children it waited for ran (and exits non-zero otherwise).
"""
import argparse
import collections
import itertools
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait

_counter = itertools.count()


def noop():
    # itertools.count.__next__ is atomic under the GIL: an honest tally.
    next(_counter)


def ran_so_far():
    # Peek without consuming a value from the shared counter.
    return int(repr(_counter)[6:-1])


def throughput(ex, n, inflight, duration):
    c0 = ran_so_far()
    done = 0
    t0 = time.perf_counter()
    deadline = t0 + duration
    if inflight == 1:
        while True:
            futs = [ex.submit(noop) for _ in range(n)]
            wait(futs)
            done += n
            if time.perf_counter() >= deadline:
                break
    else:
        q = collections.deque()
        for _ in range(inflight):
            q.append([ex.submit(noop) for _ in range(n)])
        stop = False
        while q:
            wait(q.popleft())
            done += n
            if not stop and time.perf_counter() >= deadline:
                stop = True
            if not stop:
                q.append([ex.submit(noop) for _ in range(n)])
    dt = time.perf_counter() - t0
    ran = ran_so_far() - c0
    if ran != done:
        sys.exit(f"peer_python: {done} children joined but {ran} ran")
    return done / dt


def quantile(sorted_vals, q):
    if not sorted_vals:
        return float("nan")
    k = max(0, min(len(sorted_vals) - 1, int(q * len(sorted_vals) + 0.999999) - 1))
    return sorted_vals[k]


def latency(ex, samples, gap):
    vals = []
    for _ in range(samples):
        if gap:
            time.sleep(gap)
        t0 = time.perf_counter_ns()
        ex.submit(noop).result()
        vals.append(time.perf_counter_ns() - t0)
    vals.sort()
    return vals


def thread_cpu_ns():
    # CPU time of every thread of this process but the calling one.
    me = threading.get_native_id()
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if int(tid) == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:
            pass
    return total


def serve(threads):
    with ThreadPoolExecutor(max_workers=threads) as ex:
        throughput(ex, 64, 1, 0.05)  # start the executor's threads
        print("ready", flush=True)
        for line in sys.stdin:
            w = line.split()
            if not w:
                continue
            if w[0] == "tp":
                r = throughput(ex, int(w[1]), int(w[2]), float(w[3]))
                print(f"tp {r:.1f}", flush=True)
            elif w[0] == "lat":
                v = latency(ex, int(w[1]), float(w[2]))
                print("lat " + " ".join(str(x) for x in v), flush=True)
            elif w[0] == "idle":
                c0 = thread_cpu_ns()
                time.sleep(float(w[1]))
                used = thread_cpu_ns() - c0
                print(f"idle {used / 1e9 / float(w[1]) * 100:.4f}", flush=True)
            elif w[0] == "quit":
                break
            else:
                sys.exit(f"peer_python: unknown command {w[0]!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=float, default=0.2)
    ap.add_argument("--sizes", default="1,8,64,512,4096")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--parked-samples", type=int, default=200)
    ap.add_argument("--serve", action="store_true")
    args = ap.parse_args()
    if args.serve:
        serve(args.threads)
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]

    with ThreadPoolExecutor(max_workers=args.threads) as ex:
        # warm-up: let the executor start all its threads
        for n in sizes:
            throughput(ex, n, 1 if n >= 16 else 16 // n, args.duration / 4)
        res = {n: [] for n in sizes}
        for _ in range(args.rounds):
            for n in sizes:
                k = 1 if n >= 16 else 16 // n
                res[n].append(throughput(ex, n, k, args.duration))
        for n in sizes:
            k = 1 if n >= 16 else 16 // n
            v = res[n]
            print(f"throughput {n} {k} {statistics.median(v):.1f} "
                  f"{min(v):.1f} {max(v):.1f}", flush=True)
        hot = []
        for _ in range(args.rounds):
            hot += latency(ex, args.samples, 0)
        hot.sort()
        print("latency_hot " + " ".join(
            f"{quantile(hot, q):.0f}" for q in (0.5, 0.99, 0.999, 1.0))
            + f" {len(hot)}", flush=True)
        parked = []
        for _ in range(args.rounds):
            parked += latency(ex, args.parked_samples, 0.002)
        parked.sort()
        print("latency_parked " + " ".join(
            f"{quantile(parked, q):.0f}" for q in (0.5, 0.99, 0.999, 1.0))
            + f" {len(parked)}", flush=True)
        throughput(ex, 64, 1, 0.2)
        c0 = thread_cpu_ns()
        time.sleep(1.0)
        used = thread_cpu_ns() - c0
        print(f"idle_cpu_pct {used / 1e9 * 100:.4f}", flush=True)


if __name__ == "__main__":
    main()
