# SPDX-License-Identifier: MIT
"""The fanout package against the real library (no mocks).

No timing assertions: sleeps only make children slow enough to be
cancelled or to overlap; every wait that must end is bounded by
asyncio.wait_for(..., LONG) so a bug fails instead of hanging.
"""
import asyncio
import contextvars
import errno
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import unittest

import fanout

LONG = 30.0  # a bound for waits that must end, not a timing assertion


async def sleeper(seconds, result=None):
    await asyncio.sleep(seconds)
    return result


async def hang(started=None, cancelled=None):
    if started is not None:
        started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        if cancelled is not None:
            cancelled.append(fanout.current().index)
        raise


class Base(unittest.IsolatedAsyncioTestCase):
    async def engine(self, **kw):
        kw.setdefault("workers", 2)
        kw.setdefault("pin", False)
        eng = fanout.Engine(**kw)
        await eng.__aenter__()
        self.addAsyncCleanup(eng.__aexit__, None, None, None)
        return eng

    def occupy_one(self, eng):
        # One place of the async pool taken by a C child that ticks until
        # hold.stop(): (hold, the handle of its delegation).
        hold = fanout.Counter()
        self.addCleanup(hold.stop)
        blocker = eng.dispatch([fanout.Task("pool", fanout.builtin("tick"),
                                            hold)])
        return hold, blocker

    def assertClean(self, eng):
        self.assertEqual(eng.orphan_events, 0)
        self.assertEqual(eng.duplicate_events, 0)

    async def wait_thread_event(self, ev):
        ok = await asyncio.get_running_loop().run_in_executor(
            None, ev.wait, LONG)
        self.assertTrue(ok)

    def set_test_point(self, fn):
        fanout._test_point = fn
        self.addCleanup(setattr, fanout, "_test_point", None)


class TestEvents(Base):
    async def test_c_children_one_event_in_task_order(self):
        eng = await self.engine()
        tasks = [fanout.Task(f"goal {i}", fanout.builtin("sleep"),
                             fanout.nanoseconds((5 - i) * 2_000_000))
                 for i in range(5)]
        ev = await asyncio.wait_for(
            eng.gather(tasks, context="ctx", session_key="s1"), LONG)
        self.assertEqual(ev.status, "completed")
        self.assertRegex(ev.id, r"^deleg_[0-9a-f]{16}$")
        self.assertEqual(ev.session_key, "s1")
        self.assertEqual(ev.context, "ctx")
        self.assertEqual([r.index for r in ev.results], list(range(5)))
        self.assertEqual([r.goal for r in ev.results],
                         [f"goal {i}" for i in range(5)])
        self.assertTrue(all(r.summary == "slept" for r in ev.results))
        self.assertTrue(all(r.duration > 0 for r in ev.results))
        text = ev.format()
        for i in range(5):
            self.assertIn(f"TASK {i + 1}/5: goal {i} (status=completed",
                          text)
        j = json.loads(ev.json())
        self.assertEqual(j["id"], ev.id)
        self.assertEqual(j["session_key"], "s1")
        self.assertClean(eng)

    async def test_async_children_summary_cost_and_current(self):
        eng = await self.engine()
        seen = []

        async def child(x):
            cur = fanout.current()
            seen.append((cur.index, cur.id, threading.current_thread()))
            cur.add_cost(0.25)
            await asyncio.sleep(0.001)
            return None if x is None else x * 2

        self.assertIsNone(fanout.current())
        ev = await asyncio.wait_for(eng.gather(
            [fanout.Task("a", child, 21), fanout.Task("b", child, None)]),
            LONG)
        self.assertEqual(ev.status, "completed")
        self.assertEqual(ev.results[0].summary, "42")
        self.assertIsNone(ev.results[1].summary)
        self.assertAlmostEqual(ev.cost, 0.5)
        self.assertEqual(sorted(i for i, _, _ in seen), [0, 1])
        self.assertTrue(all(id == ev.id for _, id, _ in seen))
        # On the loop's thread, never on a worker.
        self.assertTrue(all(t is threading.current_thread()
                            for _, _, t in seen))

    async def test_children_run_in_the_context_of_their_dispatcher(self):
        # Children ran in a copy of the context the engine was OPENED in
        # (the loop's reader callback's), so every session's children saw
        # the contextvars - request id, tracing span - of whoever opened
        # the engine, not of the task that delegated to them.
        request = contextvars.ContextVar("request", default=None)
        request.set("opener")
        eng = await self.engine()

        async def coro():
            await asyncio.sleep(0)
            seen = request.get()
            request.set("changed by the child")
            return seen

        def plain():
            return request.get()

        class Agent:
            async def __call__(self):
                return await coro()

        async def session(name):
            request.set(name)
            ev = await eng.gather([fanout.Task("a", coro),
                                   fanout.Task("t", plain),
                                   fanout.Task("o", Agent())])
            h = eng.dispatch([fanout.Task("a", coro)])
            ev2 = await h
            return ([r.summary for r in ev.results + ev2.results],
                    request.get())

        got = await asyncio.wait_for(asyncio.gather(
            session("A"), asyncio.create_task(session("B"))), LONG)
        self.assertEqual(got, [(["A", "A", "A", "A"], "A"),
                               (["B", "B", "B", "B"], "B")])
        self.assertEqual(request.get(), "opener")
        self.assertClean(eng)

    async def test_plain_function_runs_in_a_python_thread(self):
        eng = await self.engine()
        names = []

        def work(x):
            names.append(threading.current_thread().name)
            fanout.current().add_cost(1)
            return x + 1

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task(str(i), work, i) for i in range(4)]),
            LONG)
        self.assertEqual([r.summary for r in ev.results], ["1", "2", "3", "4"])
        self.assertEqual(ev.cost, 4)
        self.assertTrue(all(n.startswith("fanout-py") for n in names), names)

    async def test_every_kind_of_async_callable_is_awaited(self):
        # An object whose __call__ is an async def was taken for a plain
        # function: the thread got a coroutine back, never awaited (no
        # cancel could reach it), and the child "completed" with
        # "<coroutine object ...>".
        import functools
        eng = await self.engine()

        class Agent:
            async def __call__(self, x):
                await asyncio.sleep(0)
                return f"agent {x}"

        async def twice(a, b):
            return f"{a}{b}"

        tasks = [fanout.Task("obj", Agent(), 1),
                 fanout.Task("pp", functools.partial(
                     functools.partial(twice, "x"), "y")),
                 fanout.Task("plain", lambda: "plain")]
        self.assertEqual([t.kind for t in tasks],
                         ["async", "async", "thread"])
        ev = await asyncio.wait_for(eng.gather(tasks), LONG)
        self.assertEqual([r.summary for r in ev.results],
                         ["agent 1", "xy", "plain"])

    async def test_a_coroutine_returned_unawaited_is_an_error(self):
        # Task("x", lambda: fetch(url)) with fetch an async def: the
        # thread returned the coroutine, which nobody awaited or could
        # cancel, and the child "completed" with "<coroutine object ...>".
        eng = await self.engine()

        async def returns_one():
            return sleeper(0, "inner")

        ev = await asyncio.wait_for(eng.gather([
            fanout.Task("lam", lambda: sleeper(0, "x")),
            fanout.Task("async", returns_one)]), LONG)
        for r in ev.results:
            self.assertEqual(r.status, "error", r)
            self.assertIn("returned the coroutine sleeper()", r.error)

    async def test_exceptions_become_error_results_with_their_text(self):
        eng = await self.engine()

        async def bad_async():
            await asyncio.sleep(0)
            raise ValueError("the model refused: 42")

        def bad_plain():
            raise KeyError("missing tool")

        def bad_call():  # fails before it is a coroutine: not async
            raise RuntimeError("never awaited")

        ev = await asyncio.wait_for(eng.gather([
            fanout.Task("a", bad_async), fanout.Task("p", bad_plain),
            fanout.Task("ok", sleeper, 0, "fine"),
            fanout.Task("c", bad_call)]), LONG)
        r = ev.results
        self.assertEqual(r[0].status, "error")
        self.assertIn("ValueError: the model refused: 42", r[0].error)
        self.assertEqual(r[1].status, "error")
        self.assertIn("KeyError", r[1].error)
        self.assertIn("missing tool", r[1].error)
        self.assertEqual(r[2].status, "completed")
        self.assertEqual(r[3].status, "error")
        self.assertIn("never awaited", r[3].error)
        self.assertEqual(ev.status, "completed")  # one completed
        self.assertIn("ValueError: the model refused: 42", ev.format())

        ev = await asyncio.wait_for(eng.gather([fanout.Task("a", bad_async)]),
                                    LONG)
        self.assertEqual(ev.status, "error")


    async def test_errno_fanout_complete_refuses_still_completes(self):
        # BlockingIOError(EINPROGRESS) is what a non-blocking connect
        # raises; -EINPROGRESS is not an outcome for fanout_complete, nor
        # is an errno that does not fit a C int: the child must still end,
        # as an error with the exception's text.
        eng = await self.engine()

        async def a_inprogress():
            raise BlockingIOError(errno.EINPROGRESS, "now in progress")

        def t_inprogress():
            raise BlockingIOError(errno.EINPROGRESS, "now in progress")

        async def a_huge():
            raise OSError(2 ** 40, "huge errno")

        def t_odd():
            e = OSError("odd errno")
            e.errno = "not a number"
            raise e

        ev = await asyncio.wait_for(eng.gather([
            fanout.Task("a", a_inprogress), fanout.Task("t", t_inprogress),
            fanout.Task("h", a_huge), fanout.Task("o", t_odd)]), LONG)
        for r in ev.results:
            self.assertEqual(r.status, "error", r)
            self.assertNotEqual(r.code, -errno.EINPROGRESS)
            self.assertLess(r.code, 0)
        self.assertIn("now in progress", ev.results[0].error)
        self.assertIn("BlockingIOError", ev.results[1].error)
        self.assertIn("huge errno", ev.results[2].error)
        self.assertIn("odd errno", ev.results[3].error)
        self.assertEqual(eng.stats()["python_children_running"], 0)


    async def test_unprintable_exception_or_result_still_completes(self):
        # str() of what a child raised or returned may itself raise; the
        # child must still end (an error naming the type), never hang.
        eng = await self.engine()

        class BadExc(Exception):
            def __str__(self):
                raise RuntimeError("no str for the exception")

        class BadVal:
            def __str__(self):
                raise RuntimeError("no str for the value")

        async def a_raise():
            raise BadExc()

        async def a_return():
            return BadVal()

        def t_raise():
            raise BadExc()

        def t_return():
            return BadVal()

        ev = await asyncio.wait_for(eng.gather([
            fanout.Task("ar", a_raise), fanout.Task("av", a_return),
            fanout.Task("tr", t_raise), fanout.Task("tv", t_return),
            fanout.Task("ok", sleeper, 0, "fine")]), LONG)
        r = ev.results
        for i in range(4):
            self.assertEqual(r[i].status, "error", r[i])
        self.assertIn("BadExc", r[0].error)
        self.assertIn("BadVal", r[1].error)
        self.assertIn("BadExc", r[2].error)
        self.assertIn("BadVal", r[3].error)
        self.assertEqual(r[4].summary, "fine")
        self.assertEqual(eng.stats()["python_children_running"], 0)

    async def test_add_cost_after_the_child_ended_raises(self):
        # A thread a child started (or a ChildContext kept) outlives the
        # child and adds cost after the child completed.  The addition
        # went into the dead child's record and was lost without a word:
        # the event had the cost already.  Now it raises RuntimeError and
        # changes nothing.
        eng = await self.engine()
        late = threading.Event()
        self.addCleanup(late.set)
        outcomes = []
        threads = []

        def add_late():
            late.wait(LONG)
            try:
                fanout.current().add_cost(2.0)
                outcomes.append("added")
            except RuntimeError as e:
                outcomes.append(str(e))

        def start_adder():
            fanout.current().add_cost(1.5)
            ctx = contextvars.copy_context()
            t = threading.Thread(target=ctx.run, args=(add_late,))
            threads.append(t)
            t.start()
            return "done"

        async def async_child():
            return start_adder()

        ev = await asyncio.wait_for(eng.gather(
            [fanout.Task("async", async_child),
             fanout.Task("thread", start_adder)]), LONG)
        late.set()
        for t in threads:
            t.join(LONG)
        self.assertEqual(len(outcomes), 2)
        for o in outcomes:
            self.assertIn("has ended", o)
        self.assertEqual([(r.status, r.cost) for r in ev.results],
                         [("completed", 1.5)] * 2)
        self.assertEqual(ev.cost, 3.0)
        self.assertClean(eng)

    async def test_add_cost_of_an_abandoned_child_is_counted_or_raises(self):
        # A cancel with abandon finishes the Python children itself and
        # sends the event while their code still runs.  Every add_cost of
        # such a child - before the abandon, and after it (a coroutine's
        # `except CancelledError`, a thread that goes on) - went into a
        # record nobody read any more: the event said cost 0 and the
        # additions after it "succeeded".  Now the cost added before the
        # abandon is in the event, and a later addition raises.
        eng = await self.engine()
        async_in = asyncio.Event()
        thread_in = threading.Event()
        late = threading.Event()
        self.addCleanup(late.set)
        outcomes = {}

        def add_late(who):
            try:
                fanout.current().add_cost(2.0)
                outcomes[who] = "added"
            except RuntimeError as e:
                outcomes[who] = str(e)

        async def async_child():
            fanout.current().add_cost(1.0)
            async_in.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                add_late("async")
                raise

        def thread_child():
            fanout.current().add_cost(0.5)
            thread_in.set()
            late.wait(LONG)
            add_late("thread")

        h = eng.dispatch([fanout.Task("async", async_child),
                          fanout.Task("thread", thread_child)])
        await asyncio.wait_for(async_in.wait(), LONG)
        await self.wait_thread_event(thread_in)
        self.assertTrue(h.cancel(abandon=True))
        ev = await asyncio.wait_for(h, LONG)
        late.set()

        async def both_added():
            while len(outcomes) < 2:
                await asyncio.sleep(0.001)
        await asyncio.wait_for(both_added(), LONG)
        for who in ("async", "thread"):
            self.assertIn("was abandoned", outcomes[who])
        self.assertEqual([(r.status, r.cost) for r in ev.results],
                         [("interrupted", 1.0), ("interrupted", 0.5)])
        self.assertEqual(ev.cost, 1.5)
        self.assertClean(eng)

    async def test_cost_overflow_and_huge_summary_keep_the_summary(self):
        eng = await self.engine()
        refused = []

        async def costly():
            cur = fanout.current()
            cur.add_cost(1e308)
            try:
                cur.add_cost(1e308)  # the sum would be inf
            except ValueError as e:
                refused.append(str(e))
            return "the answer"

        big = 16 << 20  # fanout_outcome's summary limit, in bytes

        def huge():
            return "x" * (big + 100)

        ev = await asyncio.wait_for(eng.gather(
            [fanout.Task("c", costly), fanout.Task("h", huge)]), LONG)
        r = ev.results
        self.assertEqual(len(refused), 1)
        self.assertEqual(r[0].status, "completed")
        self.assertEqual(r[0].summary, "the answer")
        self.assertEqual(r[0].cost, 1e308)
        self.assertEqual(r[1].status, "completed")
        self.assertIsNotNone(r[1].summary)
        self.assertEqual(len(r[1].summary), big)


class TestCancel(Base):
    async def test_cancel_interrupts_the_coroutine(self):
        eng = await self.engine()
        started = [asyncio.Event(), asyncio.Event()]
        cancelled = []
        h = eng.dispatch([fanout.Task("hang", hang, started[0], cancelled),
                          fanout.Task("hang2", hang, started[1], cancelled)])
        # Both running (a child cancelled before its coroutine's first step
        # is interrupted too, but never gets to see the CancelledError).
        for ev in started:
            await asyncio.wait_for(ev.wait(), LONG)
        self.assertTrue(h.cancel())
        ev = await asyncio.wait_for(h, LONG)
        self.assertEqual(ev.status, "interrupted")
        self.assertTrue(all(r.status == "interrupted" for r in ev.results))
        self.assertEqual(sorted(cancelled), [0, 1])
        self.assertFalse(h.cancel())  # finished: nothing to cancel
        self.assertIs(await h, ev)    # awaiting again gives the same event

    async def test_thread_child_sees_interrupted(self):
        eng = await self.engine()
        started = threading.Event()

        def polls():
            started.set()
            for _ in range(int(LONG * 1000)):
                if fanout.current().interrupted:
                    raise asyncio.CancelledError()  # reported interrupted
                threading.Event().wait(0.001)
            return "never interrupted"

        h = eng.dispatch([fanout.Task("p", polls)])
        while not started.is_set():
            await asyncio.sleep(0.001)
        h.cancel()
        ev = await asyncio.wait_for(h, LONG)
        self.assertEqual(ev.results[0].status, "interrupted")

    async def test_asyncio_cancellation_inside_a_child_is_interrupted(self):
        eng = await self.engine()

        async def gives_up():
            await asyncio.sleep(0)
            raise asyncio.CancelledError()

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("x", gives_up)]), LONG)
        self.assertEqual(ev.results[0].status, "interrupted")
        self.assertEqual(ev.status, "interrupted")

    async def test_deadline_passes_through(self):
        eng = await self.engine()
        cancelled = []
        started = asyncio.Event()
        # 1 s: room for the fast child on a loaded host, not a bound.
        ev = await asyncio.wait_for(eng.gather(
            [fanout.Task("fast", sleeper, 0, "done"),
             fanout.Task("slow", hang, started, cancelled)],
            deadline=1.0), LONG)
        self.assertTrue(ev.timed_out)
        self.assertEqual(ev.results[0].status, "completed")
        self.assertEqual(ev.results[1].status, "interrupted")
        # The coroutine is cancelled even though its result is abandoned
        # (one that never got to run is never started).
        for _ in range(1000):
            if cancelled or not started.is_set():
                break
            await asyncio.sleep(0.001)
        self.assertEqual(cancelled, [1] if started.is_set() else [])

    async def test_join_policies_pass_through(self):
        eng = await self.engine()

        async def fail():
            await asyncio.sleep(0.001)
            raise RuntimeError("first error")

        ev = await asyncio.wait_for(eng.gather(
            [fanout.Task("f", fail), fanout.Task("h", hang)],
            join="first_error"), LONG)
        self.assertEqual([r.status for r in ev.results],
                         ["error", "interrupted"])
        self.assertTrue(ev.interrupted_by_policy)

        ev = await asyncio.wait_for(eng.gather(
            [fanout.Task("h", hang), fanout.Task("ok", sleeper, 0, "x")],
            join="any"), LONG)
        self.assertEqual([r.status for r in ev.results],
                         ["interrupted", "completed"])

        ev = await asyncio.wait_for(eng.gather(
            [fanout.Task("a", sleeper, 0, 1), fanout.Task("h", hang),
             fanout.Task("b", sleeper, 0, 2)], join="quorum", quorum=2),
            LONG)
        self.assertEqual([r.status for r in ev.results],
                         ["completed", "interrupted", "completed"])
        with self.assertRaises(ValueError):
            eng.dispatch([fanout.Task("a", sleeper, 0)], join="most")

    async def test_cancel_session(self):
        eng = await self.engine()
        a = eng.dispatch([fanout.Task("h", hang)], session_key="chat-1")
        b = eng.dispatch([fanout.Task("h", hang)], session_key="chat-1")
        c = eng.dispatch([fanout.Task("ok", sleeper, 0.01, "kept")],
                         session_key="chat-2")
        await asyncio.sleep(0)
        self.assertEqual(eng.cancel_session("chat-1"), 2)
        for h in (a, b):
            ev = await asyncio.wait_for(h, LONG)
            self.assertEqual(ev.status, "interrupted")
            self.assertEqual(ev.session_key, "chat-1")
        ev = await asyncio.wait_for(c, LONG)
        self.assertEqual(ev.status, "completed")

    async def test_gather_inside_a_child_belongs_to_its_cancel_tree(self):
        eng = await self.engine()
        started = asyncio.Event()
        cancelled = []
        inner_status = []

        async def parent():
            try:
                await eng.gather([fanout.Task("inner", hang, started,
                                              cancelled)])
            except asyncio.CancelledError:
                inner_status.append("parent cancelled")
                raise

        h = eng.dispatch([fanout.Task("parent", parent)])
        await asyncio.wait_for(started.wait(), LONG)
        inner = [i for i in eng.list() if i.status == "running" and
                 i.id != h.id]
        self.assertEqual(len(inner), 1)
        self.assertEqual(inner[0].depth, 2)
        h.cancel()
        ev = await asyncio.wait_for(h, LONG)
        self.assertEqual(ev.results[0].status, "interrupted")
        self.assertEqual(cancelled, [0])
        self.assertEqual(inner_status, ["parent cancelled"])
        for _ in range(1000):
            if eng.lookup(inner[0].id).status != "running":
                break
            await asyncio.sleep(0.001)
        self.assertEqual(eng.lookup(inner[0].id).status, "interrupted")

    async def test_depth_limit(self):
        eng = await self.engine(max_depth=2)
        errs = []

        async def level(n):
            if n == 0:
                return "leaf"
            try:
                ev = await eng.gather([fanout.Task(f"l{n}", level, n - 1)])
            except OSError as e:
                errs.append(e.errno)
                raise
            r = ev.results[0]
            if r.status != "completed":
                raise RuntimeError(r.error)
            return r.summary

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("top", level, 1)]), LONG)
        self.assertEqual(ev.results[0].summary, "leaf")
        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("top", level, 2)]), LONG)
        self.assertEqual(ev.results[0].status, "error")
        self.assertIn("too deep", ev.results[0].error)
        self.assertEqual(errs, [errno.ELOOP])


class TestCapacity(Base):
    async def test_busy_error_names_the_limit(self):
        eng = await self.engine(max_async=2)
        hs = [eng.dispatch([fanout.Task("h", hang)]) for _ in range(2)]
        with self.assertRaises(fanout.BusyError) as cm:
            eng.dispatch([fanout.Task("h", hang)])
        self.assertIsInstance(cm.exception, OSError)
        self.assertEqual(cm.exception.errno, errno.EBUSY)
        self.assertIn("max_async=2", str(cm.exception))
        # delegate() falls back inline and says so.
        d = await asyncio.wait_for(
            eng.delegate([fanout.Task("x", sleeper, 0, "inline ok")]), LONG)
        self.assertEqual(d.mode, "inline_full")
        self.assertIn("max_async=2", d.message)
        self.assertEqual(d.event.results[0].summary, "inline ok")
        for h in hs:
            h.cancel()
        for h in hs:
            self.assertEqual((await asyncio.wait_for(h, LONG)).status,
                             "interrupted")
        d = await eng.delegate([fanout.Task("x", sleeper, 0, "bg")])
        self.assertEqual(d.mode, "background")
        self.assertEqual((await asyncio.wait_for(d, LONG)).status,
                         "completed")

    async def test_delegate_inside_a_child_runs_inline(self):
        eng = await self.engine()

        async def parent():
            d = await eng.delegate([fanout.Task("sub", sleeper, 0, "sub ok")])
            return f"{d.mode}: {d.event.results[0].summary}"

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("p", parent)]), LONG)
        self.assertEqual(ev.results[0].summary, "inline: sub ok")


    async def test_delegate_inside_a_child_runs_inline_when_full(self):
        # The C policy: inside a child, delegate runs synchronously and
        # max_async does not apply, so a full pool is no error there.
        eng = await self.engine(max_async=1)

        async def parent():
            d = await eng.delegate([fanout.Task("sub", sleeper, 0, "sub ok"),
                                    fanout.Task("c", fanout.builtin("noop"))])
            return f"{d.mode}: {d.event.results[0].summary}"

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("p", parent)]), LONG)
        self.assertEqual(ev.results[0].status, "completed",
                         ev.results[0].error)
        self.assertEqual(ev.results[0].summary, "inline: sub ok")
        self.assertClean(eng)


    async def test_delegate_with_a_sink_when_full_runs_inline(self):
        eng = await self.engine(max_async=1)
        s = eng.sink()
        h = eng.dispatch([fanout.Task("h", hang)])
        d = await asyncio.wait_for(
            eng.delegate([fanout.Task("x", sleeper, 0, "ok")], sink=s), LONG)
        self.assertEqual(d.mode, "inline_full")
        self.assertEqual(d.event.results[0].summary, "ok")
        h.cancel()
        await asyncio.wait_for(h, LONG)


    async def test_cancelling_an_inline_delegate_cancels_the_run(self):
        eng = await self.engine(max_async=1, max_children=1)
        hold = fanout.Counter()
        blocker = eng.dispatch([fanout.Task("pool", fanout.builtin("tick"),
                                            hold)])
        ran = []

        async def py():
            ran.append(1)
            return "py"

        c = fanout.Counter()
        t = asyncio.create_task(eng.delegate(
            [fanout.Task("c", fanout.builtin("tick"), c),
             fanout.Task("py", py)]))

        async def until(pred):
            while not pred():
                await asyncio.sleep(0.001)

        await asyncio.wait_for(until(lambda: c.value > 0), LONG)
        t.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await t
        # The run is cancelled (the tick child stops only when
        # interrupted) and its batch is let go once fanout_run returned.
        await asyncio.wait_for(until(lambda: not any(
            not i.background and i.status == "running"
            for i in eng.list())), LONG)
        await asyncio.wait_for(until(lambda: not any(
            b.inline for b in eng._batches.values())), LONG)
        self.assertEqual(ran, [])
        hold.stop()
        self.assertEqual((await asyncio.wait_for(blocker, LONG)).status,
                         "completed")
        self.assertClean(eng)


    async def test_an_inline_run_without_a_thread_leaves_nothing(self):
        # The inline run's thread cannot start (a 1 TiB stack: "can't
        # start new thread").  delegate() raises; the batch stayed in the
        # engine with a future that never resolved, so aclose() waited
        # for it for ever.
        probe = threading.Thread(target=lambda: None)
        old = threading.stack_size(1 << 40)
        try:
            try:
                probe.start()
            except RuntimeError:
                pass
            else:
                probe.join()
                self.skipTest("this host maps a 1 TiB thread stack")
        finally:
            threading.stack_size(old)
        eng = fanout.Engine(workers=2, pin=False, max_async=1)
        eng.open()
        self.addAsyncCleanup(eng.aclose)
        hold, blocker = self.occupy_one(eng)
        old = threading.stack_size(1 << 40)
        try:
            with self.assertRaises(RuntimeError):
                await eng.delegate([fanout.Task("n", fanout.builtin("noop"))])
        finally:
            threading.stack_size(old)
        hold.stop()
        self.assertEqual((await asyncio.wait_for(blocker, LONG)).status,
                         "completed")
        await asyncio.wait_for(eng.aclose(), LONG)
        self.assertIsNone(eng._e)


class TestLifetime(unittest.IsolatedAsyncioTestCase):
    async def test_queries_of_an_engine_not_open_raise_runtime_error(self):
        # lookup(), list() and stats() passed None to the library (cffi:
        # "TypeError: initializer for ctype 'struct fanout_engine *' must
        # be a cdata pointer"), events() failed on a missing sink
        # (AttributeError), before open() and after the close.
        eng = fanout.Engine(workers=2, pin=False)
        calls = [lambda: eng.lookup("deleg_0000000000000001"), eng.list,
                 eng.stats]
        for call in calls:
            with self.assertRaisesRegex(RuntimeError, "not open"):
                call()
        with self.assertRaisesRegex(RuntimeError, "not open"):
            await anext(eng.events())
        async with eng:
            h = eng.dispatch([fanout.Task("c", fanout.builtin("noop"))])
            await asyncio.wait_for(h, LONG)
            self.assertEqual(eng.lookup(h.id).status, "completed")
        for call in calls:
            with self.assertRaisesRegex(RuntimeError, "not open"):
                call()
        with self.assertRaises(StopAsyncIteration):  # closed: it ends
            await anext(eng.events())

    async def test_aclose_from_another_threads_loop_closes(self):
        # asyncio.run(eng.aclose()) on another thread made the close's
        # task on the engine's loop from the wrong thread (asyncio is not
        # thread-safe), then failed with "got Future attached to a
        # different loop" while that close went on unsupervised.  Now it
        # hands the close to the engine's loop and returns once it is
        # done.
        eng = fanout.Engine(workers=2, pin=False)
        eng.open()
        started = asyncio.Event()
        h = eng.dispatch([fanout.Task("a", hang, started)])
        await asyncio.wait_for(started.wait(), LONG)
        out = []

        def other():
            try:
                asyncio.run(eng.aclose())
                out.append("closed")
            except BaseException as e:  # noqa: B902 - the test reports it
                out.append(f"{type(e).__name__}: {e}")

        t = threading.Thread(target=other)
        t.start()
        self.addCleanup(t.join, LONG)
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.run_in_executor(None, t.join), LONG)
        self.assertEqual(out, ["closed"])
        self.assertIsNone(eng._e)
        self.assertEqual(h.event.results[0].status, "interrupted")
        await eng.aclose()  # and again, on its own loop: nothing to do

    async def test_aclose_after_the_engines_loop_closed_frees_it(self):
        # asyncio.run() returned with the engine open and a thread child
        # still running: the loop is closed, so nothing could close the
        # engine any more (aclose: "RuntimeError: Event loop is closed"),
        # its workers and the child's pending record stayed for good,
        # and the Engine could not be opened again either.
        eng = fanout.Engine(workers=2, pin=False)
        gate = threading.Event()
        self.addCleanup(gate.set)
        in_child = threading.Event()

        def child():
            in_child.set()
            gate.wait(LONG)
            return "late"

        async def forgetful_main():
            eng.open()
            eng.dispatch([fanout.Task("t", child),
                          fanout.Task("a", hang)])
            await asyncio.get_running_loop().run_in_executor(
                None, in_child.wait, LONG)

        t = threading.Thread(target=asyncio.run, args=(forgetful_main(),))
        t.start()
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(loop.run_in_executor(None, t.join), LONG)
        gate.set()
        await asyncio.wait_for(eng.aclose(), LONG)
        self.assertIsNone(eng._e)
        with self.assertRaisesRegex(RuntimeError, "not open"):
            eng.stats()
        eng.open()  # and it serves again, on this loop
        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("c", fanout.builtin("noop"))]), LONG)
        self.assertEqual(ev.status, "completed")
        # (nothing of the dead loop - its batch's future - is waited for)
        await asyncio.wait_for(eng.aclose(), LONG)
        self.assertIsNone(eng._e)

    async def test_an_engine_opens_again_after_its_close(self):
        # open() after aclose() made a new C engine, but the Engine kept
        # "closing" set (every dispatch: ESHUTDOWN), its shut-down thread
        # pool (plain-function children failed) and the closed sinks (the
        # next close removed readers by their old fd numbers).
        eng = fanout.Engine(workers=2, pin=False)

        async def coro(x):
            await asyncio.sleep(0)
            return x

        def plain(x):
            return x

        for round in range(3):
            async with eng:
                s = eng.sink()
                h = eng.dispatch([fanout.Task("a", coro, round),
                                  fanout.Task("t", plain, round),
                                  fanout.Task("c", fanout.builtin("noop"))],
                                 sink=s)
                ev = await asyncio.wait_for(h, LONG)
                self.assertEqual(ev.status, "completed")
                self.assertEqual([r.summary for r in ev.results],
                                 [str(round), str(round), None])
                got = await asyncio.wait_for(anext(eng.events(s)), LONG)
                self.assertIs(got, ev)
                self.assertEqual(len(eng._sinks), 2)
            self.assertIsNone(eng._e)
        self.assertEqual(eng.orphan_events, 0)
        self.assertEqual(eng.duplicate_events, 0)

    async def test_aexit_delivers_or_cancels_everything_it_accepted(self):
        started = []
        finished = []

        async def child(i):
            started.append(i)
            try:
                await asyncio.sleep(0.001 if i % 2 else 3600)
                return i
            finally:
                finished.append(i)

        async with fanout.Engine(workers=2, pin=False) as eng:
            hs = [eng.dispatch([fanout.Task(f"{i}", child, i),
                                fanout.Task("c", fanout.builtin("sleep"),
                                            fanout.nanoseconds(10**10))])
                  for i in range(50)]
            await asyncio.sleep(0.01)
        statuses = set()
        for h in hs:
            self.assertTrue(h.done())
            ev = h.event
            self.assertEqual(len(ev.results), 2)
            statuses.update(r.status for r in ev.results)
            # The event outlives the engine.
            self.assertIn("TASK 2/2", ev.format())
        self.assertLessEqual(statuses, {"completed", "interrupted"})
        self.assertIn("interrupted", statuses)
        self.assertEqual(sorted(started), sorted(finished))
        self.assertEqual(eng.orphan_events, 0)
        with self.assertRaises(RuntimeError):
            eng.dispatch([fanout.Task("late", sleeper, 0)])

    def test_aclose_with_inline_delegates_in_flight(self):
        # Five inline_full delegate()s run, each a C child that runs until
        # interrupted and a Python child.  aclose() must interrupt all of
        # them and return.  In a subprocess: the bug this guards against
        # blocked the event loop itself, which no wait_for can bound.
        script = """if True:
            import asyncio, fanout

            async def py():
                return "py"

            async def main():
                eng = fanout.Engine(workers=2, pin=False, max_async=1,
                                    max_children=1)
                eng.open()
                hold = fanout.Counter()
                eng.dispatch([fanout.Task("pool", fanout.builtin("tick"),
                                          hold)])
                cs = [fanout.Counter() for _ in range(5)]
                ts = [asyncio.create_task(eng.delegate(
                    [fanout.Task("c", fanout.builtin("tick"), c),
                     fanout.Task("py", py)])) for c in cs]
                while sum(c.value > 0 for c in cs) < 4:
                    await asyncio.sleep(0.001)
                await eng.aclose()
                res = await asyncio.gather(*ts, return_exceptions=True)
                print("closed", sorted(
                    d.event.status if isinstance(d, fanout.Handle)
                    else type(d).__name__ for d in res))

            asyncio.run(main())
        """
        p = subprocess.run([sys.executable, "-c", script], timeout=LONG,
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("closed", p.stdout)
        self.assertNotIn("completed", p.stdout)

    def test_a_plain_child_the_pool_refuses_still_ends(self):
        # The loop runs on a thread of its own and the main thread has
        # ended: the interpreter is shutting down and ThreadPoolExecutor
        # refuses new work.  The refusal escaped the loop's reader: the
        # child never completed, its delegation never ended, and neither
        # did aclose() or the process.  Now the child is an error.
        script = """if True:
            import asyncio, json, threading, fanout

            started = threading.Event()

            def loop_thread():
                async def main():
                    async with fanout.Engine(workers=2, pin=False) as eng:
                        started.set()
                        while threading.main_thread().is_alive():
                            await asyncio.sleep(0.001)
                        ev = await eng.gather(
                            [fanout.Task("p", lambda: "ran"),
                             fanout.Task("a", asyncio.sleep, 0, "async")])
                        print(json.dumps([[r.status, r.summary, r.error]
                                          for r in ev.results]))
                asyncio.run(main())

            threading.Thread(target=loop_thread).start()
            started.wait()
        """
        p = subprocess.run([sys.executable, "-c", script], timeout=LONG,
                           capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        (st, summary, err), async_result = json.loads(p.stdout)
        self.assertEqual((st, summary), ("error", None))
        self.assertTrue(err.startswith("RuntimeError"), err)
        self.assertEqual(async_result, ["completed", "async", None])

    async def test_events_end_after_aclose(self):
        eng = fanout.Engine(workers=2, pin=False)
        await eng.__aenter__()
        s = eng.sink()
        got = []

        async def consume(sink):
            async for ev in eng.events(sink):
                got.append(ev.status)

        consumers = [asyncio.create_task(consume(None)),
                     asyncio.create_task(consume(s))]
        await asyncio.sleep(0)  # both consumers wait in events()
        await asyncio.wait_for(
            eng.dispatch([fanout.Task("n", sleeper, 0, "x")]), LONG)
        await eng.aclose()
        await asyncio.wait_for(asyncio.gather(*consumers), LONG)
        self.assertEqual(got, ["completed"])

    async def test_exactly_once_across_2000_dispatches(self):
        rng = random.Random(int(os.environ.get("FANOUT_TEST_SEED", "1")))
        runs = {}

        async def child(key, delay):
            runs[key] = runs.get(key, 0) + 1
            await asyncio.sleep(delay)
            return key

        def plain(key):
            runs[key] = runs.get(key, 0) + 1
            return key

        async with fanout.Engine(workers=2, max_async=4096,
                                 pin=False) as eng:
            hs = []
            for d in range(2000):
                n = rng.randint(1, 3)
                tasks = []
                for i in range(n):
                    k = rng.random()
                    if k < 0.15:
                        tasks.append(fanout.Task("p", plain, (d, i)))
                    elif k < 0.3:
                        tasks.append(fanout.Task(
                            "c", fanout.builtin("sleep"),
                            fanout.nanoseconds(rng.randint(0, 3) * 10**6)))
                    else:
                        tasks.append(fanout.Task(
                            "a", child, (d, i), rng.random() * 0.02))
                kw = {}
                if rng.random() < 0.3:
                    kw["deadline"] = rng.random() * 0.02 + 0.0005
                hs.append((eng.dispatch(tasks, session_key=f"s{d % 7}",
                                        **kw), n))
                if rng.random() < 0.3:
                    h = rng.choice(hs)[0]
                    h.cancel(interrupt=rng.random() < 0.7,
                             abandon=rng.random() < 0.5)
                if d % 50 == 0:
                    await asyncio.sleep(0)
            if rng.random() < 2:
                eng.cancel_session("s3")
            await asyncio.wait_for(asyncio.gather(*(h for h, _ in hs)), LONG)
            st = eng.stats()
        ids = set()
        for h, n in hs:
            ev = h.event
            self.assertEqual(ev.id, h.id)
            self.assertEqual(len(ev.results), n)
            self.assertEqual([r.index for r in ev.results], list(range(n)))
            for r in ev.results:
                self.assertIn(r.status, ("completed", "error",
                                         "interrupted"))
            ids.add(ev.id)
        self.assertEqual(len(ids), 2000)
        self.assertEqual(eng.orphan_events, 0)
        self.assertEqual(eng.duplicate_events, 0)
        self.assertEqual(st["dispatched"], 2000)
        self.assertEqual(st["completed"], 2000)
        self.assertTrue(all(v == 1 for v in runs.values()))


class TestRaces(Base):
    """Interleavings forced with the package's test points
    (fanout._test_point) and threading.Events: no sleeps."""

    async def test_interrupted_never_uses_the_pending_child_completed(self):
        # A thread reads current().interrupted of an async child that the
        # loop completes meanwhile: it looked at `done` (False) and took
        # p, then the loop's fanout_complete() released p.  It read the
        # released child (finished, so "interrupted": True, or freed
        # memory).  Now the completion waits for the reader.
        eng = await self.engine()
        at_window = threading.Event()
        go = threading.Event()
        seen = []
        reader = None

        def tp(name, c):
            if name == "interrupted" and \
                    threading.current_thread() is reader:
                at_window.set()
                go.wait(LONG)
            elif name in ("complete_waits", "completed") and \
                    at_window.is_set():
                go.set()  # the loop waits for the reader, or is done

        self.set_test_point(tp)

        def read():
            seen.append(fanout.current().interrupted)

        async def child():
            nonlocal reader
            ctx = contextvars.copy_context()
            reader = threading.Thread(target=ctx.run, args=(read,))
            reader.start()
            await self.wait_thread_event(at_window)
            return "done"

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("c", child)]), LONG)
        reader.join(LONG)
        self.assertEqual(ev.results[0].status, "completed")
        self.assertEqual(seen, [False])
        self.assertClean(eng)


    async def test_cancel_before_an_inline_run_registers_reaches_it(self):
        # delegate() at a full pool runs inline, on a thread of its own.
        # The task awaiting it is cancelled before that thread is in
        # fanout_run: the run is in no table, and with only C children no
        # start note ever came to cancel it.  It ran on, uncancelled (the
        # tick child runs until interrupted).  It must be interrupted,
        # with its one event.
        eng = await self.engine(max_async=1)
        hold, blocker = self.occupy_one(eng)
        at_run = threading.Event()
        go = threading.Event()
        self.addCleanup(go.set)
        runs = []

        def tp(name, b):
            if name == "inline_run":
                runs.append(b)
                at_run.set()
                go.wait(LONG)

        self.set_test_point(tp)
        c = fanout.Counter()
        self.addCleanup(c.stop)  # lets a failing run end
        t = asyncio.create_task(eng.delegate(
            [fanout.Task("c", fanout.builtin("tick"), c)]))
        await self.wait_thread_event(at_run)
        t.cancel()
        with self.assertRaises(asyncio.CancelledError):
            await t
        go.set()  # now the run thread enters fanout_run
        rc, ev = await asyncio.wait_for(asyncio.shield(runs[0].fut), LONG)
        self.assertEqual(rc, 0)
        self.assertEqual(ev.status, "interrupted")
        self.assertEqual(ev.results[0].status, "interrupted")
        self.assertEqual(len(runs), 1)
        hold.stop()
        self.assertEqual((await asyncio.wait_for(blocker, LONG)).status,
                         "completed")
        self.assertClean(eng)


    async def test_a_cancelled_aclose_still_delivers_every_event(self):
        # The task in aclose() is cancelled while aclose() waits for the
        # events it caused (here: before the loop has read the sink).
        # aclose() freed the engine at once, with the events in the sink:
        # the handle never resolved.  Now the close goes on.
        eng = fanout.Engine(workers=2, pin=False)
        eng.open()
        self.addAsyncCleanup(eng.aclose)
        c = fanout.Counter()
        self.addCleanup(c.stop)
        h = eng.dispatch([fanout.Task("t", fanout.builtin("tick"), c)])
        for _ in range(int(LONG * 1000)):
            if c.value:
                break
            await asyncio.sleep(0.001)
        self.assertTrue(c.value)
        closer = None

        def tp(name, obj):
            if name == "aclose_waits" and obj is eng:
                closer.cancel()  # the task that called aclose()

        self.set_test_point(tp)
        closer = asyncio.create_task(eng.aclose())
        with self.assertRaises(asyncio.CancelledError):
            await closer
        ev = await asyncio.wait_for(h, LONG)
        self.assertEqual(ev.status, "interrupted")
        await asyncio.wait_for(eng.aclose(), LONG)  # waits for that close
        self.assertIsNone(eng._e)
        self.assertEqual(eng.orphan_events, 0)


    async def test_an_inline_run_never_gets_a_completed_parent(self):
        # delegate() inside a child at a full pool runs inline, with the
        # child's pending child as fanout_batch.within.  The child is
        # interrupted and its coroutine ends before the run's thread is in
        # fanout_run: the loop completed the child (releasing p) and
        # fanout_run then read p - completed, so the run was refused
        # (-ECANCELED), or freed.  Now the child's completion waits for
        # the run, which runs in the child's cancel tree.
        eng = await self.engine(max_async=2)
        hold, blocker = self.occupy_one(eng)
        at_run = threading.Event()
        go = threading.Event()
        self.addCleanup(go.set)
        parent_ended = asyncio.Event()
        runs = []

        def tp(name, obj):
            if name == "inline_run":
                runs.append(obj)
                at_run.set()
                go.wait(LONG)
            elif name in ("completed", "complete_held") and \
                    obj.batch.tasks[obj.index].goal == "parent":
                parent_ended.set()

        self.set_test_point(tp)
        c = fanout.Counter()
        self.addCleanup(c.stop)

        async def parent():
            await eng.delegate([fanout.Task("c", fanout.builtin("tick"), c)])
            return "not interrupted"

        ph = eng.dispatch([fanout.Task("parent", parent)])
        await self.wait_thread_event(at_run)
        ph.cancel()  # interrupts the parent: its coroutine is cancelled
        await asyncio.wait_for(parent_ended.wait(), LONG)
        go.set()
        rc, ev = await asyncio.wait_for(asyncio.shield(runs[0].fut), LONG)
        self.assertEqual(rc, 0)
        self.assertEqual(ev.status, "interrupted")
        pev = await asyncio.wait_for(ph, LONG)
        self.assertEqual(pev.results[0].status, "interrupted")
        self.assertEqual(eng.stats()["python_children_running"], 0)
        hold.stop()
        await asyncio.wait_for(blocker, LONG)
        self.assertClean(eng)


    async def test_dispatch_from_a_childs_thread_keeps_its_event(self):
        # A plain-function child dispatches from its thread.  The loop
        # read the event before dispatch() had made the handle's future
        # (it did so after fanout_dispatch returned): an orphan event, and
        # a handle that never resolved.
        eng = await self.engine()
        drained = threading.Event()
        handles = []

        def tp(name, obj):
            if name == "dispatched" and \
                    threading.current_thread().name.startswith("fanout-py"):
                drained.wait(LONG)  # until the loop has read the event
            elif name == "event":
                drained.set()

        self.set_test_point(tp)

        def work():
            handles.append(eng.dispatch(
                [fanout.Task("n", fanout.builtin("noop"))]))
            return "dispatched"

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("p", work)]), LONG)
        self.assertEqual(ev.results[0].summary, "dispatched")
        inner = await asyncio.wait_for(handles[0], LONG)
        self.assertEqual(inner.status, "completed")
        self.assertEqual(inner.id, handles[0].id)
        self.assertClean(eng)


    async def test_dispatch_within_a_child_ending_meanwhile(self):
        # A thread that an async child started with its context calls
        # dispatch(): the batch names the child's pending child (within),
        # and the loop completes the child before fanout_dispatch reads
        # it.  fanout_dispatch read a completed (or freed) pending child
        # and refused: OSError(ECANCELED).  Now the completion waits for
        # the dispatch, which joins the child's tree.
        eng = await self.engine()
        at_dispatch = threading.Event()
        go = threading.Event()
        self.addCleanup(go.set)
        out = []
        reader = None

        def tp(name, obj):
            if name == "dispatching" and \
                    threading.current_thread() is reader:
                at_dispatch.set()
                go.wait(LONG)
            elif name in ("complete_waits", "completed") and \
                    at_dispatch.is_set():
                go.set()

        self.set_test_point(tp)

        def fan_out():
            try:
                out.append(eng.dispatch(
                    [fanout.Task("n", fanout.builtin("noop"))]))
            except OSError as e:
                out.append(e)

        async def child():
            nonlocal reader
            reader = threading.Thread(
                target=contextvars.copy_context().run, args=(fan_out,))
            reader.start()
            await self.wait_thread_event(at_dispatch)
            return "done"

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("c", child)]), LONG)
        reader.join(LONG)
        self.assertEqual(ev.results[0].status, "completed")
        self.assertIsInstance(out[0], fanout.Handle, out[0])
        inner = await asyncio.wait_for(out[0], LONG)
        self.assertEqual(inner.status, "completed")
        self.assertEqual(eng.lookup(inner.id).depth, 2)
        self.assertClean(eng)


    async def test_a_start_note_left_at_close_is_released(self):
        # A worker's fanout_defer() that finds its delegation abandoned
        # publishes the event before it pushes the start note, so the
        # close can take the event, finish and stop reading notes first.
        # The note was freed with the glue and its pending child never
        # released (every fanout_defer needs one fanout_complete).  Here
        # a delegation the close did not see defers a Python child after
        # the close's last look, as such a worker would.
        import select
        from fanout._fanout import ffi, lib
        eng = fanout.Engine(workers=2, pin=False)
        eng.open()
        self.addAsyncCleanup(eng.aclose)
        glue_fd = lib.pyfo_glue_fd(eng._glue)
        keep = []

        def tp(name, obj):
            if name == "aclose_waits" and obj is eng:
                b = eng._make_batch([fanout.Task("late", sleeper, 0)],
                                    None, None, None, "all", None, None)
                keep.append(b)
                rc = lib.fanout_dispatch(eng._e, b.cbatch,
                                         ffi.new("fanout_id *"))
                self.assertEqual(rc, 0)
                r, _, _ = select.select([glue_fd], [], [], LONG)
                self.assertEqual(r, [glue_fd])  # the note is pushed

        self.set_test_point(tp)
        await asyncio.wait_for(eng.aclose(), LONG)
        self.assertEqual(len(keep), 1)
        self.assertEqual(eng.late_starts, 1)

    async def test_aclose_cancels_runs_that_appear_while_it_lists(self):
        # aclose() lists the running records to cancel them: one
        # fanout_list for the count, then an array of count + 16 for a
        # second call.  fanout_list writes the newest records first, so
        # when more than 16 appeared between the two calls (here: 20
        # dispatches that passed _check_open before the close began) the
        # oldest runs did not fit and were never cancelled; aclose()
        # waited for them to end on their own (here: forever, but for the
        # release below).  Now every run is cancelled.
        eng = await self.engine()
        release = asyncio.Event()

        async def wait_release():
            await release.wait()
            return "released"

        handles = [eng.dispatch([fanout.Task(f"early {i}", wait_release)])
                   for i in range(2)]
        late = []

        def tp(name, obj):
            if name == "running_ids" and obj is eng and not late:
                eng._closing = False  # as if dispatched before the close
                try:
                    late.extend(eng.dispatch(
                        [fanout.Task(f"late {i}", wait_release)])
                        for i in range(20))
                finally:
                    eng._closing = True
            elif name == "aclose_waits" and obj is eng:
                # Every cancel was issued; what was missed ends now.
                release.set()

        self.set_test_point(tp)
        await asyncio.wait_for(eng.aclose(), LONG)
        self.assertEqual(len(late), 20)
        handles += late
        evs = [await asyncio.wait_for(h, LONG) for h in handles]
        self.assertEqual([(ev.status, ev.cancelled) for ev in evs],
                         [("interrupted", True)] * len(handles),
                         [h.id for h, ev in zip(handles, evs)
                          if not ev.cancelled])
        self.assertClean(eng)

    async def test_add_cost_racing_the_completion_is_counted(self):
        # A thread adds cost to an async child while the loop completes
        # it: it had read the cost and not yet written the sum when the
        # loop read the cost for fanout_complete(), so the addition was
        # lost.  Now the completion waits for the addition (or the
        # addition sees the child ended and raises).
        eng = await self.engine()
        at_window = threading.Event()
        go = threading.Event()
        self.addCleanup(go.set)
        adder = None
        raised = []

        def tp(name, c):
            if name == "add_cost" and threading.current_thread() is adder:
                at_window.set()
                go.wait(LONG)
            elif name in ("complete_waits", "completed") and \
                    at_window.is_set():
                go.set()  # the loop waits for the adder, or is done

        self.set_test_point(tp)

        def add():
            try:
                fanout.current().add_cost(2.0)
            except RuntimeError as e:
                raised.append(e)

        async def child():
            nonlocal adder
            fanout.current().add_cost(1.0)
            ctx = contextvars.copy_context()
            adder = threading.Thread(target=ctx.run, args=(add,))
            adder.start()
            await self.wait_thread_event(at_window)
            return "done"

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("c", child)]), LONG)
        adder.join(LONG)
        self.assertEqual(raised, [])
        self.assertEqual(ev.results[0].status, "completed")
        self.assertEqual(ev.results[0].cost, 3.0)
        self.assertClean(eng)

    async def test_a_cancelled_close_frees_the_engine_only_at_its_end(self):
        # The close goes on when its caller is cancelled, but asyncio.run
        # cancels every task it leaves behind, the close's own too: its
        # `finally` freed the engine at once - fanout_destroy while the
        # fanout_shutdown it had started on another thread still ran
        # (use after free), and before Python children and inline runs
        # had ended.  Now the close's task waits to the end all the same.
        eng = await self.engine(max_async=1)
        in_shutdown = threading.Event()
        go = threading.Event()
        self.addCleanup(go.set)
        freed_under_shutdown = []

        def tp(name, obj):
            if name == "shutdown":
                in_shutdown.set()
                go.wait(LONG)
                if obj._e is None:  # do not call it on the freed engine
                    freed_under_shutdown.append(True)
                    raise RuntimeError("engine freed under its shutdown")

        self.set_test_point(tp)
        first = asyncio.Event()
        second = asyncio.Event()
        h = eng.dispatch([fanout.Task("a", hang, first)])
        await asyncio.wait_for(first.wait(), LONG)
        # The pool is full: delegate() runs this one inline, which makes
        # the close call fanout_shutdown on another thread.
        d = asyncio.ensure_future(eng.delegate([fanout.Task("b", hang,
                                                            second)]))
        await asyncio.wait_for(second.wait(), LONG)
        closing = asyncio.ensure_future(eng.aclose())
        await self.wait_thread_event(in_shutdown)
        eng._close_task.cancel()  # as asyncio.run does with what is left
        for _ in range(10):
            await asyncio.sleep(0)
        self.assertIsNotNone(eng._e)
        go.set()
        await asyncio.wait_for(closing, LONG)
        self.assertIsNone(eng._e)
        self.assertEqual(freed_under_shutdown, [])
        self.assertEqual(h.event.results[0].status, "interrupted")
        dh = await asyncio.wait_for(d, LONG)
        self.assertEqual(dh.mode, "inline_full")
        self.assertEqual(dh.event.results[0].status, "interrupted")
        self.assertClean(eng)

    async def test_add_cost_racing_an_abandon_is_counted_or_raises(self):
        # A thread child adds cost in a loop while the loop cancels its
        # delegation with abandon: every addition that returned is in the
        # event, the first one after the abandon raises.  (The additions
        # were all lost: the library's abandon did not know them.)
        eng = await self.engine()
        going = threading.Event()
        event_in = threading.Event()
        self.addCleanup(event_in.set)
        added = []
        refused = []

        def child():
            cur = fanout.current()
            n = after = 0
            while after < 2:  # one attempt at least after the event
                if event_in.is_set():
                    after += 1
                try:
                    cur.add_cost(1.0)
                except RuntimeError as e:
                    refused.append(str(e))
                    break
                n += 1
                if n == 100:
                    going.set()
            added.append(n)

        h = eng.dispatch([fanout.Task("adder", child)])
        await self.wait_thread_event(going)
        self.assertTrue(h.cancel(abandon=True))
        ev = await asyncio.wait_for(h, LONG)
        event_in.set()

        async def returned():
            while not added:
                await asyncio.sleep(0.001)
        await asyncio.wait_for(returned(), LONG)
        self.assertEqual(len(refused), 1)
        self.assertIn("was abandoned", refused[0])
        self.assertEqual(ev.results[0].status, "interrupted")
        self.assertEqual(ev.results[0].cost, float(added[0]))
        self.assertEqual(ev.cost, float(added[0]))
        self.assertClean(eng)


def throw_cancel_in_a_forked_child(coro):
    """Fork; in the child, throw CancelledError into the suspended
    coroutine `coro` (as a task's cancel does) and report what came out
    of it: "<type> <type of its __context__> <errno of the context>"."""
    import select
    import signal
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through w
        try:
            os.close(r)
            try:
                coro.throw(asyncio.CancelledError())
                out = "returned"
            except BaseException as e:  # noqa: B902 - what the caller sees
                ctx = e.__context__
                out = (f"{type(e).__name__} {type(ctx).__name__} "
                       f"{getattr(ctx, 'errno', None)}")
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], LONG)
        out = os.read(r, 4096).decode() if ready else "no answer"
    finally:
        os.close(r)
        if out == "no answer":
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return out


class TestFork(Base):
    async def test_gather_cancelled_where_the_cancel_fails(self):
        # The task awaiting gather() is cancelled in a process that
        # inherited the engine by fork(): fanout_cancel() refuses
        # (-EOWNERDEAD), and gather()'s handler let that OSError replace
        # the CancelledError, so the caller (asyncio.timeout, TaskGroup,
        # a task's cancel()) saw an OSError instead.  The caller must see
        # the CancelledError, with the failed cancel as its context.
        eng = await self.engine()
        c = fanout.Counter()
        self.addCleanup(c.stop)
        coro = eng.gather([fanout.Task("t", fanout.builtin("tick"), c)])
        coro.send(None)  # dispatched; now awaiting the event
        (b,) = eng._batches.values()
        out = throw_cancel_in_a_forked_child(coro)
        self.assertEqual(out, f"CancelledError OSError {errno.EOWNERDEAD}")
        # Here the cancel works, and the one event comes.
        with self.assertRaises(asyncio.CancelledError) as cm:
            coro.throw(asyncio.CancelledError())
        self.assertIsNone(cm.exception.__context__)
        ev = await asyncio.wait_for(asyncio.shield(b.fut), LONG)
        self.assertEqual(ev.status, "interrupted")
        self.assertTrue(ev.cancelled)
        self.assertClean(eng)

    async def test_inline_delegate_cancelled_where_the_cancel_fails(self):
        # The same for a delegate() that runs inline (a full pool): the
        # handler's cancel of the run raised OSError(EOWNERDEAD) in place
        # of the CancelledError.
        eng = await self.engine(max_async=1)
        hold, blocker = self.occupy_one(eng)
        c = fanout.Counter()
        self.addCleanup(c.stop)
        coro = eng.delegate([fanout.Task("t", fanout.builtin("tick"), c)])
        coro.send(None)  # BusyError: runs inline, awaits the run
        (b,) = [b for b in eng._batches.values() if b.inline]
        for _ in range(int(LONG * 1000)):  # its C child runs: id known
            if c.value:
                break
            await asyncio.sleep(0.001)
        self.assertTrue(c.value)
        out = throw_cancel_in_a_forked_child(coro)
        self.assertEqual(out, f"CancelledError OSError {errno.EOWNERDEAD}")
        with self.assertRaises(asyncio.CancelledError) as cm:
            coro.throw(asyncio.CancelledError())
        self.assertIsNone(cm.exception.__context__)
        rc, ev = await asyncio.wait_for(asyncio.shield(b.fut), LONG)
        self.assertEqual(rc, 0)
        self.assertEqual(ev.status, "interrupted")
        hold.stop()
        self.assertEqual((await asyncio.wait_for(blocker, LONG)).status,
                         "completed")
        self.assertClean(eng)


class TestWakeups(Base):
    async def test_more_starts_than_one_take_holds(self):
        # 20 x 100 children defer at once: more than pyfo_take() returns
        # per call (256), so pushes land while the rest is handed out.
        # A wakeup consumed then must not strand the stack (it did).
        eng = await self.engine(max_async=64)

        async def noop():
            return None

        for _ in range(3):
            hs = [eng.dispatch([fanout.Task("n", noop) for _ in range(100)])
                  for _ in range(20)]
            evs = await asyncio.wait_for(asyncio.gather(*hs), LONG)
            self.assertTrue(all(e.ncompleted == 100 for e in evs))
        self.assertClean(eng)


class TestGil(Base):
    async def test_a_child_holding_the_gil_never_stalls_c_workers(self):
        eng = await self.engine()
        counter = fanout.Counter()
        ticking = eng.dispatch([fanout.Task("tick", fanout.builtin("tick"),
                                            counter)])
        report = {}

        async def hog():
            # Never awaits: holds the loop (and the GIL between C calls)
            # until the C side has visibly moved on.
            c_only = eng.dispatch(
                [fanout.Task(f"s{i}", fanout.builtin("sleep"),
                             fanout.nanoseconds(2_000_000))
                 for i in range(8)])
            report["h"] = c_only
            start = counter.value
            spins = 0
            while spins < 50_000_000:
                spins += 1
                if spins % 10000 == 0 and counter.value - start >= 50 and \
                        eng.lookup(c_only.id).status == "completed":
                    break
            report["ticks"] = counter.value - start
            report["c_only"] = eng.lookup(c_only.id).status
            report["c_only_delivered"] = c_only.done()
            return spins

        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("hog", hog)]), LONG)
        self.assertEqual(ev.status, "completed")
        self.assertGreaterEqual(report["ticks"], 50)
        # The C delegation finished while the loop was held; its event
        # reached Python only after the loop ran again.
        self.assertEqual(report["c_only"], "completed")
        self.assertFalse(report["c_only_delivered"])
        self.assertEqual((await asyncio.wait_for(report["h"], LONG)).status,
                         "completed")
        counter.stop()
        self.assertEqual((await asyncio.wait_for(ticking, LONG)).status,
                         "completed")


class TestRunnersOnDemand(Base):
    async def until(self, cond):
        async def poll():
            while not cond():
                await asyncio.sleep(0.001)
        await asyncio.wait_for(poll(), LONG)

    async def test_a_batch_starts_with_one_runner_only_on_demand(self):
        # Two C children that tick until stopped, on two workers.  By
        # default each has a runner and both tick at once; with
        # runners_on_demand the batch starts with one runner, whose first
        # child never ends its chunk until stopped, so the second child
        # starts only after it.
        for on_demand in (False, True):
            with self.subTest(runners_on_demand=on_demand):
                eng = await self.engine(runners_on_demand=on_demand)
                a, b = fanout.Counter(), fanout.Counter()
                h = eng.dispatch([
                    fanout.Task("a", fanout.builtin("tick"), a),
                    fanout.Task("b", fanout.builtin("tick"), b)])
                if on_demand:
                    await self.until(lambda: a.value >= 20)
                    self.assertEqual(b.value, 0)
                    a.stop()
                    await self.until(lambda: b.value > 0)
                else:
                    await self.until(lambda: a.value > 0 and b.value > 0)
                    a.stop()
                b.stop()
                ev = await asyncio.wait_for(h, LONG)
                self.assertEqual([r.status for r in ev.results],
                                 ["completed", "completed"])
                self.assertClean(eng)

    async def test_exactly_once_with_runners_on_demand(self):
        runs = {}

        async def child(key):
            runs[key] = runs.get(key, 0) + 1
            await asyncio.sleep(0)
            return key

        eng = await self.engine(runners_on_demand=True, max_async=1024)
        hs = []
        for d in range(300):
            n = d % 17 + 1
            tasks = []
            for i in range(n):
                if i % 3 == 0:
                    tasks.append(fanout.Task("a", child, (d, i)))
                elif i % 3 == 1:
                    tasks.append(fanout.Task("n", fanout.builtin("noop")))
                else:
                    tasks.append(fanout.Task(
                        "s", fanout.builtin("sleep"),
                        fanout.nanoseconds((d % 4) * 100_000)))
            hs.append((eng.dispatch(tasks), n))
        await asyncio.wait_for(asyncio.gather(*(h for h, _ in hs)), LONG)
        for h, n in hs:
            ev = h.event
            self.assertEqual(ev.id, h.id)
            self.assertEqual([r.index for r in ev.results], list(range(n)))
            self.assertTrue(all(r.status == "completed"
                                for r in ev.results))
        self.assertEqual(len({h.event.id for h, _ in hs}), 300)
        self.assertTrue(runs and all(v == 1 for v in runs.values()))
        st = eng.stats()
        self.assertEqual(st["dispatched"], 300)
        self.assertEqual(st["completed"], 300)
        self.assertClean(eng)


class TestApi(Base):
    async def test_a_bad_sink_is_refused_with_a_clear_error(self):
        # A closed sink reached cffi ("TypeError: initializer for ctype
        # 'struct fanout_sink *' must be a cdata pointer, not NoneType"),
        # anything else not a Sink an AttributeError ('_c').
        eng = await self.engine()
        s = eng.sink()
        s.close()
        t = [fanout.Task("n", fanout.builtin("noop"))]
        with self.assertRaisesRegex(ValueError, "closed"):
            eng.dispatch(t, sink=s)
        with self.assertRaisesRegex(ValueError, "closed"):
            await eng.gather(t, sink=s)
        with self.assertRaisesRegex(TypeError, "fanout.Sink"):
            eng.dispatch(t, sink="mine")
        self.assertEqual(eng.stats()["dispatched"], 0)
        ev = await asyncio.wait_for(eng.gather(t, sink=eng.sink()), LONG)
        self.assertEqual(ev.status, "completed")
        self.assertClean(eng)

    def test_every_public_call_is_exported_and_documented(self):
        # Engine.open, Event.results/format/json, Handle.done and
        # Counter.value/stop had no docstring (help() showed nothing), and
        # Counter and nanoseconds, which the docs use for the builtin C
        # children, were missing from __all__.
        import inspect
        for name in ("Counter", "nanoseconds", "CChild"):
            self.assertIn(name, fanout.__all__)
        missing = []
        for name in fanout.__all__:
            obj = getattr(fanout, name)
            if not callable(obj):
                continue
            if not inspect.getdoc(obj):
                missing.append(name)
            if not inspect.isclass(obj):
                continue
            for k, v in vars(obj).items():
                if k.startswith("_"):
                    continue  # the class's docstring covers __init__ etc.
                f = v.fget if isinstance(v, property) else v
                if isinstance(f, (staticmethod, classmethod)):
                    f = f.__func__
                if callable(f) and not inspect.getdoc(f):
                    missing.append(f"{name}.{k}")
        self.assertEqual(missing, [])

    async def test_lookup_list_stats_and_events(self):
        eng = await self.engine()
        s = eng.sink()
        hs = [eng.dispatch([fanout.Task("x", sleeper, 0.001 * i, i)],
                           sink=s) for i in range(3)]
        got = []
        async for ev in eng.events(s):
            got.append(ev.id)
            if len(got) == 3:
                break
        self.assertEqual(sorted(got), sorted(h.id for h in hs))
        for h in hs:
            info = eng.lookup(h.id)
            self.assertEqual(info.status, "completed")
            self.assertEqual(info.ndone, 1)
            self.assertEqual(info.npending, 0)
            self.assertEqual(eng.lookup(h).id, info.id)
        listed = {i.id for i in eng.list()}
        self.assertTrue(all(h.id in listed for h in hs))
        with self.assertRaises(KeyError):
            eng.lookup("deleg_0000000000000001")
        st = eng.stats()
        self.assertEqual(st["dispatched"], 3)
        self.assertEqual(st["completed"], 3)
        self.assertEqual(st["running"], 0)
        self.assertEqual(st["python_children_running"], 0)
        s.close()

    async def test_sink_close_delivers_queued_events(self):
        # An event already queued in the sink (the loop has not read it)
        # must still resolve its handle and reach events() when the sink
        # is closed, and events() must then end.
        import select
        eng = await self.engine()
        s = eng.sink()
        h = eng.dispatch([fanout.Task("n", fanout.builtin("noop"))], sink=s)
        # Block the loop until the event is queued, so the loop's reader
        # has not taken it when close() runs.
        r, _, _ = select.select([s._fd], [], [], LONG)
        self.assertEqual(r, [s._fd])
        s.close()
        ev = await asyncio.wait_for(h, LONG)
        self.assertEqual(ev.status, "completed")

        async def consume():
            return [e.id async for e in eng.events(s)]

        self.assertEqual(await asyncio.wait_for(consume(), LONG), [ev.id])
        # A sink that delegations will still publish to is not closed.
        s2 = eng.sink()
        h2 = eng.dispatch([fanout.Task("h", hang)], sink=s2)
        with self.assertRaises(fanout.BusyError):
            s2.close()
        h2.cancel()
        await asyncio.wait_for(h2, LONG)
        s2.close()
        self.assertClean(eng)

    async def test_info_while_pending(self):
        eng = await self.engine()
        started = asyncio.Event()
        h = eng.dispatch([fanout.Task("h", hang, started)],
                         session_key="k")
        await asyncio.wait_for(started.wait(), LONG)
        info = eng.lookup(h.id)
        self.assertEqual(info.status, "running")
        self.assertEqual(info.npending, 1)
        self.assertEqual(info.session_key, "k")
        h.cancel()
        await asyncio.wait_for(h, LONG)

    async def test_c_child_from_a_shared_library(self):
        cc = shutil.which("cc") or shutil.which("gcc")
        if not cc:
            self.skipTest("no C compiler")
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        src = os.path.join(d, "kid.c")
        with open(src, "w") as f:
            f.write("struct fanout_child;\n"
                    "int kid(struct fanout_child *c, void *arg)\n"
                    "{ return arg ? 0 : -2; }\n")
        so = os.path.join(d, "libkid.so")
        subprocess.run([cc, "-shared", "-fPIC", "-o", so, src], check=True)
        kid = fanout.c_child(so, "kid")
        eng = await self.engine()
        ev = await asyncio.wait_for(eng.gather(
            [fanout.Task("with arg", kid, b"x"),
             fanout.Task("without", kid)]), LONG)
        self.assertEqual([r.status for r in ev.results],
                         ["completed", "error"])
        self.assertEqual(ev.results[1].code, -errno.ENOENT)
        with self.assertRaises(OSError):
            fanout.c_child(so, "no_such_symbol")

    async def test_bad_input(self):
        eng = await self.engine()
        with self.assertRaises(OSError) as cm:
            eng.dispatch([])
        self.assertEqual(cm.exception.errno, errno.EINVAL)
        with self.assertRaises(TypeError):
            eng.dispatch(["not a task"])
        with self.assertRaises(TypeError):
            fanout.Task("x", 42)
        with self.assertRaises(ValueError):
            eng.dispatch([fanout.Task("x", sleeper, 0)], deadline=-1)
        self.assertEqual(eng.stats()["dispatched"], 0)

    async def test_a_bad_thread_pool_size_is_refused_at_once(self):
        # threads=0 (or "8") was accepted, and the pool, made at the first
        # plain-function child, raised inside the loop's reader: that
        # child never completed and its delegation never ended.
        for bad, exc in ((0, ValueError), (-1, ValueError),
                         ("8", TypeError), (True, TypeError)):
            with self.assertRaises(exc):
                fanout.Engine(threads=bad)
        eng = await self.engine(threads=1)
        ev = await asyncio.wait_for(
            eng.gather([fanout.Task("p", lambda: "ok")]), LONG)
        self.assertEqual(ev.results[0].summary, "ok")


    async def test_out_of_range_arguments_are_refused_before_anything(self):
        # deadline=inf, quorum=-1 and the like went through to cffi, which
        # raised OverflowError/TypeError (deadline=inf: from int(), quorum
        # 2**40: while filling the batch) instead of a clear refusal.
        # Each bad argument is a ValueError or TypeError now, raised
        # before anything is dispatched or changed.
        for kw in (dict(workers=-1), dict(max_async=2**32),
                   dict(spin_ns=-5), dict(max_depth=2**70)):
            with self.assertRaises(ValueError, msg=kw):
                fanout.Engine(**kw)
        for kw in (dict(workers="2"), dict(max_tasks=1.5),
                   dict(keep_completed=True)):
            with self.assertRaises(TypeError, msg=kw):
                fanout.Engine(**kw)
        eng = await self.engine()
        task = [fanout.Task("x", sleeper, 0), fanout.Task("y", sleeper, 0)]
        bad = [
            (ValueError, dict(deadline=float("inf"))),
            (ValueError, dict(deadline=float("nan"))),
            (ValueError, dict(deadline=-0.5)),
            (ValueError, dict(deadline=0)),
            (ValueError, dict(deadline=10**400)),
            (ValueError, dict(deadline=31 * 24 * 3600)),  # > 30 days
            (TypeError, dict(deadline="5")),
            (TypeError, dict(deadline=True)),
            (ValueError, dict(join="quorum", quorum=-1)),
            (ValueError, dict(join="quorum", quorum=2**40)),
            (ValueError, dict(join="quorum", quorum=3)),  # > ntasks
            (ValueError, dict(join="quorum")),
            (ValueError, dict(join="all", quorum=1)),
            (TypeError, dict(join="quorum", quorum="2")),
            (TypeError, dict(join="quorum", quorum=1.5)),
            (TypeError, dict(join=["all"])),
            (TypeError, dict(sink="default")),
        ]
        other = fanout.Engine(workers=1, pin=False)
        await other.__aenter__()
        self.addAsyncCleanup(other.aclose)
        bad.append((ValueError, dict(sink=other.sink())))
        for exc, kw in bad:
            with self.assertRaises(exc, msg=kw):
                eng.dispatch(task, **kw)
            with self.assertRaises(exc, msg=kw):
                await eng.gather(task, **kw)
            with self.assertRaises(exc, msg=kw):
                await eng.delegate(task, **kw)
        self.assertEqual(eng.stats()["dispatched"], 0)
        self.assertEqual(eng.list(), [])
        self.assertEqual(eng._batches, {})
        for exc, id in ((ValueError, -1), (ValueError, 2**64),
                        (ValueError, 0), (ValueError, "deleg_zz"),
                        (ValueError, "deleg_" + "f" * 17),
                        (TypeError, 1.5), (TypeError, True)):
            with self.assertRaises(exc, msg=id):
                eng.cancel(id)
            with self.assertRaises(exc, msg=id):
                eng.lookup(id)
        for exc, ns in ((ValueError, -1), (ValueError, 2**64),
                        (ValueError, float("inf")), (TypeError, "5")):
            with self.assertRaises(exc, msg=ns):
                fanout.nanoseconds(ns)
        with self.assertRaises(ValueError):
            fanout.builtin("no such child")
        with self.assertRaises(TypeError):
            await eng.events("default").__anext__()
        seen = []

        def child():
            cur = fanout.current()
            for exc, x in ((ValueError, 10**400), (TypeError, "1.5"),
                           (ValueError, float("nan"))):
                try:
                    cur.add_cost(x)
                    seen.append(None)
                except exc:
                    seen.append(exc)
            cur.add_cost(0.5)

        ev = await asyncio.wait_for(eng.gather([fanout.Task("c", child)]),
                                    LONG)
        self.assertEqual(seen, [ValueError, TypeError, ValueError])
        self.assertEqual(ev.cost, 0.5)
        self.assertEqual(eng.stats()["dispatched"], 1)


    async def straggler_racing_aclose(self, call):
        # A thread (one a plain-function child left behind, or the
        # user's) makes call(eng) and is preempted just before its C call
        # on the engine, while the loop closes the engine.  The close
        # used to run to the end and free the engine under it: the call
        # then used the destroyed engine (fanout_cancel on freed memory;
        # here, where it had not read the pointer yet, cffi refused the
        # None it found instead).
        # Now the close waits for it (close_waits_users releases it).
        eng = await self.engine()
        inside, go = threading.Event(), threading.Event()
        out = []

        def tp(name, obj):
            if name == "engine_call" and obj is eng and \
                    threading.current_thread() is t:
                inside.set()
                self.assertTrue(go.wait(LONG))
                out.append(("alive", eng._e is not None))
            elif name == "close_waits_users" and obj is eng:
                go.set()

        def run():
            try:
                out.append(("ok", call(eng, hung)))
            except BaseException as e:  # noqa: B902 - checked below
                out.append(("raised", e))

        self.set_test_point(tp)
        t = threading.Thread(target=run)
        hung = eng.dispatch([fanout.Task("h", hang)])
        t.start()
        await self.wait_thread_event(inside)
        close = asyncio.ensure_future(eng.aclose())
        await asyncio.wait_for(asyncio.shield(close), LONG)
        go.set()  # (the close set it, unless it did not wait)
        await asyncio.get_running_loop().run_in_executor(None, t.join, LONG)
        self.assertFalse(t.is_alive())
        self.assertEqual(out[0], ("alive", True), out)
        self.assertEqual(out[1][0], "ok", out)
        self.assertEqual((await hung).status, "interrupted")
        self.set_test_point(None)
        # Once closed, the same calls refuse or report "finished".
        self.assertFalse(hung.cancel())
        with self.assertRaisesRegex(RuntimeError, "not open"):
            eng.dispatch([fanout.Task("late", sleeper, 0)])
        with self.assertRaisesRegex(RuntimeError, "not open"):
            eng.lookup(hung)
        self.assertClean(eng)
        return out[1][1]

    async def test_a_straggler_cancel_racing_aclose_waits_for_it(self):
        self.assertTrue(await self.straggler_racing_aclose(
            lambda eng, hung: hung.cancel()))

    async def test_a_straggler_dispatch_racing_aclose_gets_its_event(self):
        late = await self.straggler_racing_aclose(
            lambda eng, hung: eng.dispatch([fanout.Task("late", hang)]))
        self.assertIsInstance(late, fanout.Handle)
        ev = await asyncio.wait_for(late, LONG)
        self.assertEqual((ev.status, ev.cancelled), ("interrupted", True))


if __name__ == "__main__":
    unittest.main()


class TestCrossLoop(Base):
    """Two engines, each on its own thread's event loop."""

    async def test_held_parent_finishes_on_its_own_engines_loop(self):
        # A child of engine A (this loop) delegates, through
        # run_coroutine_threadsafe, to engine B on another thread's loop,
        # whose pool is full: an inline run of B hanging from A's child.
        # A's child returns meanwhile, so its completion is held until
        # B's run returns.  B's loop then finished A's child itself (A's
        # _complete, A's dicts and asyncio.Event) on B's loop thread.
        # Now it hands the completion to A's loop.
        a = await self.engine()
        a_thread = threading.get_ident()
        loop_b = asyncio.new_event_loop()
        b_ready = threading.Event()
        release = threading.Event()

        def full_b():
            release.wait(LONG)
            return "full"

        engines = {}

        def b_main():
            asyncio.set_event_loop(loop_b)

            async def open_b():
                engines["b"] = fanout.Engine(workers=2, pin=False,
                                             max_async=1)
                engines["b"].open()
                # B's async pool is full: A's child's delegate() to B
                # runs inline (_run_inline), hanging from A's child.
                engines["b"].dispatch([fanout.Task("full", full_b)])
            loop_b.run_until_complete(open_b())
            b_ready.set()
            loop_b.run_forever()

        tb = threading.Thread(target=b_main)
        tb.start()

        def stop_b():
            release.set()

            async def close_b():
                await engines["b"].aclose()
            asyncio.run_coroutine_threadsafe(close_b(), loop_b).result(LONG)
            loop_b.call_soon_threadsafe(loop_b.stop)
            tb.join(LONG)
            loop_b.close()
        self.addCleanup(stop_b)
        self.assertTrue(b_ready.wait(LONG))
        inner_started = threading.Event()
        held = threading.Event()
        completed_on = []

        def tp(name, c):
            if name == "complete_held":
                held.set()
            elif name == "completed" and c.engine is a:
                completed_on.append(threading.get_ident())

        self.set_test_point(tp)

        def inner():
            inner_started.set()
            release.wait(LONG)
            return "inner"

        async def parent():
            asyncio.run_coroutine_threadsafe(
                engines["b"].delegate([fanout.Task("inner", inner)]), loop_b)
            await self.wait_thread_event(inner_started)
            return "parent"  # while B's run still hangs from this child

        h = a.dispatch([fanout.Task("p", parent)])
        await self.wait_thread_event(held)
        release.set()
        ev = await asyncio.wait_for(h, LONG)
        self.assertEqual(ev.results[0].status, "completed")
        self.assertEqual(completed_on, [a_thread])
