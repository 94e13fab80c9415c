# SPDX-License-Identifier: MIT
"""fanout for asyncio: dispatch a batch of children, get ONE event back.

    import asyncio, fanout

    async def research(topic):
        await asyncio.sleep(0.1)          # an LLM call, a tool, ...
        return f"notes on {topic}"

    async def main():
        async with fanout.Engine(workers=2) as eng:
            ev = await eng.gather([fanout.Task(t, research, t)
                                   for t in ("caches", "queues", "locks")])
            print(ev.format())            # TASK 1/3: caches (status=...) ...

    asyncio.run(main())

Children:
  - an `async def` runs on the engine's event loop, as a deferred child of
    the C library: it holds no worker while it awaits, asyncio
    cancellation means "interrupted", and an interrupt from fanout
    (cancel, deadline, join policy, session cancel, leaving `async with`)
    cancels the coroutine;
  - a plain function runs in a thread of the engine's pool, also as a
    deferred child (poll fanout.current().interrupted in long ones);
  - a C child (fanout.c_child(library, symbol), or fanout.builtin(name))
    runs on the workers, without the GIL.
No Python code runs on a fanout worker thread: a Python child is, to the
library, a small C function that defers itself and hands the pending child
to the loop through an eventfd (see _glue.c).  Completion events wake the
loop through the sink's eventfd (loop.add_reader), never by polling.
"""
from __future__ import annotations  # annotations stay unevaluated

import asyncio
import concurrent.futures
import contextvars
import errno as _errno
import functools
import inspect
import itertools
import math
import numbers
import operator
import os
import threading
import weakref
from typing import (Any, AsyncIterator, Callable, Dict, Iterable, List,
                    Optional, Union)

from ._fanout import ffi, lib

__all__ = [
    "Engine", "Task", "Event", "Result", "Handle", "Sink", "Info",
    "BusyError", "current", "c_child", "builtin", "CChild", "Counter",
    "nanoseconds", "HAVE_DEFERRED",
]

HAVE_DEFERRED = bool(lib.PYFO_HAVE_DEFER)
_HAVE_V02 = bool(lib.PYFO_HAVE_V02_BATCH)

_STATUS = {
    lib.FANOUT_PENDING: "pending",
    lib.FANOUT_RUNNING: "running",
    lib.FANOUT_COMPLETED: "completed",
    lib.FANOUT_ERROR: "error",
    lib.FANOUT_INTERRUPTED: "interrupted",
}

if _HAVE_V02:
    _JOIN = {
        "all": lib.FANOUT_JOIN_ALL,
        "first_error": lib.FANOUT_JOIN_FIRST_ERROR,
        "any": lib.FANOUT_JOIN_ANY,
        "quorum": lib.FANOUT_JOIN_QUORUM,
    }
    _ABANDON = lib.FANOUT_CANCEL_ABANDON
else:
    _JOIN = {"all": 0}
    _ABANDON = 0

_TAKE_CAP = 256

# Test points: None, or f(name, obj), called at a few places where the
# suite must force one interleaving of threads (it may block the calling
# thread).  Not an API: python/tests sets it, nothing else.
_test_point = None


class BusyError(OSError):
    """A refusal at capacity (errno EBUSY); the message names the limit."""

    def __init__(self, message):
        super().__init__(_errno.EBUSY, message)


def _error(rc, engine=None):
    """The exception for a negative errno from the library."""
    msg = None
    if engine is not None and engine._e is not None:
        n = lib.fanout_describe_error(engine._e, rc, ffi.NULL, 0)
        if n > 0:
            buf = ffi.new("char[]", n + 1)
            lib.fanout_describe_error(engine._e, rc, buf, n + 1)
            msg = ffi.string(buf).decode("utf-8", "replace")
    if msg is None:
        msg = ffi.string(lib.fanout_strerror(rc)).decode("utf-8", "replace")
    if -rc == _errno.EBUSY:
        return BusyError(msg)
    return OSError(-rc, msg)


def _fmt_id(i):
    return "deleg_%016x" % i


_UINT_MAX = 2 ** 32 - 1
_U64_MAX = 2 ** 64 - 1


def _parse_id(id):
    """id (an int, "deleg_<hex>" or a Handle) as a fanout_id.  Checked
    here: cffi would raise OverflowError for one out of range."""
    if isinstance(id, Handle):
        return id._id
    if isinstance(id, str):
        try:
            if not id.startswith("deleg_"):
                raise ValueError
            n = int(id[6:], 16)
        except ValueError:
            raise ValueError(f"not a delegation id: {id!r}") from None
    elif isinstance(id, int) and not isinstance(id, bool):
        n = id
    else:
        raise TypeError(f"a delegation id is an int, a \"deleg_...\" str "
                        f"or a Handle, not {type(id).__name__}")
    if not 0 < n <= _U64_MAX:
        raise ValueError(f"not a delegation id: {id!r}")
    return n


def _uint(name, v, hi):
    """v, an int in [0, hi] (a C unsigned of that range), or raise
    TypeError / ValueError naming `name`."""
    if isinstance(v, bool) or not hasattr(type(v), "__index__"):
        raise TypeError(f"{name} must be an int, not {type(v).__name__}")
    v = operator.index(v)
    if not 0 <= v <= hi:
        raise ValueError(f"{name} must be in [0, {hi}], not {v}")
    return v


def _seconds(name, x):
    """x, a real number of seconds, as a float (inf when too large for a
    float); TypeError for anything else."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, not "
                        f"{type(x).__name__}")
    try:
        return float(x)
    except OverflowError:
        return math.inf


def _flag(cev, name):
    """A bool field of the v0.2 event (False without it)."""
    if not HAVE_DEFERRED:
        return False
    try:
        return bool(getattr(cev, name))
    except ValueError:  # a library older than its header left it unset
        return False


def _s(p):
    return None if p == ffi.NULL else ffi.string(p).decode("utf-8", "replace")


# ------------------------------------------------------------------ children

class CChild:
    """A C child (a fanout_fn) that runs on the workers, without the GIL.

    Made by c_child() or builtin(); Task(goal, cchild, arg) passes arg as
    its `void *arg`: None (NULL), an int (an address), bytes/bytearray (a
    buffer kept alive until the event is in), or a cffi pointer.
    """

    def __init__(self, fnptr, name, keep=None):
        self._fn = ffi.cast("fanout_fn", fnptr)
        self.name = name
        self._keep = keep

    def __repr__(self):
        return f"<fanout.CChild {self.name}>"


_dl_handles = {}


def c_child(library: Union[str, bytes, os.PathLike],
            symbol: str) -> CChild:
    """The C child `symbol` (int symbol(struct fanout_child *, void *)) from
    the shared library at path `library` (dlopen, RTLD_NOW | RTLD_LOCAL).
    The library may call fanout_* functions of the running child only if it
    links the same fanout as this package: use libfanout.so's symbols only
    for what the child is given."""
    if not isinstance(symbol, str):
        raise TypeError(f"symbol must be a str, not {type(symbol).__name__}")
    h = _dl_handles.get(library)
    if h is None:
        h = lib.dlopen(os.fsencode(library), lib.RTLD_NOW | lib.RTLD_LOCAL)
        if h == ffi.NULL:
            raise OSError(_errno.ENOENT, _s(lib.dlerror()) or library)
        _dl_handles[library] = h
    p = lib.dlsym(h, symbol.encode())
    if p == ffi.NULL:
        raise OSError(_errno.ENOENT, _s(lib.dlerror()) or symbol)
    return CChild(p, f"{library}:{symbol}")


# (ffi.addressof: a function pointer with every cffi version)
_BUILTIN = {
    "noop": "pyfo_child_noop",    # arg: None
    "spin": "pyfo_child_spin",    # arg: nanoseconds(ns): busy-wait
    "sleep": "pyfo_child_sleep",  # arg: nanoseconds(ns): sleep, 1 ms steps
    "tick": "pyfo_child_tick",    # arg: Counter(): bump until stopped
}
_DEFER_FN = ffi.cast("fanout_fn", ffi.addressof(lib, "pyfo_defer_child"))
_RUN_CHILD_FN = ffi.cast("fanout_fn", ffi.addressof(lib, "pyfo_run_child"))


def builtin(name: str) -> CChild:
    """A C child compiled into this package: "noop", "spin", "sleep" (arg:
    fanout.nanoseconds(ns)) or "tick" (arg: a fanout.Counter)."""
    try:
        sym = _BUILTIN[name]
    except (KeyError, TypeError):
        raise ValueError(f"no builtin C child {name!r} (one of "
                         f"{sorted(_BUILTIN)})") from None
    return CChild(ffi.addressof(lib, sym), name)


def nanoseconds(ns: Union[int, float]) -> Any:
    """The argument of builtin("spin") and builtin("sleep"): a number of
    nanoseconds in [0, 2**64 - 1]."""
    if isinstance(ns, bool) or not isinstance(ns, numbers.Real):
        raise TypeError(f"nanoseconds takes a number, not "
                        f"{type(ns).__name__}")
    if isinstance(ns, float) and not math.isfinite(ns):
        raise ValueError(f"nanoseconds must be finite, not {ns!r}")
    n = int(ns)
    if not 0 <= n <= _U64_MAX:
        raise ValueError(f"nanoseconds must be in [0, 2**64 - 1], not {ns!r}")
    return ffi.new("uint64_t *", n)


class Counter:
    """Two uint64 words a builtin("tick") child bumps / stops on, read
    without the GIL on the C side."""

    def __init__(self):
        self._mem = ffi.new("uint64_t[2]")

    @property
    def value(self) -> int:
        """How many steps the tick children made so far."""
        return lib.pyfo_load(self._mem)

    def stop(self) -> None:
        """Tell the tick children to return (their summary: their steps)."""
        lib.pyfo_store(self._mem + 1, 1)

    def _arg(self):
        return self._mem


def _is_async(fn):
    """fn(...) gives a coroutine: an `async def`, a functools.partial of
    one (at any depth), or an object whose __call__ is an `async def`."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    if inspect.isroutine(fn) or isinstance(fn, type):
        return False
    return inspect.iscoroutinefunction(getattr(type(fn), "__call__", None))


class Task:
    """One child: Task(goal, fn, *args).

    fn is an `async def` (awaited on the engine's loop), a plain function
    (called in a thread) or a CChild (run on the workers, with at most one
    argument).  The child's return value, as str, is its summary (None: no
    summary); an exception makes it an error, with the exception's text.
    """

    __slots__ = ("goal", "fn", "args", "kind", "_cgoal")

    def __init__(self, goal: object, fn: Union[Callable[..., Any], CChild],
                 *args: Any) -> None:
        self.goal = str(goal)
        self._cgoal = None  # the goal as a C string, made once
        self.fn = fn
        self.args = args
        if isinstance(fn, CChild):
            if len(args) > 1:
                raise TypeError("a C child takes at most one argument")
            self.kind = "c"
        elif _is_async(fn):
            self.kind = "async"
        elif callable(fn):
            self.kind = "thread"
        else:
            raise TypeError(f"a Task needs a callable, got {fn!r}")

    def __repr__(self):
        return f"<fanout.Task {self.goal!r} ({self.kind})>"


class ChildContext:
    """fanout.current() inside a Python child."""

    __slots__ = ("_child",)

    def __init__(self, child):
        self._child = child

    @property
    def index(self) -> int:
        return self._child.index

    @property
    def id(self) -> str:
        return _fmt_id(self._child.id)

    @property
    def goal(self) -> str:
        return self._child.batch.tasks[self._child.index].goal

    @property
    def engine(self) -> Engine:
        return self._child.engine

    @property
    def interrupted(self) -> bool:
        """True once fanout interrupted the delegation (cancel, deadline,
        join policy, session cancel, shutdown)."""
        c = self._child
        if c.interrupted:
            return True
        # Read from any thread (a thread child, or a thread its coroutine
        # started with the context copied), while the loop may complete
        # the child: fanout_complete() releases c.p, so the look at c.done
        # and the call on c.p must not straddle it (c.lock, which
        # _complete holds across fanout_complete).
        with c.lock:
            if c.done:
                return c.interrupted
            p = c.p
            if _test_point is not None:
                _test_point("interrupted", c)
            return bool(lib.fanout_pending_interrupted(p))

    def add_cost(self, x: Union[int, float]) -> None:
        """Add x (finite, >= 0) to the child's cost.  ValueError, and the
        cost is unchanged, for a bad x or when the sum would overflow.
        RuntimeError, changing nothing, once the child has ended: it
        returned (a thread it started may outlive it), or the library
        finished it (cancel with abandon, deadline, join policy, close)
        while its code still runs.  Its cost is in the event then, and a
        later addition would be lost without a word."""
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise TypeError(f"cost must be a number, not {type(x).__name__}")
        try:
            x = float(x)
        except OverflowError:  # an int too large for a float
            raise ValueError(f"cost must be finite, not {x!r}") from None
        if not math.isfinite(x) or x < 0:
            raise ValueError("cost must be finite and >= 0")
        c = self._child
        # c.lock: _complete sets c.done and releases c.p under it, so c.p
        # is valid here.  The pending child holds the sum
        # (fanout_pending_add_cost), and whoever finishes it - _complete's
        # fanout_complete or the library's abandon - takes it: an
        # addition is counted or refused, never lost.
        with c.lock:
            if c.done:
                raise RuntimeError(
                    f"fanout: child {c.index} of {_fmt_id(c.id)} has "
                    f"ended; its cost is final (add_cost({x!r}) ignored)")
            if _test_point is not None:
                _test_point("add_cost", c)
            rc = lib.fanout_pending_add_cost(c.p, x)
            if rc == -_errno.EALREADY:
                raise RuntimeError(
                    f"fanout: child {c.index} of {_fmt_id(c.id)} was "
                    f"abandoned (cancel with abandon, deadline, join "
                    f"policy or close): its event is out and its cost is "
                    f"final (add_cost({x!r}) ignored)")
            if rc:
                raise ValueError(f"the child's cost would overflow "
                                 f"({c.cost!r} + {x!r})")
            c.cost += x


_current = contextvars.ContextVar("fanout_current", default=None)


def current() -> Optional[ChildContext]:
    """The ChildContext of the Python child running here, or None."""
    return _current.get()


class _PyChild:
    __slots__ = ("engine", "p", "id", "index", "batch", "task", "cost",
                 "done", "interrupted", "kind", "lock", "runs", "held",
                 "__weakref__")

    def __init__(self, engine, p, id, index, batch):
        self.engine = engine
        self.p = p
        self.id = id
        self.index = index
        self.batch = batch
        self.task = None
        self.cost = 0.0
        self.done = False
        self.interrupted = False
        self.kind = batch.tasks[index].kind
        # Held by _complete across fanout_complete(p) (which releases p)
        # and by ChildContext.interrupted across its use of p.
        self.lock = threading.Lock()
        # Inline runs started with p as their fanout_batch.within that
        # have not returned, and the outcome held back for them.
        self.runs = 0
        self.held = None


# -------------------------------------------------------------------- events

class Result:
    """One child's outcome (ev.results[i])."""

    __slots__ = ("index", "status", "goal", "summary", "error", "cost",
                 "duration", "code")

    def __init__(self, r):
        self.index = r.index
        self.status = _STATUS.get(r.status, "unknown")
        self.goal = _s(r.goal)
        self.summary = _s(r.summary)
        self.error = _s(r.error)
        self.cost = r.cost
        self.duration = r.duration_ns / 1e9
        self.code = r.code

    def __repr__(self):
        return (f"<Result {self.index} {self.status} "
                f"{self.summary if self.status == 'completed' else self.error!r}>")


class Event:
    """The one completion event of a delegation.

    id ("deleg_..."), status ("completed" | "error" | "interrupted"),
    results (in task order), context, session_key, error, cost, duration
    (dispatch to event, seconds), timed_out, cancelled; format() is the
    consolidated "TASK i/n" text block, json() the same as JSON.
    """

    def __init__(self, cev):
        self._c = ffi.gc(cev, lib.fanout_event_free)
        self._id = cev.id
        self.id = _fmt_id(cev.id)
        self.status = _STATUS.get(cev.status, "unknown")
        self.context = _s(cev.context)
        self.session_key = _s(cev.session_key)
        self.error = _s(cev.error)
        self.cost = cev.cost
        self.duration = (cev.completed_ns - cev.dispatched_ns) / 1e9
        self.cancelled = bool(cev.cancelled)
        self.timed_out = _flag(cev, "timed_out")
        self.interrupted_by_policy = _flag(cev, "interrupted_by_policy")
        self.ncompleted = cev.ncompleted
        self.nerror = cev.nerror
        self.ninterrupted = cev.ninterrupted
        self.mode = "background"
        self._results = None
        self._text = None
        self._json = None

    @property
    def results(self) -> List[Result]:
        """The children's Results, in task order (index i at [i])."""
        if self._results is None:
            c = self._c
            self._results = [Result(c.results[i]) for i in range(c.nresults)]
        return self._results

    def _render(self, fn):
        n = fn(self._c, ffi.NULL, 0)
        if n < 0:
            raise _error(n)
        buf = ffi.new("char[]", n + 1)
        fn(self._c, buf, n + 1)
        return ffi.string(buf).decode("utf-8", "replace")

    def format(self) -> str:
        """The consolidated "TASK i/n: goal (status=...)" text block
        (fanout_format), the one message to hand back to a model."""
        if self._text is None:
            self._text = self._render(lib.fanout_format)
        return self._text

    def json(self) -> str:
        """The event as a JSON text (fanout_event_json)."""
        if self._json is None:
            self._json = self._render(lib.fanout_event_json)
        return self._json

    def _detach(self):
        """Copy everything out of the C event and free it (the engine is
        going away; its events die with it)."""
        if self._c is not None:
            self.results, self.format(), self.json()
            ffi.release(self._c)
            self._c = None

    def __repr__(self):
        return f"<fanout.Event {self.id} {self.status} {self.ncompleted}/" \
               f"{self.ncompleted + self.nerror + self.ninterrupted}>"


class Info:
    """A snapshot of one record (lookup, list)."""

    __slots__ = ("id", "status", "ntasks", "ndone", "cost", "depth",
                 "background", "cancelled", "session_key", "npending",
                 "running_for")

    def __init__(self, i, now_ns):
        self.id = _fmt_id(i.id)
        self.status = _STATUS.get(i.status, "unknown")
        self.ntasks = i.ntasks
        self.ndone = i.ndone
        self.cost = i.cost
        self.depth = i.depth
        self.background = bool(i.background)
        self.cancelled = bool(i.cancelled)
        # (only from a library that implements 0.2: fields of an older one
        # are left unset)
        self.session_key = _s(i.session_key) if HAVE_DEFERRED else None
        self.npending = i.npending if HAVE_DEFERRED else 0
        end = i.completed_ns or now_ns
        self.running_for = (end - i.dispatched_ns) / 1e9

    def __repr__(self):
        return f"<fanout.Info {self.id} {self.status} " \
               f"{self.ndone}/{self.ntasks}>"


# ------------------------------------------------------------------- handles

class Handle:
    """A delegation in flight: `await h` gives its Event; h.id is
    "deleg_..."; h.mode is "background", "inline" (delegated from inside a
    child: it already ran) or "inline_full" (the async pool was full, so it
    ran inline; h.message says why)."""

    def __init__(self, engine, id, fut, mode="background", message=None):
        self._engine = engine
        self._id = id
        self.id = _fmt_id(id) if id else None
        self._fut = fut
        self.mode = mode
        self.message = message

    def __await__(self):
        return asyncio.shield(self._fut).__await__()

    def done(self) -> bool:
        """True once the event is in (h.event, or await h)."""
        return self._fut.done()

    @property
    def event(self) -> Optional[Event]:
        """The Event once it is in, else None."""
        return self._fut.result() if self._fut.done() else None

    def cancel(self, interrupt: bool = True, abandon: bool = False) -> bool:
        """Cancel the delegation: unstarted children are not run; with
        interrupt, running ones are interrupted (Python coroutines are
        cancelled); with abandon, pending Python children are reported
        interrupted at once.  Returns False when it had finished already."""
        return self._engine._cancel(self._id, interrupt, abandon)

    def __repr__(self):
        return f"<fanout.Handle {self.id} {self.mode}" \
               f"{' done' if self.done() else ''}>"


class _Batch:
    __slots__ = ("token", "tasks", "cbatch", "keep", "fut", "sink",
                 "nstarted", "awaited", "inline", "cancelled", "run", "id",
                 "parent", "context")

    def __init__(self, token, tasks):
        self.token = token
        self.tasks = tasks
        # The dispatcher's contextvars, which its Python children see.
        self.context = contextvars.copy_context()
        self.cbatch = None
        self.keep = None
        self.fut = None
        self.sink = None
        self.nstarted = 0
        self.awaited = False  # gather(): the event goes to its caller only
        self.inline = False   # fanout_run on a thread of its own
        self.cancelled = False  # its awaiting task was cancelled
        self.run = None  # an inline run's struct pyfo_run (see _glue.c)
        self.id = 0  # an inline run's id, once a Python child started
        self.parent = None  # the _PyChild an inline run's within names


_MAX_DEADLINE_NS = lib.FANOUT_MAX_DEADLINE_NS if _HAVE_V02 else 0


def _policy(deadline, join, quorum, ntasks):
    """(deadline_ns, join, quorum) of a batch of ntasks, checked: what the
    library would refuse, or cffi could not store, is a ValueError or
    TypeError here, before anything is made."""
    if not isinstance(join, str):
        raise TypeError(f"join must be a str, not {type(join).__name__}")
    if join not in ("all", "first_error", "any", "quorum"):
        raise ValueError(f"join must be one of {sorted(_JOIN)}, "
                         f"not {join!r}")
    if quorum is not None:
        quorum = _uint("quorum", quorum, _UINT_MAX)
    if join == "quorum":
        if not quorum or quorum > ntasks:
            raise ValueError(f"join=\"quorum\" needs 1 <= quorum <= "
                             f"{ntasks} (the number of tasks), not "
                             f"{quorum!r}")
    elif quorum:
        raise ValueError(f"quorum={quorum} goes only with "
                         f"join=\"quorum\", not join={join!r}")
    ns = 0
    if deadline is not None:
        d = _seconds("deadline", deadline)
        if not d > 0:  # (NaN too)
            raise ValueError(f"deadline must be > 0 seconds, not "
                             f"{deadline!r}")
        if _HAVE_V02 and d * 1e9 > _MAX_DEADLINE_NS:
            raise ValueError(f"deadline must be at most "
                             f"{_MAX_DEADLINE_NS / 1e9:g} seconds (30 days), "
                             f"not {deadline!r}")
        ns = max(1, int(d * 1e9))
    if (ns or join != "all" or quorum) and not _HAVE_V02:
        raise NotImplementedError("deadline/join need fanout 0.2")
    return ns, _JOIN.get(join, 0), quorum or 0


class Sink:
    """Where events go.  Every engine has a default sink; eng.sink() makes
    more.  Each handle's event resolves the handle whatever the sink;
    `async for ev in eng.events(sink)` also yields them, in completion
    order: a sink made with eng.sink() keeps its events for events() from
    the start, the default sink from the first events() call on."""

    def __init__(self, engine, csink, default):
        self._engine = engine
        self._c = csink
        self._default = default
        self._queue = None if default else asyncio.Queue()
        self._fd = lib.fanout_sink_fd(csink)

    def close(self) -> None:
        """Free the sink.  Events already in it are delivered first (their
        handles resolve, events() yields them, then ends).  BusyError while
        delegations still publish to it: wait for or cancel them first."""
        if self._default or self._c is None:
            return
        eng = self._engine
        # Take what is queued: fanout_sink_destroy() would free those
        # events, and their handles would never resolve.
        eng._drain_sink(self)
        # Once no batch of ours targets the sink, nothing can publish to
        # it any more, so nothing can be queued between here and destroy.
        if any(b.sink is self for b in eng._batches.values()):
            raise BusyError("fanout: delegations still publish to this "
                            "sink; wait for or cancel them first")
        rc = lib.fanout_sink_destroy(self._c)
        if rc:
            raise _error(rc, eng)
        eng._loop.remove_reader(self._fd)
        eng._sinks.remove(self)
        self._c = None
        if self._queue is not None:
            self._queue.put_nowait(None)  # events(self) ends


# -------------------------------------------------------------------- engine

class Engine:
    """`async with fanout.Engine(workers=None, max_async=256, ...) as eng:`

    workers, max_async, max_children, max_tasks, max_depth, keep_completed,
    spin_ns: as struct fanout_config (None = the library's default);
    pin: pin workers to CPUs (library default: yes); threads: the pool
    for plain-function children (default 32); runners_on_demand:
    FANOUT_RUNNERS_ON_DEMAND (default off): a batch starts with one
    runner and gets more once its C children prove slow (20 us or more
    left) or a child defers, which Python children always do.  Faster for
    batches of quick C children; a batch of C children that compute can
    take up to one child's duration longer.
    """

    def __init__(self, workers: Optional[int] = None,
                 max_async: Optional[int] = 256,
                 max_children: Optional[int] = None,
                 max_tasks: Optional[int] = None,
                 max_depth: Optional[int] = None,
                 keep_completed: Optional[int] = None,
                 spin_ns: Optional[int] = None, pin: bool = True,
                 threads: Optional[int] = 32,
                 runners_on_demand: bool = False) -> None:
        self._cfg = dict(workers=workers, max_async=max_async,
                         max_children=max_children, max_tasks=max_tasks,
                         max_depth=max_depth, keep_completed=keep_completed,
                         spin_ns=spin_ns)
        # Checked here, not by cffi at open() (OverflowError, TypeError).
        for k, v in self._cfg.items():
            if v is not None:
                self._cfg[k] = _uint(
                    k, v, _U64_MAX if k == "spin_ns" else _UINT_MAX)
        self._pin = pin
        self._on_demand = bool(runners_on_demand)
        # Checked here: the pool is made at the first plain-function child,
        # on the loop, where a refusal would strand that child.
        if threads is not None:
            if isinstance(threads, bool):
                raise TypeError("threads must be an int")
            threads = operator.index(threads)
            if threads < 1:
                raise ValueError(f"threads must be >= 1, not {threads}")
        self._nthreads = threads
        self._e = None
        self._glue = None
        self._loop = None
        self._batches = {}
        self._children = {}
        # Tokens name batches to the events that come back; next() is one
        # step under the GIL, so a child's thread that dispatches never
        # draws the loop's token.
        self._tokens = itertools.count(1)
        self._loop_thread = None
        self._sinks = []
        self._default = None
        self._events = weakref.WeakSet()
        self._executor = None
        self._threads = set()  # inline runs' threads (fanout_run)
        self._idle = None
        self._closing = False
        # Calls that may come from any thread (a plain-function child's,
        # or one that outlives it, or the user's) use the C engine between
        # _enter() and _leave(); the close waits under _lock until none
        # is between them, and _free sets _e to None under it before
        # fanout_destroy.  Held only by those calls and the close, never
        # by a child's start or completion.
        self._lock = threading.Lock()
        self._unused = threading.Condition(self._lock)
        self._users = 0
        self._close_task = None  # aclose()'s work, shielded from its caller
        self._tasks_running = set()
        self.orphan_events = 0   # events no handle waited for (never, we hope)
        self.duplicate_events = 0
        # Start notes of abandoned children that came after the close's
        # last read; released at close (see pyfo_glue_free).
        self.late_starts = 0

    # -- lifetime
    async def __aenter__(self) -> Engine:
        self.open()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def open(self) -> Engine:
        """Create the C engine on the running event loop (`async with`
        calls it); a no-op while open.  An engine closed by aclose()
        opens again, on whatever loop runs then."""
        if self._e is not None:
            return self
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        cfg = ffi.new("struct fanout_config *")
        for k, v in self._cfg.items():
            if v is not None:
                setattr(cfg, k, v)
        if not self._pin:
            cfg.flags |= lib.FANOUT_NO_PIN
        if self._on_demand:
            cfg.flags |= lib.FANOUT_RUNNERS_ON_DEMAND
        ep = ffi.new("struct fanout_engine **")
        rc = lib.fanout_create(cfg, ep)
        if rc:
            raise _error(rc)
        self._e = ep[0]
        self._glue = lib.pyfo_glue_new()
        if self._glue == ffi.NULL:
            lib.fanout_destroy(self._e)
            self._e = None
            raise OSError(_errno.ENOMEM, "fanout: no memory for the glue")
        # After an earlier close: its sinks are freed and its thread pool
        # shut down; nothing of it may be used again.
        self._closing = False
        self._sinks = []
        self._executor = None
        self._default = Sink(self, lib.fanout_default_sink(self._e), True)
        self._sinks.append(self._default)
        self._loop.add_reader(self._default._fd, self._drain_sink,
                              self._default)
        self._loop.add_reader(lib.pyfo_glue_fd(self._glue), self._drain_glue)
        self._starts = ffi.new("struct pyfo_start[]", _TAKE_CAP)
        self._cancels = ffi.new("struct pyfo_start[]", _TAKE_CAP)
        self._nstarts = ffi.new("size_t *")
        self._ncancels = ffi.new("size_t *")
        self._idle = asyncio.Event()
        self._idle.set()
        return self

    async def aclose(self) -> None:
        """Interrupt what still runs, wait for every accepted event and for
        every Python child to return, then free the engine.  Cancelling
        the caller does not cut this short: the engine still closes in
        the background, and every accepted event is still delivered (a
        later aclose() waits for the same close).  From another thread's
        event loop it hands the close to the engine's loop and waits for
        it there.  If the engine's loop was closed with the engine open
        (asyncio.run returned without aclose), it frees the engine from
        the caller's loop: interrupted and abandoned, the handles of that
        dead loop never resolve."""
        if self._e is None:
            return
        if self._loop.is_closed():
            self._close_orphaned()
            return
        if asyncio.get_running_loop() is not self._loop:
            # The close's work (its task, the readers, the waits) belongs
            # to the engine's loop, which asyncio lets no other thread use.
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                self.aclose(), self._loop))
            return
        if self._close_task is None:
            self._close_task = self._loop.create_task(self._close())
        await asyncio.shield(self._close_task)

    def _refuse_new_users(self):
        """From now on calls that start work are refused (ESHUTDOWN); wait
        for those already between _enter and _leave (a dispatch from
        another thread is then in _batches, or refused, before the close
        lists what runs).  Each holds it for one short C call that never
        waits for the loop, so the loop blocks only that long."""
        with self._lock:
            self._closing = True
            busy = self._users
        if busy and _test_point is not None:  # (not under _lock)
            _test_point("close_waits_users", self)
        with self._lock:
            while self._users:
                self._unused.wait()

    async def _close(self):
        try:
            self._refuse_new_users()
            how = lib.FANOUT_CANCEL_INTERRUPT | _ABANDON
            for i in self._running_ids():
                lib.fanout_cancel(self._e, i, how)
            if any(b.inline for b in self._batches.values()):
                # An inline run whose thread had not entered fanout_run
                # yet was not in that list: it would start now, with
                # nobody to cancel it.  fanout_shutdown refuses it
                # (-ESHUTDOWN) or interrupts it.  It blocks until running
                # children return, and Python children need this loop for
                # that: call it from another thread.
                e = self._e

                def shutdown():
                    if _test_point is not None:
                        _test_point("shutdown", self)
                    lib.fanout_shutdown(e)

                await _uncut([self._loop.run_in_executor(None, shutdown)])
            futs = [b.fut for b in self._batches.values()
                    if b.fut is not None]
            if _test_point is not None:
                _test_point("aclose_waits", self)
            await _uncut(futs)
            while self._children or self._tasks_running:
                self._idle.clear()
                await _uncut([self._loop.create_task(self._idle.wait())])
        finally:
            self._free()

    def _close_orphaned(self):
        """aclose() once the engine's loop is closed: nothing can run on
        it, so no Python child can end through it.  fanout_shutdown
        abandons them and interrupts the rest (blocking until C children
        return), _free waits for the threads and frees the engine, then
        each Python child the loop never finished is released
        (fanout_complete on an abandoned child: -EALREADY)."""
        self._refuse_new_users()
        how = lib.FANOUT_CANCEL_INTERRUPT | _ABANDON
        for i in self._running_ids():
            lib.fanout_cancel(self._e, i, how)
        lib.fanout_shutdown(self._e)
        self._free()
        for c in list(self._children.values()):
            self._complete(c, -_errno.ECANCELED, None, None)
        # Their events died with the engine, unread, and their futures
        # belong to the closed loop: nothing will resolve them.
        self._batches.clear()
        self._tasks_running.clear()

    def _running_ids(self):
        """Ids of every running record, for the close to cancel.  Records
        may appear between two fanout_list calls (a child's thread that
        a test forcing it, C children that
        delegate), and fanout_list writes the newest first: an array
        sized from an earlier count would drop the OLDEST runs, which
        would then never be cancelled.  So list again, with room for
        every record the last call saw, until one call fits them all."""
        n = ffi.new("size_t *")
        cap, infos = 0, ffi.NULL
        while True:
            if lib.fanout_list(self._e, infos, cap, n):
                return []  # -EOWNERDEAD: its runs belong to the parent
            if n[0] <= cap:
                return [infos[k].id for k in range(n[0])
                        if infos[k].status == lib.FANOUT_RUNNING]
            if _test_point is not None:
                _test_point("running_ids", self)
            cap = n[0] + 16
            infos = ffi.new("struct fanout_info[]", cap)

    def _free(self):
        loop = self._loop
        for s in self._sinks:
            loop.remove_reader(s._fd)  # (a closed loop has none left)
            s._c = None  # fanout_destroy frees it
            if s._queue is not None and not loop.is_closed():
                s._queue.put_nowait(None)  # events(s) ends
        loop.remove_reader(lib.pyfo_glue_fd(self._glue))
        for ev in list(self._events):
            ev._detach()
        if self._executor:
            self._executor.shutdown(wait=True)
        for t in list(self._threads):
            t.join()  # each has handed its result back: it is returning
        self._threads.clear()
        # Calls that serve a closing engine (cancel, lookup, list, stats)
        # may still be between _enter and _leave on other threads: wait
        # for them, and let no other one in (_e is None), before the free.
        with self._lock:
            while self._users:
                self._unused.wait()
            e, self._e = self._e, None
        lib.fanout_destroy(e)
        self.late_starts += lib.pyfo_glue_free(self._glue)
        self._glue = None
        self._close_task = None

    # -- batches
    def _check_live(self):
        """For the calls that also serve a closing engine."""
        if self._e is None:
            raise RuntimeError("fanout.Engine is not open (it was closed, "
                               "or never opened: use async with)")

    def _check_open(self):
        self._check_live()
        if self._closing:
            raise OSError(_errno.ESHUTDOWN, "fanout: the engine is closing")

    def _enter(self, live_ok=False):
        """Before a use of the C engine from a call any thread may make:
        the engine is not freed until _leave().  RuntimeError once it is
        closed, OSError(ESHUTDOWN) while it closes unless live_ok."""
        with self._lock:
            if live_ok:
                self._check_live()
            else:
                self._check_open()
            self._users += 1
        if _test_point is not None:
            _test_point("engine_call", self)

    def _leave(self):
        with self._lock:
            self._users -= 1
            if not self._users:
                self._unused.notify_all()

    def _make_batch(self, tasks, context, session_key, deadline, join,
                    quorum, sink, inline=False):
        tasks = list(tasks)
        n = len(tasks)
        # Every argument is checked before anything is made or changed.
        for i, t in enumerate(tasks):
            if not isinstance(t, Task):
                raise TypeError(f"tasks[{i}] is not a fanout.Task: {t!r}")
        deadline_ns, cjoin, cquorum = _policy(deadline, join, quorum, n)
        if sink is not None:
            if not isinstance(sink, Sink):
                raise TypeError(f"sink must be a fanout.Sink (eng.sink()), "
                                f"not {type(sink).__name__}")
            if sink._engine is not self:
                raise ValueError("fanout: the sink belongs to another "
                                 "engine")
            if sink._c is None:
                raise ValueError("fanout: the sink is closed")
        token = next(self._tokens)
        b = _Batch(token, tasks)
        ctasks = ffi.new("struct fanout_task[]", max(n, 1))
        keep = [ctasks]
        pyb = None
        wraps = None
        if inline:
            # Its C children start through pyfo_run_child, which cancels
            # the run if the awaiting task was cancelled before the run
            # could be found by id (_cancel_inline).
            b.run = ffi.new("struct pyfo_run *")
            b.run.e = self._e
            wraps = ffi.new("struct pyfo_cwrap[]", max(n, 1))
            keep += [b.run, wraps]
        for i, t in enumerate(tasks):
            g = t._cgoal
            if g is None:
                g = t._cgoal = ffi.new("char[]", t.goal.encode())
            keep.append(g)
            ctasks[i].goal = g
            if t.kind == "c":
                a = t.args[0] if t.args else None
                if wraps is None:
                    ctasks[i].fn = t.fn._fn
                    ctasks[i].arg = self._c_arg(a, keep)
                else:
                    wraps[i].fn = t.fn._fn
                    wraps[i].arg = self._c_arg(a, keep)
                    wraps[i].run = b.run
                    ctasks[i].fn = _RUN_CHILD_FN
                    ctasks[i].arg = wraps + i
            else:
                if not HAVE_DEFERRED:
                    raise NotImplementedError(
                        "Python children need the library's deferred "
                        "children (fanout_defer), missing in this build")
                if pyb is None:
                    pyb = ffi.new("struct pyfo_batch *")
                    pyb.g = self._glue
                    pyb.token = token
                    keep.append(pyb)
                ctasks[i].fn = _DEFER_FN
                ctasks[i].arg = pyb
        cb = ffi.new("struct fanout_batch *")
        cb.tasks = ctasks
        cb.ntasks = n
        if context is not None:
            c = ffi.new("char[]", str(context).encode())
            keep.append(c)
            cb.context = c
        if session_key is not None:
            s = ffi.new("char[]", str(session_key).encode())
            keep.append(s)
            cb.session_key = s
        if sink is not None:
            cb.sink = sink._c
            b.sink = sink
        cb.user = ffi.cast("void *", token)
        if _HAVE_V02:
            cb.deadline_ns = deadline_ns
            cb.join = cjoin
            cb.quorum = cquorum
            cur = _current.get()
            if cur is not None and not cur._child.done:
                cb.within = cur._child.p
                b.parent = cur._child
        b.cbatch = cb
        b.keep = keep
        return b

    @staticmethod
    def _c_arg(a, keep):
        if a is None:
            return ffi.NULL
        if isinstance(a, int):
            return ffi.cast("void *", a)
        if isinstance(a, Counter):
            keep.append(a)
            return a._arg()
        if isinstance(a, (bytes, bytearray, memoryview)):
            buf = ffi.from_buffer(a)
            keep.append((a, buf))
            return buf
        if isinstance(a, ffi.CData):
            keep.append(a)
            return ffi.cast("void *", a)
        raise TypeError(f"a C child's argument must be None, int, bytes, "
                        f"a Counter or a cffi pointer, not {type(a)}")

    def dispatch(self, tasks: Iterable[Task], context: Optional[str] = None,
                 session_key: Optional[str] = None,
                 deadline: Optional[float] = None, join: str = "all",
                 quorum: Optional[int] = None, sink: Optional[Sink] = None,
                 _awaited: bool = False) -> Handle:
        """Start a background delegation; returns a Handle at once.  Raises
        BusyError at max_async (the message names the limit), OSError for
        other refusals (nothing was started then).  Its event resolves the
        handle, and is also yielded by events() of its sink."""
        self._enter()
        try:
            return self._dispatch(tasks, context, session_key, deadline,
                                  join, quorum, sink, _awaited)
        finally:
            self._leave()

    def _dispatch(self, tasks, context, session_key, deadline, join, quorum,
                  sink, _awaited):
        b = self._make_batch(tasks, context, session_key, deadline, join,
                             quorum, sink)
        idp = ffi.new("fanout_id *")
        b.awaited = _awaited
        # The future exists before the event can: called on a child's
        # thread, the loop may read the event before fanout_dispatch has
        # returned here.
        b.fut = self._loop.create_future()
        self._batches[b.token] = b
        par = b.parent
        if par is None:
            rc = lib.fanout_dispatch(self._e, b.cbatch, idp)
        else:
            # within is par's pending child, which the loop's _complete may
            # release meanwhile when this runs on another thread (a thread
            # the child started with its context): hold par.lock, as
            # ChildContext.interrupted does, and hang from nothing if par
            # ended first (as _make_batch does for a child already done).
            with par.lock:
                if par.done:
                    b.cbatch.within = ffi.NULL
                if _test_point is not None:
                    _test_point("dispatching", b)
                rc = lib.fanout_dispatch(self._e, b.cbatch, idp)
        if rc:
            del self._batches[b.token]
            # No event will come; aclose() may be waiting for it already.
            if threading.get_ident() == self._loop_thread:
                b.fut.cancel()
            else:
                self._loop.call_soon_threadsafe(b.fut.cancel)
            raise _error(rc, self)
        if _test_point is not None:
            _test_point("dispatched", b)
        return Handle(self, idp[0], b.fut)

    async def gather(self, tasks: Iterable[Task],
                     context: Optional[str] = None,
                     session_key: Optional[str] = None,
                     deadline: Optional[float] = None, join: str = "all",
                     quorum: Optional[int] = None,
                     sink: Optional[Sink] = None) -> Event:
        """dispatch() and await the one event, which goes to this caller
        only (not to events()).  Cancelling the awaiting task cancels the
        delegation (and, inside a child, it belongs to the child's cancel
        tree).  The caller always gets the CancelledError: if the cancel
        itself fails (the engine crossed a fork(), where its delegations
        run in the parent), its OSError is the CancelledError's
        __context__."""
        h = self.dispatch(tasks, context=context, session_key=session_key,
                          deadline=deadline, join=join, quorum=quorum,
                          sink=sink, _awaited=True)
        try:
            return await asyncio.shield(h._fut)
        except asyncio.CancelledError as cancelled:
            try:
                self._cancel(h._id, True, True)
            except OSError as err:
                _keep_as_context(cancelled, err)
            raise

    async def delegate(self, tasks: Iterable[Task], **kw: Any) -> Handle:
        """The orchestrator policy: from inside a child, run and wait
        (mode "inline"); at top level, dispatch in the background (mode
        "background"); when the async pool is full, run inline and say so
        (mode "inline_full", h.message).  Returns a Handle; for the inline
        modes it is done already."""
        self._check_open()
        # The inline runs are awaited outside the `except BusyError`
        # blocks: what they raise (a CancelledError with the failure of
        # its cancel as context, see gather()) keeps its own context
        # instead of getting the refusal.
        if current() is not None:
            try:
                ev = await self.gather(tasks, **kw)
            except BusyError:
                # At max_async or max_pending nothing was started; as
                # fanout_delegate() inside a child, run it synchronously,
                # where max_async does not apply.  _make_batch puts it in
                # this child's cancel tree (within).
                ev = None
            if ev is None:
                ev = await self._run_inline(tasks, **kw)
            ev.mode = "inline"
            fut = self._loop.create_future()
            fut.set_result(ev)
            return Handle(self, ev._id, fut, "inline")
        try:
            return self.dispatch(tasks, **kw)
        except BusyError as e:
            busy = str(e)
        ev = await self._run_inline(tasks, **kw)
        ev.mode = "inline_full"
        fut = self._loop.create_future()
        fut.set_result(ev)
        return Handle(self, ev._id, fut, "inline_full", busy)

    async def _run_inline(self, tasks, context=None, session_key=None,
                          deadline=None, join="all", quorum=None, sink=None):
        """fanout_run on a thread of its own (it blocks; the loop must
        not), max_async does not apply to it.  sink is ignored, as
        fanout_run ignores batch->sink: the event goes to the caller."""
        b = self._make_batch(tasks, context, session_key, deadline, join,
                             quorum, None, inline=True)
        evp = ffi.new("struct fanout_event **")
        b.inline = True
        b.fut = self._loop.create_future()
        # The batch stays in _batches (its children find it there, and it
        # keeps what they read alive) until fanout_run has returned; the
        # future resolves then, and aclose() waits for it.
        self._batches[b.token] = b
        loop, e, cb = self._loop, self._e, b.cbatch

        def run():
            if _test_point is not None:
                _test_point("inline_run", b)
            rc = lib.fanout_run(e, cb, evp)
            try:
                loop.call_soon_threadsafe(self._inline_done, b, rc, evp, t)
            except RuntimeError:
                pass  # the loop is closed: the engine was never closed

        # A thread per run, not a bounded pool: a run queued behind busy
        # threads would wait for runs that may wait for it (an inline
        # delegate() inside a child of an inline run).
        t = threading.Thread(target=run, name="fanout-inline")
        self._threads.add(t)
        # fanout_run reads b.parent's pending child (within) on the run's
        # thread, maybe after the awaiting coroutine was cancelled and the
        # child ended: its completion, which releases p, waits for the run
        # to return (_complete, _inline_done), as a C child's would.
        if b.parent is not None:
            b.parent.runs += 1
        try:
            t.start()
        except BaseException:  # noqa: B902 - no thread: nothing runs
            self._threads.discard(t)
            self._batches.pop(b.token, None)
            b.fut.cancel()  # aclose() may be waiting for it
            self._release_parent(b)
            raise
        try:
            rc, ev = await asyncio.shield(b.fut)
        except asyncio.CancelledError as cancelled:
            try:
                self._cancel_inline(b)
            except OSError as err:  # as in gather()
                _keep_as_context(cancelled, err)
            raise
        if rc:
            raise _error(rc, self)
        return ev

    def _cancel_inline(self, b):
        """The task awaiting an inline run was cancelled: cancel the run
        (with abandon, as gather() does).  fanout_run gives no id before
        it returns, and the run may not be in the table yet.  Its id comes
        from its first Python child's start note (b.id; a note that comes
        later finds b.cancelled and cancels the run, in _start) or from
        its first C child (pyfo_run_cancel; a C child that starts later
        finds the flag and cancels the run itself)."""
        b.cancelled = True
        if self._e is None or b.fut.done():
            return
        ids = {b.id}
        if b.run is not None:
            ids.add(lib.pyfo_run_cancel(b.run))
        for i in ids - {0}:
            self._cancel(i, True, True)

    def _inline_done(self, b, rc, evp, thread):
        self._threads.discard(thread)
        self._batches.pop(b.token, None)
        ev = None
        if rc == 0:
            ev = Event(evp[0])
            self._events.add(ev)
        b.fut.set_result((rc, ev))
        self._release_parent(b)

    @staticmethod
    def _release_parent(b):
        """The inline run b is over: the child it hangs from may end.
        That child may be another engine's, on another thread's loop (a
        child that delegated to this engine from there): its count and
        its held completion belong to its engine's loop, so hand them
        over there."""
        par = b.parent
        if par is not None:
            eng = par.engine
            if eng._loop is not None and \
                    threading.get_ident() != eng._loop_thread:
                try:
                    eng._loop.call_soon_threadsafe(Engine._release_parent, b)
                except RuntimeError:
                    pass  # its loop is closed: that engine was never closed
                return
            par.runs -= 1
            if not par.runs and par.held is not None:
                held, par.held = par.held, None
                par.engine._complete(par, *held)

    def _cancel(self, id, interrupt, abandon):
        how = lib.FANOUT_CANCEL_PENDING
        if interrupt or abandon:  # ABANDON goes only with INTERRUPT
            how |= lib.FANOUT_CANCEL_INTERRUPT
        if abandon:
            how |= _ABANDON
        try:
            self._enter(live_ok=True)
        except RuntimeError:
            return False  # closed: every delegation of it has finished
        try:
            rc = lib.fanout_cancel(self._e, id, how)
            if rc in (-_errno.EALREADY, -_errno.ENOENT):
                return False
            if rc:
                raise _error(rc, self)
            return True
        finally:
            self._leave()

    def cancel(self, id: Union[int, str, Handle], interrupt: bool = True,
               abandon: bool = False) -> bool:
        """Cancel a delegation by id ("deleg_..." or a Handle)."""
        return self._cancel(_parse_id(id), interrupt, abandon)

    def cancel_session(self, session_key: str, interrupt: bool = True,
                       abandon: bool = False) -> int:
        """Cancel every running delegation of a session; returns how many
        this call cancelled (one already cancelled the same way is not
        counted again)."""
        if not hasattr(lib, "fanout_cancel_session"):
            raise NotImplementedError("fanout_cancel_session is missing "
                                      "from this build of the library")
        how = lib.FANOUT_CANCEL_PENDING
        if interrupt or abandon:
            how |= lib.FANOUT_CANCEL_INTERRUPT
        if abandon:
            how |= _ABANDON
        key = str(session_key).encode()
        n = ffi.new("size_t *")
        self._enter()
        try:
            rc = lib.fanout_cancel_session(self._e, key, how, n)
            if rc:
                raise _error(rc, self)
        finally:
            self._leave()
        return n[0]

    def lookup(self, id: Union[int, str, Handle]) -> Info:
        """Info of one delegation (running, or finished and still kept);
        KeyError when unknown or pruned."""
        n = _parse_id(id)
        info = ffi.new("struct fanout_info *")
        self._enter(live_ok=True)
        try:
            rc = lib.fanout_lookup(self._e, n, info)
            if rc and rc != -_errno.ENOENT:
                raise _error(rc, self)
        finally:
            self._leave()
        if rc:
            raise KeyError(id)
        return Info(info, lib.fanout_now_ns())

    def list(self) -> List[Info]:
        """Running and recently finished delegations, newest first."""
        n = ffi.new("size_t *")
        cap = 64
        self._enter(live_ok=True)
        try:
            while True:
                infos = ffi.new("struct fanout_info[]", cap)
                rc = lib.fanout_list(self._e, infos, cap, n)
                if rc:
                    raise _error(rc, self)
                if n[0] <= cap:
                    break
                cap = n[0] + 64
        finally:
            self._leave()
        now = lib.fanout_now_ns()
        return [Info(infos[k], now) for k in range(n[0])]

    def stats(self) -> Dict[str, int]:
        """The engine's counters, as a dict (see struct fanout_stats)."""
        st = ffi.new("struct fanout_stats *")
        self._enter(live_ok=True)
        try:
            rc = lib.fanout_stats(self._e, st)
            if rc:
                raise _error(rc, self)
        finally:
            self._leave()
        out = {k: getattr(st, k) for k in (
            "dispatched", "runs", "completed", "rejected", "cancelled",
            "children_run", "children_skipped", "parks", "wakeups",
            "running", "async_running", "nworkers")}
        out["python_children_running"] = len(self._children)
        return out

    # -- sinks and events
    def sink(self) -> Sink:
        """A new Sink with its own eventfd, watched by the loop."""
        sp = ffi.new("struct fanout_sink **")
        self._enter()
        try:
            rc = lib.fanout_sink_create(self._e, sp)
            if rc:
                raise _error(rc, self)
        finally:
            self._leave()
        s = Sink(self, sp[0], False)
        self._sinks.append(s)
        self._loop.add_reader(s._fd, self._drain_sink, s)
        return s

    async def events(self, sink: Optional[Sink] = None
                     ) -> AsyncIterator[Event]:
        """Yield the events of `sink` (default: the engine's) as they come;
        ends when the sink is closed or the engine closes."""
        if sink is not None and not isinstance(sink, Sink):
            raise TypeError(f"sink must be a fanout.Sink (eng.sink()), "
                            f"not {type(sink).__name__}")
        s = sink or self._default
        if s is None:
            raise RuntimeError("fanout.Engine is not open (use async with)")
        if s._queue is None:
            s._queue = asyncio.Queue()
        while True:
            if s._c is None and s._queue.empty():
                return  # closed, and everything it held was yielded
            ev = await s._queue.get()
            if ev is None:
                s._queue.put_nowait(None)  # for any other consumer
                return
            yield ev

    def _drain_sink(self, s):
        evp = ffi.new("struct fanout_event **")
        while s._c is not None:
            rc = lib.fanout_poll(s._c, evp)
            if rc:
                break
            cev = evp[0]
            token = int(ffi.cast("uintptr_t", cev.user))
            ev = Event(cev)
            self._events.add(ev)
            b = self._batches.pop(token, None)
            if _test_point is not None:
                _test_point("event", b)
            if b is None or b.fut is None:
                self.orphan_events += 1
            elif b.fut.done():
                self.duplicate_events += 1
            else:
                b.fut.set_result(ev)
            if s._queue is not None and not (b is not None and b.awaited):
                s._queue.put_nowait(ev)

    # -- Python children
    def _drain_glue(self):
        while True:
            rc = lib.pyfo_take(self._glue, self._starts, self._nstarts,
                               self._cancels, self._ncancels, _TAKE_CAP)
            for k in range(self._nstarts[0]):
                s = self._starts[k]
                self._start(s.p, s.token, s.id, s.index)
            for k in range(self._ncancels[0]):
                s = self._cancels[k]
                c = self._children.get(int(ffi.cast("uintptr_t", s.p)))
                if c is not None and c.id == s.id and c.index == s.index:
                    self._interrupt(c)
            if rc == 2:
                for c in list(self._children.values()):
                    if not c.done and lib.fanout_pending_interrupted(c.p):
                        self._interrupt(c)
            if rc <= 0 or rc == 2:
                break

    def _start(self, p, token, id, index):
        b = self._batches.get(token)
        if b is None:
            # Its event is in already: the delegation was abandoned
            # (deadline, cancel with abandon, policy) after this child
            # deferred, and the sink was read before this note.  The
            # library finished the child; this releases p (-EALREADY).
            o = ffi.new("struct fanout_outcome *")
            o.code = -_errno.EPROTO
            lib.fanout_complete(p, o)
            return
        if b.inline and not b.id:
            b.id = id  # for _cancel_inline
        if b.cancelled:  # an inline run cancelled before it registered
            lib.fanout_cancel(self._e, id, lib.FANOUT_CANCEL_INTERRUPT |
                              lib.FANOUT_CANCEL_PENDING | _ABANDON)
        c = _PyChild(self, p, id, index, b)
        self._children[int(ffi.cast("uintptr_t", p))] = c
        if lib.fanout_pending_interrupted(p):
            c.interrupted = True
            self._complete(c, -_errno.ECANCELED, None, None)
            return
        t = b.tasks[index]
        # The child runs in a copy of its dispatcher's context (as a task
        # does of its creator's), not in this reader's: that is the
        # context of whoever opened the engine.
        ctx = b.context.copy()
        ctx.run(_current.set, ChildContext(c))  # not its dispatcher's
        if c.kind == "async":
            try:
                coro = ctx.run(t.fn, *t.args)
            except BaseException as e:  # noqa: B902 - reported as the error
                self._complete(c, -_errno.EIO, None, _exc_text(e))
                return
            task = ctx.run(self._loop.create_task, _run_coro(c, coro))
            c.task = task
            self._tasks_running.add(task)
            task.add_done_callback(
                lambda task, c=c: self._coro_done(task, c))
        else:
            try:
                if self._executor is None:
                    self._executor = concurrent.futures.ThreadPoolExecutor(
                        max_workers=self._nthreads,
                        thread_name_prefix="fanout-py")
                c.task = self._executor.submit(ctx.run, _run_thread, c)
            except Exception as e:  # noqa: B902 - reported as the error
                # The pool refused (the interpreter is shutting down, no
                # thread could be started): the child must still end, and
                # this reader must go on with the other starts it took.
                self._complete(c, -_errno.EAGAIN, None, _exc_text(e))

    def _interrupt(self, c):
        c.interrupted = True
        if c.kind == "async" and c.task is not None:
            c.task.cancel()

    def _coro_done(self, task, c):
        self._tasks_running.discard(task)
        if not c.done:
            if task.cancelled():
                res = (-_errno.ECANCELED, None, None)
            else:
                exc = task.exception()
                if exc is not None:
                    res = (_exc_code(exc), None, _exc_text(exc))
                else:
                    res = _result(task.result())
            self._complete(c, *res)
        if not self._children and not self._tasks_running:
            self._idle.set()

    def _thread_done(self, c, code, summary, error):
        self._complete(c, code, summary, error)
        if not self._children and not self._tasks_running:
            self._idle.set()

    def _complete(self, c, code, summary, error):
        """The one fanout_complete() of c.  The outcome is made to fit what
        fanout_complete() accepts (a valid code, texts of at most 16 MiB,
        a finite cost), so the child always finishes."""
        if c.done:
            return
        if c.runs:  # fanout_run may still read c.p: _inline_done calls again
            if c.held is None:
                c.held = (code, summary, error)
                if _test_point is not None:
                    _test_point("complete_held", c)
            return
        o = ffi.new("struct fanout_outcome *")
        code = _outcome_code(code)
        o.code = code
        keep = []
        if summary is not None:
            sb = ffi.from_buffer(_c_text(summary))
            keep.append(sb)
            o.summary = sb
            o.summary_len = len(sb)
        if error is not None and code:
            eb = ffi.new("char[]", _c_text(error))
            keep.append(eb)
            o.error = eb
        key = int(ffi.cast("uintptr_t", c.p))
        if self._children.get(key) is c:
            del self._children[key]
        # c.lock: no other thread is between its look at c.done and its
        # fanout_pending_interrupted(c.p) or fanout_pending_add_cost(c.p)
        # while p is released (see ChildContext.interrupted and
        # add_cost): fanout_complete takes every addition made so far
        # (o.cost is 0: the pending child holds the cost), later ones see
        # c.done.  Held for a few loads at most.
        if not c.lock.acquire(False):  # (positional: the cheaper call)
            if _test_point is not None:
                _test_point("complete_waits", c)
            c.lock.acquire()
        try:
            # What interrupted says from now on, without p.
            if lib.fanout_pending_interrupted(c.p):
                c.interrupted = True
            c.done = True
            rc = lib.fanout_complete(c.p, o)
            if rc == -_errno.EINVAL:  # cannot happen; finish it all the same
                o.code = code if code else -_errno.EIO
                o.cost = 0.0
                o.summary = ffi.NULL
                o.summary_len = 0
                o.error = ffi.NULL
                lib.fanout_complete(c.p, o)
            c.p = None
        finally:
            c.lock.release()
        if _test_point is not None:
            _test_point("completed", c)
        if not self._children and not self._tasks_running:
            self._idle.set()


async def _uncut(futs):
    """Wait until every future in futs is done.  A cancel of the waiting
    task does not cut the wait short: the close's task is cancelled only
    by whoever cancels every task (asyncio.run on its way out), and it
    must not free the engine under a fanout_shutdown still running on
    another thread, nor under Python children and inline runs."""
    pending = {f for f in futs if not f.done()}
    while pending:
        try:
            _, pending = await asyncio.wait(pending)
        except asyncio.CancelledError:
            pending = {f for f in pending if not f.done()}


def _keep_as_context(cancelled, err):
    """err, raised by the cancel that the CancelledError `cancelled` set
    off (fanout_cancel() refuses an engine that crossed a fork()), goes
    in as cancelled's __context__: a cancelled task must end with its
    CancelledError (asyncio.timeout, TaskGroup and Task.uncancel count on
    it), and the failure stays visible.  err's own context is `cancelled`
    (it was raised while handling it): replaced, so there is no cycle."""
    err.__context__ = cancelled.__context__
    cancelled.__context__ = err


_MAX_TEXT = 16 << 20  # fanout_outcome's limit for summary and error


def _c_text(s):
    """s as UTF-8 for fanout_complete: at most _MAX_TEXT bytes (cut at a
    character), no NUL (it would end the error string early)."""
    b = s.encode("utf-8", "replace")
    if len(b) > _MAX_TEXT:
        b = b[:_MAX_TEXT].decode("utf-8", "ignore").encode("utf-8")
    return b


def _exc_text(e):
    """"Type: text" of an exception; never raises (str(e) may)."""
    name = type(e).__name__
    try:
        s = str(e)
    except BaseException as e2:  # noqa: B902 - a broken __str__
        s = f"<str() raised {type(e2).__name__}>"
    return f"{name}: {s}" if s else name


def _result(r):
    """(code, summary, error) for a child that returned r: str(r) is the
    summary; if str() raises, the child is an error naming both types."""
    if r is None:
        return (0, None, None)
    if inspect.iscoroutine(r):
        # Work the child only started: nobody will await it (nor cancel
        # it), and its text is no result.  Close it (it never ran: nothing
        # runs, and no "never awaited" warning) and say so.
        name = getattr(r, "__qualname__", type(r).__name__)
        r.close()
        return (-_errno.EIO, None,
                f"TypeError: the child returned the coroutine {name}() "
                f"without awaiting it (make its fn an async def, or await "
                f"it)")
    try:
        s = str(r)
        if type(s) is not str:
            raise TypeError("__str__ returned non-string")
        return (0, s, None)
    except BaseException as e:  # noqa: B902 - reported as the error
        return (-_errno.EIO, None,
                f"str() of the {type(r).__name__} it returned failed: "
                f"{_exc_text(e)}")


_INT_MAX = 2 ** 31 - 1


def _outcome_code(code):
    """code as fanout_complete() takes it: a C int, never -EINPROGRESS
    (not an outcome: fanout_complete would refuse it and the child would
    never finish).  Anything else becomes -EIO."""
    if (type(code) is not int or not -_INT_MAX <= code <= _INT_MAX or
            code == -_errno.EINPROGRESS):
        return -_errno.EIO
    return code


def _exc_code(e):
    if isinstance(e, asyncio.CancelledError):
        return -_errno.ECANCELED  # a child that gave up: interrupted
    n = getattr(e, "errno", None) if isinstance(e, OSError) else None
    if (type(n) is int and 0 < n <= _INT_MAX and n != _errno.ECANCELED and
            n != _errno.EINPROGRESS):
        return -n
    return -_errno.EIO


async def _run_coro(c, coro):
    _current.set(ChildContext(c))
    return await coro


def _run_thread(c):
    _current.set(ChildContext(c))
    t = c.batch.tasks[c.index]
    try:
        res = _result(t.fn(*t.args))
    except BaseException as e:  # noqa: B902 - reported as the error
        res = (_exc_code(e), None, _exc_text(e))
    loop = c.engine._loop
    try:
        loop.call_soon_threadsafe(c.engine._thread_done, c, *res)
    except RuntimeError:
        pass  # the loop is closed: the engine was never closed properly
