#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The orchestrator case, from Python: fanout's asyncio package against
asyncio.gather and ThreadPoolExecutor, side by side in one run.

1. 40 children, each awaiting 100 ms (an LLM call), on an engine with 2
   workers: one event back after ~0.1 s, not 2 s, because an `async def`
   child is a deferred child and holds no worker while it awaits.  Beside
   it: asyncio.gather of the same coroutines, and ThreadPoolExecutor with
   2 and with 40 threads running time.sleep(0.1).  Overhead per child =
   (wall - 100 ms) / 40.  Loop lag: a ticker task sleeps 1 ms in a loop
   and records how late it wakes; the maximum over the run is what
   "the loop never stalls" means.
2. 10,000 no-op async children in batches of 100: fanout (one delegation
   per batch) against asyncio.gather (one gather per batch), run one batch
   after another, and all batches at once; the ratio says what fanout's
   one-event bookkeeping costs per child over bare asyncio.

Medians of --rounds rounds (default 7), peers interleaved within each round.
Usage: python bench/python_orch.py [--rounds N] [--quick]
"""
import argparse
import asyncio
import concurrent.futures
import statistics
import time

import fanout

N_CHILDREN = 40
SLEEP = 0.1


class Ticker:
    """Measures how late a 1 ms asyncio.sleep wakes: the loop's stalls."""

    def __init__(self):
        self.max_lag = 0.0
        self._stop = False
        self._task = None

    async def _run(self):
        while not self._stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lag = time.perf_counter() - t - 0.001
            self.max_lag = max(self.max_lag, lag)

    def __enter__(self):
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc):
        self._stop = True

    async def stop(self):
        self._stop = True
        await self._task


async def llm_call(i):
    await asyncio.sleep(SLEEP)
    return f"answer {i}"


def blocking_call(i):
    time.sleep(SLEEP)
    return f"answer {i}"


async def noop():
    return None


async def orch_fanout(eng):
    tasks = [fanout.Task(f"subagent {i}", llm_call, i)
             for i in range(N_CHILDREN)]
    with Ticker() as tick:
        await asyncio.sleep(0.005)  # ticker running before we start
        t = time.perf_counter()
        ev = await eng.gather(tasks)
        wall = time.perf_counter() - t
        await tick.stop()
    assert ev.status == "completed" and len(ev.results) == N_CHILDREN, ev
    return wall, tick.max_lag


async def orch_gather():
    with Ticker() as tick:
        await asyncio.sleep(0.005)
        t = time.perf_counter()
        res = await asyncio.gather(*(llm_call(i) for i in range(N_CHILDREN)))
        wall = time.perf_counter() - t
        await tick.stop()
    assert len(res) == N_CHILDREN
    return wall, tick.max_lag


async def orch_threads(pool):
    loop = asyncio.get_running_loop()
    with Ticker() as tick:
        await asyncio.sleep(0.005)
        t = time.perf_counter()
        res = await asyncio.gather(*(loop.run_in_executor(
            pool, blocking_call, i) for i in range(N_CHILDREN)))
        wall = time.perf_counter() - t
        await tick.stop()
    assert len(res) == N_CHILDREN
    return wall, tick.max_lag


async def noop_fanout(eng, nbatch, per, at_once):
    batch = [fanout.Task("noop", noop) for _ in range(per)]
    t = time.perf_counter()
    if at_once:
        hs = [eng.dispatch(batch) for _ in range(nbatch)]
        evs = await asyncio.gather(*hs)
    else:
        evs = [await eng.gather(batch) for _ in range(nbatch)]
    wall = time.perf_counter() - t
    assert all(e.ncompleted == per for e in evs)
    return wall


async def noop_gather(nbatch, per, at_once):
    async def one():
        return await asyncio.gather(*(noop() for _ in range(per)))
    t = time.perf_counter()
    if at_once:
        res = await asyncio.gather(*(one() for _ in range(nbatch)))
    else:
        res = [await one() for _ in range(nbatch)]
    wall = time.perf_counter() - t
    assert len(res) == nbatch
    return wall


def med(xs):
    return statistics.median(xs)


async def main(rounds, quick):
    rows = {}

    def add(k, v):
        rows.setdefault(k, []).append(v)

    pool2 = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    pool40 = concurrent.futures.ThreadPoolExecutor(max_workers=N_CHILDREN)
    nbatch, per = (20, 100) if quick else (100, 100)
    # max_children = the batch size: a batch runs all at once, as
    # asyncio.gather does (the library's default, 64, would start the
    # last 36 of each batch only as earlier ones complete).
    async with fanout.Engine(workers=2, max_async=1024,
                             max_children=per) as eng:
        await orch_fanout(eng)  # warm-up: threads, caches
        await noop_fanout(eng, 5, per, False)
        for _ in range(rounds):
            w, lag = await orch_fanout(eng)
            add(("orch", "fanout.Engine(workers=2)"), (w, lag))
            w, lag = await orch_gather()
            add(("orch", "asyncio.gather"), (w, lag))
            w, lag = await orch_threads(pool2)
            add(("orch", "ThreadPoolExecutor(2)"), (w, lag))
            w, lag = await orch_threads(pool40)
            add(("orch", "ThreadPoolExecutor(40)"), (w, lag))
            for at_once in (False, True):
                add(("noop", "fanout", at_once),
                    await noop_fanout(eng, nbatch, per, at_once))
                add(("noop", "asyncio.gather", at_once),
                    await noop_gather(nbatch, per, at_once))
    pool2.shutdown()
    pool40.shutdown()

    print(f"\n== Python: {N_CHILDREN} children each awaiting "
          f"{SLEEP * 1000:.0f} ms, engine/pool of 2 (median of {rounds}) ==")
    print(f"  {'peer':28} {'wall ms':>9} {'overhead/child us':>18} "
          f"{'max loop lag ms':>16}")
    for k, v in rows.items():
        if k[0] != "orch":
            continue
        w = med([x[0] for x in v])
        lag = med([x[1] for x in v])
        over = (w - SLEEP) / N_CHILDREN * 1e6
        print(f"  {k[1]:28} {w * 1000:9.1f} {over:18.1f} {lag * 1000:16.2f}")
    print("  (ThreadPoolExecutor(2): each child holds a thread while it "
          "waits, so 40 take 20 rounds of 100 ms)")

    total = nbatch * per
    print(f"\n== Python: {total} no-op async children in batches of {per} "
          f"(max_children={per}; median of {rounds}) ==")
    print(f"  {'batches':16} {'fanout us/child':>16} "
          f"{'asyncio.gather us/child':>24} {'fanout/gather':>14}")
    for at_once in (False, True):
        f = med(rows[("noop", "fanout", at_once)]) / total * 1e6
        g = med(rows[("noop", "asyncio.gather", at_once)]) / total * 1e6
        name = "all at once" if at_once else "one after another"
        print(f"  {name:16} {f:16.2f} {g:24.2f} {f / g:13.1f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    asyncio.run(main(a.rounds, a.quick))
