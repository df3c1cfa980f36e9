"""Detached work: tasks a caller starts and may stop waiting for, which must still finish.

A rewind, an undo, a fork or a deletion runs in a task of its own so that a caller who hangs up
midway (its RPC cancelled) leaves the work whole rather than half done: the caller awaits the
task through `asyncio.shield`, and its cancellation stops only the waiting. The event loop keeps
only a weak reference to a task, so such a task also needs a strong one until it ends, or it may
be collected mid-flight; and the server's shutdown must wait for what is still running, not cut
it off. This module is that one rule, written once:

- `shielded(work, name=...)` runs `work` detached and waits for it; the caller's cancellation
  does not reach the work.
- `detach(work, name=...)` runs `work` detached without waiting (a prewarm, a bookkeeping step).
- `drain(within)` waits, at shutdown, for every detached task of the running loop.

A leaf module: it imports nothing of the service.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

# Per event loop, the detached tasks not yet done: the strong references the loop does not keep.
_running: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, set[asyncio.Task[Any]]] = (
    weakref.WeakKeyDictionary()
)


def detach(work: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start `work` in a task of its own, held until it ends, and return the task."""
    task = asyncio.create_task(work, name=name)
    tasks = _running.setdefault(asyncio.get_running_loop(), set())
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def shielded(work: Coroutine[Any, Any, T], *, name: str) -> T:
    """Run `work` detached and return its result. Cancelling the caller stops only the waiting:
    the work runs on to its end (and `drain` waits for it at shutdown)."""
    return await asyncio.shield(detach(work, name=name))


def pending() -> list[asyncio.Task[Any]]:
    """The running loop's detached tasks that have not ended."""
    return [task for task in _running.get(asyncio.get_running_loop(), ()) if not task.done()]


async def drain(within: float) -> list[asyncio.Task[Any]]:
    """Wait up to `within` seconds for every detached task of the running loop (tasks detached
    meanwhile included) and return those still running then (at `within`). Their outcomes are their callers'
    to see; here an exception is only collected, so it is not reported as never retrieved."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        left = [task for task in pending() if task is not asyncio.current_task()]
        remaining = deadline - loop.time()
        if not left or remaining <= 0:
            return left
        done, _ = await asyncio.wait(left, timeout=remaining)
        for task in done:
            if not task.cancelled():
                task.exception()
