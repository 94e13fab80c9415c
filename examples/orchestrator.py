#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A small agent-style orchestrator on fanout, with fake LLM calls.

    pip install ./python && python examples/orchestrator.py

The "model" (canned text after an asyncio.sleep) dispatches a batch of
subagents in the background and the chat goes on; when the batch is done,
its ONE consolidated event (ev.format(): the "TASK i/n" block) re-enters
the conversation as one message.  One subagent delegates to two of its
own, synchronously (it waits for them inside its turn).  When the async
pool is full, a delegation runs inline and the chat says so.  "/stop"
cancels every delegation of a session.
"""
import asyncio
import time

import fanout

T0 = time.perf_counter()


def say(session, who, text):
    t = time.perf_counter() - T0
    lines = str(text).rstrip("\n").split("\n")
    print(f"[{t:5.2f}s] {session:7} {who:>9}: {lines[0]}")
    for line in lines[1:]:
        print(f"{'':27}{line}")


async def fake_llm(prompt, seconds=0.05):
    """An LLM call: a wait and a canned answer."""
    await asyncio.sleep(seconds)
    if "2 + 2" in prompt:
        return "4. (Your subagents are still working on the research.)"
    if "TASK" in prompt:
        n = prompt.count("TASK ")
        return f"All {n} subagents reported back; summary: LRU for hot " \
               f"keys, write-back for bursts, TTLs for everything else."
    return "Let me hand that to some subagents."


async def subagent(topic, seconds):
    """A subagent: a few LLM calls' worth of waiting."""
    await asyncio.sleep(seconds)
    fanout.current().add_cost(0.002)
    return f"{topic}: three sources agree; notes attached"


async def deep_dive(eng, topic):
    """A subagent that delegates to two of its own and waits for them:
    from inside a child, delegate() runs synchronously (mode "inline")."""
    d = await eng.delegate([
        fanout.Task(f"{topic}: benchmarks", subagent, "benchmarks", 0.05),
        fanout.Task(f"{topic}: failure modes", subagent, "failures", 0.08),
    ])
    ev = d.event
    assert d.mode == "inline", d.mode  # from inside a child: synchronous
    assert ev.status == "completed" and len(ev.results) == 2, ev.format()
    return (f"{topic}: merged {len(ev.results)} sub-reports "
            f"(delegated {d.mode}, {ev.status})")


async def slow_subagent(topic):
    await asyncio.sleep(30)  # will be stopped long before
    return topic


statuses = {}  # session -> the status of each event deliver() saw


async def deliver(eng, conversations):
    """Every consolidated event goes back into its session as ONE message,
    and the model answers it."""
    async for ev in eng.events():
        session = ev.session_key
        say(session, "fanout", ev.format())
        conversations[session].append(ev.format())
        statuses.setdefault(session, []).append(ev.status)
        if ev.status == "completed":
            say(session, "assistant", await fake_llm(ev.format()))
        else:
            say(session, "assistant",
                f"The delegation {ev.id} ended {ev.status}; nothing to add.")


async def main():
    conversations = {"chat-1": [], "chat-2": []}
    async with fanout.Engine(workers=2, max_async=2) as eng:
        router = asyncio.get_running_loop().create_task(
            deliver(eng, conversations))

        # chat-1: the model delegates research in the background.
        say("chat-1", "user", "Compare three caching strategies for our API.")
        say("chat-1", "assistant", await fake_llm("caching"))
        h = await eng.delegate([
            fanout.Task("survey LRU vs LFU", subagent, "LRU vs LFU", 0.3),
            fanout.Task("write-back vs write-through", subagent,
                        "write policies", 0.2),
            fanout.Task("deep dive: TTLs", deep_dive, eng, "TTLs"),
        ], session_key="chat-1", context="caching research")
        say("chat-1", "fanout", f"{h.id} started in the background "
                                f"({h.mode}); the chat goes on")

        # The chat goes on while the subagents work.
        say("chat-1", "user", "Meanwhile: what is 2 + 2?")
        say("chat-1", "assistant", await fake_llm("2 + 2"))

        assert h.mode == "background", h.mode
        await h  # chat-1's results re-enter its conversation (deliver())
        await asyncio.sleep(0.1)

        # chat-2: two long background jobs fill the pool (max_async=2) ...
        say("chat-2", "user", "Audit the logs of both clusters.")
        for name in ("cluster A", "cluster B"):
            await eng.delegate([fanout.Task(f"audit {name}", slow_subagent,
                                            name)], session_key="chat-2")
        # ... so the next delegation runs inline, and says so.
        d = await eng.delegate([
            fanout.Task("quick check", subagent, "config drift", 0.05)],
            session_key="chat-2")
        say("chat-2", "fanout", f"the async pool is full, so this one ran "
                                f"inline ({d.mode}): "
                                f"{d.message[d.message.rfind('['):]}")
        say("chat-2", "fanout", d.event.format())
        assert d.mode == "inline_full", d.mode
        assert d.event.status == "completed", d.event.format()

        # /stop in chat-2 cancels its running audits.
        say("chat-2", "user", "/stop")
        n = eng.cancel_session("chat-2")
        say("chat-2", "assistant", f"Stopped {n} running delegations.")
        assert n == 2, n
        while any(i.status == "running" for i in eng.list()):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        router.cancel()
        st = eng.stats()
    print(f"\nengine: {st['dispatched']} background delegations, "
          f"{st['runs']} inline, {st['completed']} events, "
          f"{st['cancelled']} cancelled; chat-1 got "
          f"{len(conversations['chat-1'])} consolidated message(s), chat-2 "
          f"{len(conversations['chat-2'])}")
    # What the run above must have shown (`make test` runs this example
    # and fails when any of these does not hold).
    assert statuses == {"chat-1": ["completed"],
                        "chat-2": ["interrupted", "interrupted"]}, statuses
    assert "TASK 3/3: deep dive: TTLs (status=completed" in \
        conversations["chat-1"][0], conversations["chat-1"][0]
    assert "merged 2 sub-reports (delegated inline, completed)" in \
        conversations["chat-1"][0], conversations["chat-1"][0]
    assert st["cancelled"] == 2, st
    print("orchestrator: all checks passed")


if __name__ == "__main__":
    asyncio.run(main())
