#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""seeds.py - write the seed inputs of fuzz_api.c into tests/fuzz/corpus.

One seed per row (or group of rows) of the bad-input tables (README.md
"Bad input"), spelled in the harness's input language, so
fuzzing starts from every documented misuse.  The byte layout follows the
op_* functions of fuzz_api.c; keep the two in step.
Usage: python3 tests/fuzz/seeds.py [outdir]
"""
import os
import sys

# op codes (op % 19); bit 7 selects engine 1
CREATE, DESTROY, SHUTDOWN, SINK_NEW, SINK_DEL = 0, 1, 2, 3, 4
DISPATCH, RUN, DELEGATE, CANCEL, LOOKUP = 5, 7, 8, 9, 10
POLL, WAIT, FD, STATS, SLEEP, NULLS, FAULT = 11, 13, 14, 15, 16, 17, 18
# child behaviours (beh % 9)
OK, ERR, CANCELED, POSITIVE, WAITINT, NRUN, NDELEGATE, NDISPATCH, SUMMARY = \
    range(9)
E1 = 0x80  # engine 1


def create(k=0, sel=1, workers=0, qs=0, max_async=0, children=0, tasks=0,
           depth=0, keep=0, spin=1):
    """sel: bit0 NO_PIN, bit1 WAIT_HELPS, high nibble 1..10 a bad field;
    qs indexes {0,1,3,4,5,8,16,33}; tasks % 9, depth % 4 (0: default)."""
    return [CREATE, k, sel, workers, qs, max_async, children, tasks, depth,
            keep, spin]


def destroy(k=0, check=1):
    return [DESTROY | k, 7, check]


def shutdown(k=0, drain=1):
    return [SHUTDOWN | k, 7, drain]


def submit(op=DISPATCH, k=0, n=3, shape=0, sink=0, beh=(), odd=0):
    """shape: 0x80 id NULL, 0x40 default sink named, >= 0xf0 big batch;
    odd % 12: 1 tasks NULL, 2 last fn NULL, 3 other engine's sink."""
    b = list(beh) + [OK] * (64 - len(beh))
    return [op | k, (n & 0x3f) | shape, sink] + b + [odd]


def consume(op=POLL, k=0, sink=0, render=1, length=0, timeout=2):
    extra = [timeout] if op == WAIT else []
    return [op | k, sink] + extra + [render, length]


def cancel(k=0, how=2, pick=0):
    return [CANCEL | k, how, pick]


def lookup(k=0, cap=8, idx=0):
    return [LOOKUP | k, cap, idx]


ALL_BEH = [OK, ERR, CANCELED, POSITIVE, WAITINT, NRUN, NDELEGATE, NDISPATCH,
           SUMMARY]

seeds = {
    # engine rows E02..E10: each bad field (sel high nibble 1..9), E11 ok
    "seed-E02-E10-bad-configs":
        sum((create(sel=(f << 4) | 1) for f in range(1, 10)), []) +
        create(qs=1, tasks=8, depth=3) + submit(n=2) + [STATS],
    "seed-E13-shutdown-twice":
        create() + submit(n=4, beh=[WAITINT] * 4) + shutdown() +
        shutdown() + [STATS],
    "seed-E18-two-engines":
        create() + create(k=1, workers=1) + submit(n=2, beh=[NDISPATCH]) +
        submit(k=E1, n=2) + shutdown(k=E1) + destroy(),
    # dispatch/run/delegate rows
    "seed-D01-D03-nulls": [NULLS] + create() + submit(odd=1) +
        submit(op=RUN, odd=1) + submit(op=DELEGATE, odd=1),
    "seed-D04-empty-batch": create() + submit(n=0) + submit(op=RUN, n=0),
    "seed-D05-fn-null": create() + submit(n=5, odd=2) +
        submit(op=DELEGATE, n=1, odd=2),
    "seed-D06-too-big": create(tasks=2) + submit(n=3) +
        submit(op=RUN, n=3) + submit(shape=0xf0, n=0),
    "seed-D07-foreign-sink": create() + create(k=1) + submit(odd=3) +
        submit(op=RUN, odd=3) + submit(op=DELEGATE, odd=3),
    "seed-D08-max-async": create(max_async=1) +
        submit(n=2, beh=[WAITINT, WAITINT]) + submit(n=1) +
        submit(op=DELEGATE, n=2) + consume(op=WAIT, timeout=2),
    "seed-D09-ring-full": create(qs=1, children=1) +
        sum((submit(n=8, beh=[WAITINT] * 8) for _ in range(4)), []),
    "seed-D10-too-deep": create(depth=1) +
        submit(n=3, beh=[NRUN, NDELEGATE, NDISPATCH]) +
        submit(op=RUN, n=3, beh=[NDISPATCH, NRUN, NDELEGATE]),
    "seed-D11-after-shutdown": create() + shutdown() + submit() +
        submit(op=RUN) + submit(op=DELEGATE) + [SINK_NEW, 1],
    "seed-D12-id-null": create() + submit(shape=0x80) + consume(),
    "seed-D16-delegate-in-child": create() +
        submit(op=DELEGATE, n=4, beh=[NDELEGATE] * 4),
    # cancel rows
    "seed-C01-C08-cancel": create(keep=1) +
        submit(n=4, beh=[WAITINT] * 4) + cancel(how=1) + cancel(how=2) +
        cancel(how=0) + cancel(how=4, pick=0) + [1] + cancel(pick=250) +
        submit(n=1) + consume(op=WAIT) + cancel(how=3, pick=1) +
        submit(n=1) + submit(n=1) + cancel(how=2, pick=1),
    # lookup/list rows
    "seed-L01-L06-lookup-list": create(keep=2) + lookup(cap=0) +
        submit(n=2) + submit(n=2) + submit(n=2) + consume(op=WAIT) +
        lookup(cap=1, idx=1) + lookup(cap=8, idx=2),
    # inside a child: K rows (every behaviour, odd summaries and errors)
    "seed-K01-K12-children": create(workers=1) +
        submit(n=27, beh=ALL_BEH * 3) + submit(op=RUN, n=18,
                                                beh=ALL_BEH * 2) +
        consume(op=WAIT, timeout=2, render=1, length=7),
    # sinks and events: S rows
    "seed-S01-S16-sinks": create() + [SINK_NEW, 1, SINK_NEW, 2] +
        submit(sink=1, n=2, beh=[WAITINT, OK]) + [SINK_DEL, 1] +
        [SINK_DEL, 0] + consume(op=WAIT, sink=1, timeout=2) +
        [SINK_DEL, 1] + submit(sink=2, n=1) + [SLEEP, 60] +
        [SINK_DEL, 2] + consume(op=POLL, sink=0) +
        consume(op=WAIT, timeout=0) + [FD, 0, 1, 3] + shutdown(drain=0) +
        [SINK_DEL, 3, FD, 0, 1, 0] + destroy(check=0),
    "seed-S15-destroy-undrained": create() + [SINK_NEW, 1] +
        submit(n=3) + submit(sink=1, n=3) + [SLEEP, 40] +
        destroy(check=0),
    # formatting rows F01..F04: small and exact buffers, odd bytes
    "seed-F01-F04-format": create() +
        submit(op=RUN, n=12, beh=[SUMMARY, ERR] * 6) +
        submit(n=12, beh=[SUMMARY, ERR, CANCELED] * 4) +
        sum((consume(op=WAIT, timeout=2, render=1, length=ln)
             for ln in (1, 2, 3, 10, 95)), []),
    # injected allocation failures
    "seed-faults": create() + [FAULT, 0, 0] + submit(n=2)[1:] +
        [FAULT, 1, 1] + submit(n=2)[1:] + [FAULT, 2, 2] + submit(n=2)[1:],
}

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "corpus")
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(bytes(b & 0xff for b in data))
print(f"{len(seeds)} seeds in {out}")
